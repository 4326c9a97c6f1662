#!/usr/bin/env bash
# Loading an original single-file checkpoint beside the same weights as a diffusers pipeline
# folder, in difftrain and in diffusers, one after the other in one go: difftrain's whole
# `sample` run to one 64 px sample with one step (loading dominates: the UNet, the VAE, the text
# models, a prompt embedded) from each form, with its peak RSS, and diffusers' pipeline
# construction from each (from_pretrained, from_single_file), seconds, medians of REPEATS.
#   sd15: random weights of Stable Diffusion 1.5's shapes (UNet, VAE, CLIP ViT-L/14 text model),
#         float32, 4.3 GB.
#   sdxl: random weights of SDXL base 1.0's shapes (UNet of 2.57 B parameters, VAE, CLIP ViT-L
#         and OpenCLIP ViT-bigG text models), float16 as SDXL ships, 6.9 GB in SDXL's original
#         (SGM) layout; then diffusers' StableDiffusionXLPipeline.from_single_file of the file
#         (float32) and difftrain's `sample --pretrained` of it each sample 2 Euler steps at
#         guidance 5 from the same x_T: their relative L2.
#
#   bench/single_file.sh [REPEATS] [sd15|sdxl]       defaults 3, sd15
#   SKIP_BUILD=1 uses build/ as it is; THREADS (default: the cores) for both.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make build >/dev/null
repeats=${1:-3}
model=${2:-sd15}
[[ $model == sd15 || $model == sdxl ]] || { echo "model: sd15 or sdxl, not $model" >&2; exit 2; }
threads=${THREADS:-$(nproc)}
python=$(tests/reference/diffusers_env.sh | tail -n 1)
text_python=$(scripts/text_encoder_env.sh 2>/dev/null | tail -n 1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $threads threads; $model"
# A CLIP tokenizer (CLIP's real vocabulary) from the tests' small text model.
"$text_python" tests/reference/text_encoder.py sd "$dir/tok" 1 '["x"]' 1 >/dev/null 2>&1
pipe=$dir/pipeline
"$python" bench/single_file_torch.py make "$pipe" "$dir/tok/pipeline/tokenizer" \
  $([[ $model == sdxl ]] && echo sdxl) >/dev/null 2>&1
"$python" tests/reference/ldm_checkpoint.py write "$pipe" "$dir/model.safetensors" \
  $([[ $model == sdxl ]] && echo sdxl) 2>/dev/null | tail -n 1
ls -l --block-size=M "$dir/model.safetensors" | awk '{print "single file: " $5}'
run() {  # PRETRAINED: seconds of one sample run, and its peak RSS in GB on fd 3
  local start end
  start=$(date +%s.%N)
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads /usr/bin/time -f %M -o "$dir/rss" \
    build/difftrain sample --pretrained "$1" --text-encoder "$pipe" --input-size 8 --steps 1 \
    --prompt "a boat" --per-class 1 --raw "$dir/out.safetensors" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc
  echo "scale=1; $(cat "$dir/rss") / 1000000" | bc >&3
}
single=() folder=() single_rss=() folder_rss=()
for ((i = 0; i < repeats; i++)); do
  single+=("$(run "$dir/model.safetensors" 3>"$dir/rss.gb")")
  single_rss+=("$(cat "$dir/rss.gb")")
  folder+=("$(run "$pipe" 3>"$dir/rss.gb")")
  folder_rss+=("$(cat "$dir/rss.gb")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "difftrain sample from the single file: median $(median "${single[@]}") s of ${single[*]};" \
  "peak RSS ${single_rss[*]} GB"
echo "difftrain sample from the pipeline folder: median $(median "${folder[@]}") s of" \
  "${folder[*]}; peak RSS ${folder_rss[*]} GB"
"$python" bench/single_file_torch.py load "$pipe" "$dir/model.safetensors" "$repeats" \
  "$threads" $([[ $model == sdxl ]] && echo sdxl) 2>/dev/null
[[ $model == sdxl ]] || exit 0
# The same x_T sampled by diffusers from the file and by difftrain from the file.
"$python" bench/single_file_torch.py sample-sdxl "$pipe" "$dir/model.safetensors" \
  "$dir/want.safetensors" "$threads" 2>/dev/null | grep -v '^$' | tail -n 1
OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads build/difftrain sample \
  --pretrained "$dir/model.safetensors" --text-encoder "$pipe" --initial-noise \
  "$dir/want.safetensors" --input-size 8 --steps 2 --cfg 5 --prompt "a photo of a boat" \
  --per-class 1 --out "$dir/got.png" --raw "$dir/got.safetensors" 2>&1 | grep -E "its UNet config|the diffusion" |
  sed 's/^\[[^]]*\] \[info\] /difftrain: /'
"$python" - "$dir/want.safetensors" "$dir/got.safetensors" <<'EOF'
import sys
import numpy as np
from safetensors.numpy import load_file
want, got = load_file(sys.argv[1]), load_file(sys.argv[2])
for ours, theirs in (("images", "latents"), ("decoded", "decoded")):
    a, b = got[ours].astype(np.float64), want[theirs].astype(np.float64).reshape(got[ours].shape)
    print(f"difftrain against diffusers, {theirs}: relative L2 "
          f"{np.linalg.norm(a - b) / np.linalg.norm(b):.2e}")
EOF
