#!/usr/bin/env bash
# The VAE on the CPU, difftrain's (bench_vae) beside diffusers' AutoencoderKL (PyTorch 1.13,
# the reference's virtual environment), one after the other in one go, on Stable Diffusion's
# VAE config (83.7 M parameters) with random weights: seconds per image to encode (the
# posterior's mean) and to decode, medians of REPEATS runs.
#
#   bench/vae.sh [IMAGE_SIZE] [REPEATS]      defaults 256 and 5
#   SKIP_BUILD=1 uses build/ as it is; THREADS (default: the cores) for both.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make bench >/dev/null
size=${1:-256}
repeats=${2:-5}
threads=${THREADS:-$(nproc)}
python=$(tests/reference/diffusers_env.sh | tail -n 1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$python" bench/vae_torch.py save "$dir/vae"
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $threads threads"
OMP_NUM_THREADS=$threads build/bench/bench_vae --vae "$dir/vae" --image-size "$size" \
  --repeats "$repeats"
"$python" bench/vae_torch.py time "$dir/vae" "$size" "$repeats" "$threads"
