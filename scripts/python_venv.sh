#!/usr/bin/env bash
# Makes a Python virtual environment from PyPI over Debian's /usr/bin/python3 (with its torch
# 1.13 and numpy: --system-site-packages) in the cache directory (DIFFTRAIN_CACHE, default
# ~/.cache/difftrain; kept between runs, remade when its pins change), and prints its python.
# What is missing of Debian's packages comes from scripts/install-deps.sh (python3-venv,
# python3-torch). Exit status 1 when PyPI cannot be reached: the caller skips or falls back.
#   scripts/python_venv.sh NAME "PACKAGES" ["PACKAGES WITHOUT THEIR DEPENDENCIES"]
# tests/reference/diffusers_env.sh and scripts/text_encoder_env.sh say what they pin and why.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name=$1
packages=$2
nodeps=${3:-}
pinned="$packages${nodeps:+ $nodeps}"
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
venv=$cache/$name

mkdir -p "$cache"
exec 9>"$cache/$name.lock"
flock 9

/usr/bin/python3 -c 'import ensurepip, torch' 2>/dev/null || "$root/scripts/install-deps.sh" >&2
if ! [[ -x $venv/bin/python ]] || [[ $(cat "$venv/pinned" 2>/dev/null) != "$pinned" ]]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
  pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
  # shellcheck disable=SC2086
  if ! "${pip[@]}" $packages >&2 || { [[ -n $nodeps ]] && ! "${pip[@]}" --no-deps $nodeps >&2; }
  then
    rm -rf "$venv"
    echo "$name: cannot install $pinned from PyPI" >&2
    exit 1
  fi
  echo "$pinned" > "$venv/pinned"
fi
echo "$venv/bin/python"
