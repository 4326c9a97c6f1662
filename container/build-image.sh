#!/usr/bin/env bash
# Builds the CPU image (container/Dockerfile, VARIANT=cpu) as TAG on a machine with no
# container daemon and no registry: Debian's podman/buildah in a private store
# (container/podman.sh), on a debian:bookworm-slim made from Debian's archive by mmdebstrap.
# Everything slow is kept in the cache directory (DIFFTRAIN_CACHE, default
# ~/.cache/difftrain) for the next run:
#   container/base-bookworm.tar   the mmdebstrap base, imported as debian:bookworm-slim
#   container/<driver>/           images and build layers: the build stage's package layer
#                                 is reused while scripts/install-deps.sh is unchanged, the
#                                 compile layer while the source tree is unchanged
#   ccache                        the compiler cache of the image's build stage: after a
#                                 source change only changed files compile
# Missing tools are installed through scripts/install-deps.sh. Runs that overlap take turns.
#   container/build-image.sh difftrain:0.1.0-cpu
set -euo pipefail
tag=${1:?usage: container/build-image.sh TAG}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
podman=$root/container/podman.sh
mkdir -p "$cache/container" "$cache/ccache"
exec 9>"$cache/container/lock"
flock 9

for tool in podman buildah runc mmdebstrap; do
  command -v "$tool" >/dev/null || { "$root/scripts/install-deps.sh"; break; }
done

# The base: Debian 12 from the same suites a Debian 12 machine installs from (security
# updates included), so the packages the build stage names are those of the runtime stage.
base=$cache/container/base-bookworm.tar
if ! "$podman" image exists debian:bookworm-slim; then
  if [[ ! -s $base ]]; then
    echo "build-image: making the debian:bookworm-slim base with mmdebstrap"
    mmdebstrap --quiet --variant=minbase --format=tar bookworm "$base.new" \
      "deb http://deb.debian.org/debian bookworm main" \
      "deb http://deb.debian.org/debian bookworm-updates main" \
      "deb http://deb.debian.org/debian-security bookworm-security main"
    mv "$base.new" "$base"
  fi
  "$podman" import --quiet "$base" debian:bookworm-slim >/dev/null
fi

"$podman" build --pull=never --layers --isolation chroot \
  -f "$root/container/Dockerfile" --ignorefile "$root/container/Dockerfile.dockerignore" \
  --build-arg VARIANT=cpu --build-arg CCACHE_DIR=/ccache -v "$cache/ccache:/ccache" \
  -t "$tag" "$root"
