#!/usr/bin/env bash
# Fusing a LoRA into Stable Diffusion 1.5's UNet on the CPU, difftrain's FuseLora
# (bench_lora_fuse) beside the same fusing in PyTorch 1.13 as peft's merge does it, one after the
# other in one go: a kohya rank-RANK LoRA (F16) of every Linear and convolution of the UNet's
# blocks, seconds, medians of REPEATS runs.
#
#   bench/lora_fuse.sh [RANK] [REPEATS]      defaults 64 and 3
#   SKIP_BUILD=1 uses build/ as it is; THREADS (default: the cores) for both.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make bench >/dev/null
rank=${1:-64}
repeats=${2:-3}
threads=${THREADS:-$(nproc)}
python=$(tests/reference/diffusers_env.sh | tail -n 1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $threads threads"
OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads build/bench/bench_lora_fuse \
  --rank "$rank" --repeats "$repeats" --keep "$dir/lora.safetensors" | tail -n 1
"$python" bench/lora_fuse_torch.py "$dir/lora.safetensors" "$repeats" "$threads" 2>/dev/null |
  tail -n 1
