#!/usr/bin/env bash
# Runs podman (Debian's) the way this project's image builds and tests do, on a machine
# without a container daemon or registry access: images live in a private store under the
# project's cache directory (kept between runs, so a rebuild reuses base and layers),
# containers run with runc and cgroupfs (Debian's crun refuses hybrid cgroups).
#   container/podman.sh images        container/podman.sh run --rm difftrain:0.1.0-cpu ...
# The store uses overlayfs where the kernel offers it and the cache is not itself on
# overlayfs (a layer is then a diff, a build's working container costs nothing); vfs
# otherwise (every layer a full copy: correct, slower, larger). DIFFTRAIN_CACHE (default
# ~/.cache/difftrain) moves the store; DIFFTRAIN_STORAGE_DRIVER=vfs|overlay chooses.
set -euo pipefail
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
mkdir -p "$cache/container"
driver=${DIFFTRAIN_STORAGE_DRIVER:-}
if [[ -z $driver ]]; then
  driver=vfs
  if grep -qw overlay /proc/filesystems &&
     [[ $(stat -f -c %T "$cache/container") != overlayfs ]]; then
    driver=overlay
  fi
fi
store=$cache/container/$driver
exec podman --root "$store/storage" --runroot "$store/run" --storage-driver "$driver" \
  --runtime runc --cgroup-manager cgroupfs --events-backend file "$@"
