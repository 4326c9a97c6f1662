#!/usr/bin/env bash
# Zero terminal SNR beside the schedule it rescales. The small DiT of jobs/fashion-mnist.yaml is
# trained twice on Debian's Fashion-MNIST with v-prediction, uniform weighting and Stable
# Diffusion's scaled linear schedule (0.00085 to 0.012; √ᾱ_{T−1} = 0.068, so training's noisiest
# x_t still holds 6.8 % of the image, which sampling's x_T never does): once as it is, once with
# diffusion.zero_terminal_snr. Same seed, steps and everything else. Each is sampled with DDIM 50
# (DiT's respacing: the first step at T − 1) and scored by the project's classifier (conditional
# accuracy, FD against the floor of the same seed) and by brightness: each image's mean pixel
# beside the real training images' (bench/brightness.py).
#
#   bench/zero_snr_learning.sh [STEPS] [CFG]      defaults 1500 steps, guidance 3
#   PER_CLASS (default 50) samples per class; SEED (default 1) of the samples.
# Runs in runs/zero-snr/{plain,zero}; each run's checkpoints are deleted first.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make build >/dev/null
steps=${1:-1500}
cfg=${2:-3}
per_class=${PER_CLASS:-50}
seed=${SEED:-1}
classifier=model/eval/fashion_mnist_classifier.safetensors
[[ -f $classifier ]] || build/difftrain eval train-classifier --out "$classifier"
export OMP_WAIT_POLICY=passive

for variant in plain zero; do
  run=runs/zero-snr/$variant
  rm -rf "$run/checkpoints"
  mkdir -p "$run"
  # jobs/fashion-mnist.yaml with the diffusion above and this run's checkpoint directory.
  zero=$([[ $variant == zero ]] && echo true || echo false)
  sed -e "s|^  schedule: cosine|  schedule: scaled_linear\n  beta_start: 0.00085\n  beta_end: 0.012\n  prediction: v\n  zero_terminal_snr: $zero|" \
      -e "s|^  loss_weighting: min_snr|  loss_weighting: uniform|" \
      -e "s|runs/fashion-mnist/checkpoints|$run/checkpoints|" jobs/fashion-mnist.yaml > "$run/job.yaml"
  grep -q "zero_terminal_snr: $zero" "$run/job.yaml"
  start=$(date +%s)
  build/difftrain train --config "$run/job.yaml" --steps "$steps"
  trained=$(date +%s)
  build/difftrain sample --checkpoint "$run/checkpoints" --classes 0,1,2,3,4,5,6,7,8,9 \
    --per-class "$per_class" --sampler ddim --steps 50 --cfg "$cfg" --seed "$seed" \
    --raw "$run/samples.safetensors" --out "$run/grid.png"
  build/difftrain eval --classifier "$classifier" --samples "$run/samples.safetensors" \
    --floor --seed "$seed" --json "$run/eval.json" >/dev/null
  echo "$variant: trained $((trained - start)) s, sampled $(( $(date +%s) - trained )) s"
done
/usr/bin/python3 - <<'PY'
import json
for v in ("plain", "zero"):
    r = json.load(open(f"runs/zero-snr/{v}/eval.json"))
    print(f"{v}: conditional accuracy {r['conditional_accuracy']:.3f}, FD {r['fd']:.1f} "
          f"(floor {r['floor_fd']:.1f})")
PY
bench/brightness.py runs/zero-snr/plain/samples.safetensors runs/zero-snr/zero/samples.safetensors
