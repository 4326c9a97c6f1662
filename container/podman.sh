#!/usr/bin/env bash
# Runs podman (Debian's) the way this project's image builds and tests do, on a machine
# without a container daemon or registry access: images live in a private vfs store under
# the project's cache directory (kept between runs, so a rebuild reuses base and layers),
# containers run with runc and cgroupfs (Debian's crun refuses hybrid cgroups) on the
# host's network.
#   container/podman.sh images        container/podman.sh run --rm difftrain:0.1.0-cpu ...
# DIFFTRAIN_CACHE (default ~/.cache/difftrain) moves the store.
set -euo pipefail
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
store=$cache/container
mkdir -p "$store"
exec podman --root "$store/storage" --runroot "$store/run" --storage-driver vfs \
  --runtime runc --cgroup-manager cgroupfs --events-backend file "$@"
