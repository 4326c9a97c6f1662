#!/usr/bin/env bash
# Makes the UNet reference's Python environment, from PyPI, in the cache directory
# (DIFFTRAIN_CACHE, default ~/.cache/difftrain; kept between runs), and prints its python:
#   diffusers-venv/bin/python   Debian's /usr/bin/python3 (with its torch 1.13 and numpy) plus
#                               diffusers 0.27.2 and the huggingface_hub it imports
# huggingface_hub is pinned below 0.26, whose removal of cached_download diffusers 0.27.2
# still imports. What is missing of Debian's packages comes from scripts/install-deps.sh
# (python3-venv, python3-torch). Exit status 1 when PyPI cannot be reached: the caller skips.
#   tests/reference/diffusers_env.sh   # prints e.g. /root/.cache/difftrain/diffusers-venv/bin/python
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
venv=$cache/diffusers-venv
PINNED="diffusers==0.27.2 huggingface_hub==0.25.2"

mkdir -p "$cache"
exec 9>"$cache/diffusers-venv.lock"
flock 9

/usr/bin/python3 -c 'import ensurepip, torch' 2>/dev/null || "$root/scripts/install-deps.sh" >&2
if ! [[ -x $venv/bin/python ]] || [[ $(cat "$venv/pinned" 2>/dev/null) != "$PINNED" ]]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check $PINNED >&2 ||
    { rm -rf "$venv"; echo "diffusers_env: cannot install $PINNED from PyPI" >&2; exit 1; }
  echo "$PINNED" > "$venv/pinned"
fi
echo "$venv/bin/python"
