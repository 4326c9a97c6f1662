#!/usr/bin/env bash
# Fetches cuDNN's frontend, NVIDIA's header-only C++ graph API over cuDNN's backend (MIT), from
# its PyPI wheel (nvidia-cudnn-frontend; the wheel carries the headers beside its Python module)
# into the cache directory (DIFFTRAIN_CACHE, default ~/.cache/difftrain; kept between runs) and
# prints the folder to include. CMake runs it when the CUDA backend is built and cudnn.h is there
# (model/cuda/cudnn_attention.h); nothing of it is committed to the project. Exit status 1 when
# PyPI cannot be reached: the build goes on without cuDNN's attention and says so.
#   scripts/cudnn_frontend.sh   # prints e.g. /root/.cache/difftrain/cudnn-frontend-1.32.0/include
set -euo pipefail
version=1.32.0
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
dir=$cache/cudnn-frontend-$version

mkdir -p "$cache"
exec 9>"$cache/cudnn-frontend.lock"
flock 9
if ! [[ -f $dir/include/cudnn_frontend.h ]]; then
  work=$(mktemp -d "$cache/cudnn-frontend.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # Any one wheel of the release: the headers are the same in each.
  if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps --timeout 20 \
    --retries 1 --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$work" "nvidia-cudnn-frontend==$version" >&2; then
    echo "cudnn_frontend: cannot fetch nvidia-cudnn-frontend==$version from PyPI" >&2
    exit 1
  fi
  python3 - "$work" <<'PY'
import pathlib, sys, zipfile
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    z.extractall(work / "x", [n for n in z.namelist() if n.startswith("include/")])
PY
  rm -rf "$dir" && mkdir -p "$dir" && mv "$work/x/include" "$dir/include"
fi
echo "$dir/include"
