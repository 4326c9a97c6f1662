#!/usr/bin/env bash
# How fast each deterministic sampler converges to the ODE's solution, on a trained checkpoint:
# 100 samples (10 per class, guidance 3, seed 1, all from the same x_T) drawn by each sampler at
# N steps on the linspace spacing (DDIM on DiT's respacing), each compared with a reference drawn with DPM-Solver++ 3M at
# 500 steps (and that reference with DPM-Solver++ 2M's at 500, to show how far it is from
# converged). The
# figure is the RMS of the pixel difference ([-1, 1] pixels), beside the model calls it took.
# Samplers that end at σ_0 (DEIS, UniPC, DPM-Solver with final_sigmas_type sigma_min) keep σ_0
# times the noise (≈ 0.03 on Stable Diffusion's schedule) however many steps they take. DDIM and
# PNDM step diffusers' way on a linspace or trailing spacing, each step to t − ⌊T/N⌋ whatever
# timestep comes next, which converges only where T/N is whole: DDIM is drawn on DiT's
# respacing, whose steps chain, and PNDM (whose leading spacing starts below T − 1) not at all.
#
#   bench/sampler_steps.sh [CHECKPOINT]    default runs/zero-snr/plain/checkpoints
#                                          (made by bench/zero_snr_learning.sh)
#   STEPS (default "6 12 24 48", multiples of 3: DPM-Solver singlestep of order 3 refuses N % 3 = 2)
#   the step counts.
# Writes runs/sampler-steps/*.safetensors and prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make build >/dev/null
checkpoint=${1:-runs/zero-snr/plain/checkpoints}
if [[ ! -d $checkpoint ]]; then
  echo "no checkpoint at $checkpoint: run bench/zero_snr_learning.sh first, or name one" >&2
  exit 2
fi
steps=${STEPS:-6 12 24 48}
out=runs/sampler-steps
mkdir -p "$out"
export OMP_WAIT_POLICY=passive

# NAME|flags: each sampler as it is drawn.
samplers=(
  "ddim|--sampler ddim --timestep-spacing respace"
  "euler|--sampler euler"
  "heun|--sampler heun"
  "lms|--sampler lms"
  "kdpm2|--sampler kdpm2"
  "dpmsolver 2M|--sampler dpmsolver"
  "dpmsolver 3M|--sampler dpmsolver --solver-order 3"
  "dpmsolver_singlestep 2|--sampler dpmsolver_singlestep"
  "dpmsolver_singlestep 3|--sampler dpmsolver_singlestep --solver-order 3"
  "deis 2|--sampler deis"
  "deis 3|--sampler deis --solver-order 3"
  "unipc|--sampler unipc"
)
draw() {  # FILE STEPS FLAGS...
  local file=$1 n=$2
  shift 2
  build/difftrain sample --checkpoint "$checkpoint" --classes 0,1,2,3,4,5,6,7,8,9 \
    --per-class 10 --cfg 3 --seed 1 --steps "$n" --clip-denoised false "$@" --raw "$file" \
    >/dev/null 2>"$file.log" || {
    # A combination a sampler refuses (DPM-Solver singlestep of order 3 at N % 3 = 2 to σ = 0).
    echo "refused: $(tail -1 "$file.log")" >"$file.refused"
  }
}
draw "$out/reference.safetensors" 500 --sampler dpmsolver --solver-order 3 \
  --timestep-spacing linspace
draw "$out/reference_2m.safetensors" 500 --sampler dpmsolver --timestep-spacing linspace
rows=()
for entry in "${samplers[@]}"; do
  name=${entry%%|*}
  read -r -a flags <<<"${entry#*|}"
  [[ " ${flags[*]} " == *" --timestep-spacing "* ]] || flags+=(--timestep-spacing linspace)
  for n in $steps; do
    file="$out/${name// /_}-$n.safetensors"
    rm -f "$file.refused"
    draw "$file" "$n" "${flags[@]}"
    rows+=("$name|$n|$file")
  done
done
printf '%s\n' "${rows[@]}" >"$out/rows.txt"
/usr/bin/python3 - "$out/reference.safetensors" "$out/reference_2m.safetensors" "$out/rows.txt" \
  <<'PY'
import os
import sys

sys.path.insert(0, "tests/reference")
import numpy as np  # noqa: E402
from safetensors_np import read  # noqa: E402


def images(path):
    return read(path)[0]["images"].astype(np.float64)


def calls(name, n):
    # Model calls (each doubled by guidance): Heun and KDPM2 2N − 1.
    return 2 * n - 1 if name in ("heun", "kdpm2") else n


reference = images(sys.argv[1])
rms = lambda a: float(np.sqrt(np.mean((a - reference) ** 2)))  # noqa: E731
print(f"reference (DPM++ 3M, 500 steps) against DPM++ 2M's 500 steps: RMS "
      f"{rms(images(sys.argv[2])):.2e}")
table = {}
for line in open(sys.argv[3]):
    name, n, path = line.strip().split("|")
    cell = "refused" if os.path.exists(path + ".refused") else f"{rms(images(path)):.4f}"
    table.setdefault(name, []).append((int(n), cell))
counts = [n for n, _ in next(iter(table.values()))]
print("| sampler | " + " | ".join(f"{n} steps" for n in counts) + " |")
print("|---|" + "---|" * len(counts))
for name, cells in table.items():
    print(f"| {name} | " + " | ".join(f"{c} ({calls(name, n)})" for n, c in cells) + " |")
PY
