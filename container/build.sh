#!/usr/bin/env bash
# Builds difftrain in the image's build stage into BUILD_DIR, the way `make build` does on
# a developer's machine and in CI: scripts/install-deps.sh, then the Makefile's CMake
# configuration. Two differences, both for an image: only the packages the build needs
# (DIFFTRAIN_DEPS=build), and no -march=native (the image runs on other CPUs); warnings
# are not errors, as the CUDA image's compiler is not the one CI checks warnings with.
# With CCACHE_DIR set (a directory the build mounts), compilations go through ccache.
# Then writes BUILD_DIR/runtime-packages.txt for the runtime stage.
set -euo pipefail
build_dir=${1:?usage: container/build.sh BUILD_DIR}
cd "$(dirname "$0")/.."

export DIFFTRAIN_DEPS=build
scripts/install-deps.sh
cmake_args="-DDIFFTRAIN_NATIVE=OFF -DDIFFTRAIN_WERROR=OFF"
if [[ -n "${CCACHE_DIR:-}" ]]; then
  cmake_args+=" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
fi
make configure BUILD="$build_dir" CMAKE_ARGS="$cmake_args"
cmake --build "$build_dir" --target difftrain -j "$(nproc)"
container/runtime-packages.sh "$build_dir/difftrain" > "$build_dir/runtime-packages.txt"
