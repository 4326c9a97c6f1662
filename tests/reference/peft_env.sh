#!/usr/bin/env bash
# Makes the DoRA reference's Python environment, from PyPI, in the cache directory
# (DIFFTRAIN_CACHE, default ~/.cache/difftrain; kept between runs), and prints its python:
#   peft-venv/bin/python   tests/reference/diffusers_env.sh's packages (diffusers 0.27.2 over
#                          Debian's torch 1.13) plus peft 0.10.0, whose LoRA layers have DoRA
#                          (use_dora) for Linear and Conv2d modules, and the accelerate 0.28.0
#                          it imports
# peft and accelerate come without their dependencies: each would pull a torch from PyPI, as
# pip does not see Debian's. A venv apart from diffusers-venv: with peft importable, diffusers
# switches every model to its peft backend, which the other reference scripts do not expect.
# Exit status 1 when PyPI cannot be reached: the caller skips.
#   tests/reference/peft_env.sh   # prints e.g. /root/.cache/difftrain/peft-venv/bin/python
set -euo pipefail
exec "$(dirname "$0")/../../scripts/python_venv.sh" peft-venv \
  "diffusers==0.27.2 huggingface_hub==0.25.2 transformers==4.40.2" \
  "peft==0.10.0 accelerate==0.28.0"
