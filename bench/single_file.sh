#!/usr/bin/env bash
# Loading an original single-file Stable Diffusion 1.5 checkpoint (random weights of SD 1.5's
# shapes: UNet, VAE, CLIP ViT-L/14 text model, float32, 4.3 GB) beside the same weights as a
# diffusers pipeline folder, in difftrain and in diffusers, one after the other in one go:
# difftrain's whole `sample` run to one 64 px sample with one step (loading dominates: the UNet,
# the VAE, the text model, a prompt embedded) from each form, and diffusers' pipeline
# construction from each (from_pretrained, from_single_file), seconds, medians of REPEATS.
#
#   bench/single_file.sh [REPEATS]       default 3
#   SKIP_BUILD=1 uses build/ as it is; THREADS (default: the cores) for both.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make build >/dev/null
repeats=${1:-3}
threads=${THREADS:-$(nproc)}
python=$(tests/reference/diffusers_env.sh | tail -n 1)
text_python=$(scripts/text_encoder_env.sh 2>/dev/null | tail -n 1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $threads threads"
# A CLIP tokenizer (CLIP's real vocabulary) from the tests' small text model.
"$text_python" tests/reference/text_encoder.py sd "$dir/tok" 1 '["x"]' 1 >/dev/null 2>&1
"$python" bench/single_file_torch.py make "$dir/sd15" "$dir/tok/pipeline/tokenizer" >/dev/null 2>&1
"$python" tests/reference/ldm_checkpoint.py write "$dir/sd15" "$dir/model.safetensors" 2>/dev/null |
  tail -n 1
ls -l --block-size=M "$dir/model.safetensors" | awk '{print "single file: " $5}'
run() {  # PRETRAINED: seconds of one sample run
  local start end
  start=$(date +%s.%N)
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads build/difftrain sample \
    --pretrained "$1" --text-encoder "$dir/sd15" --input-size 8 --steps 1 --prompt "a boat" \
    --per-class 1 --raw "$dir/out.safetensors" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
single=() folder=()
for ((i = 0; i < repeats; i++)); do
  single+=("$(run "$dir/model.safetensors")")
  folder+=("$(run "$dir/sd15")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "difftrain sample from the single file: median $(median "${single[@]}") s of ${single[*]}"
echo "difftrain sample from the pipeline folder: median $(median "${folder[@]}") s of ${folder[*]}"
"$python" bench/single_file_torch.py load "$dir/sd15" "$dir/model.safetensors" "$repeats" \
  "$threads" 2>/dev/null
