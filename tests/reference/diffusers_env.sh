#!/usr/bin/env bash
# Makes the UNet reference's Python environment, from PyPI, in the cache directory
# (DIFFTRAIN_CACHE, default ~/.cache/difftrain; kept between runs), and prints its python:
#   diffusers-venv/bin/python   Debian's /usr/bin/python3 (with its torch 1.13 and numpy) plus
#                               diffusers 0.27.2 and the huggingface_hub it imports, and
#                               transformers 4.40.2 for StableDiffusionPipeline's CLIP text
#                               model and tokenizer (tests/reference/sd_pipeline.py)
# huggingface_hub is pinned below 0.26, whose removal of cached_download diffusers 0.27.2
# still imports. ftfy stays out, as in scripts/text_encoder_env.sh. scripts/python_venv.sh makes it. Exit status 1 when PyPI cannot be reached:
# the caller skips.
#   tests/reference/diffusers_env.sh   # prints e.g. /root/.cache/difftrain/diffusers-venv/bin/python
set -euo pipefail
exec "$(dirname "$0")/../../scripts/python_venv.sh" diffusers-venv \
  "diffusers==0.27.2 huggingface_hub==0.25.2 transformers==4.40.2"
