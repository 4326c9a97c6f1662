#!/usr/bin/env bash
# Builds difftrain in the image's build stage into BUILD_DIR, the way `make build` does on
# a developer's machine and in CI: scripts/install-deps.sh, then the Makefile's CMake
# configuration. Two differences, both for an image: only the packages the build needs
# (DIFFTRAIN_DEPS=build), and no -march=native (the image runs on other CPUs); warnings
# are not errors, as the CUDA image's compiler is not the one CI checks warnings with.
# Then writes BUILD_DIR/runtime-packages.txt for the runtime stage.
set -euo pipefail
build_dir=${1:?usage: container/build.sh BUILD_DIR}
cd "$(dirname "$0")/.."

export DIFFTRAIN_DEPS=build
scripts/install-deps.sh
make configure BUILD="$build_dir" CMAKE_ARGS="-DDIFFTRAIN_NATIVE=OFF -DDIFFTRAIN_WERROR=OFF"
cmake --build "$build_dir" --target difftrain -j "$(nproc)"
container/runtime-packages.sh "$build_dir/difftrain" > "$build_dir/runtime-packages.txt"
