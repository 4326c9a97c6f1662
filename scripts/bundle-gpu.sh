#!/usr/bin/env bash
# Packs what a GPU machine without this project's build dependencies needs to run the GPU
# checks and the benchmark: the GPU test programs, bench_cuda_dit, bench_cuda_attention,
# bench_cuda_norms and difftrain from a CUDA build, and the shared libraries they link that a
# CUDA image lacks (ZeroMQ, yaml-cpp, Gloo, OpenBLAS, ...). CUDA's own libraries (runtime,
# cuBLASLt, NCCL) are left to the machine.
#
#   scripts/bundle-gpu.sh [--pack] [BUILD_DIR [OUT_DIR]]      (defaults: build, .gpu)
#
# Then, on the GPU machine, from a checkout holding OUT_DIR:
#   export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
#   bench/cuda_dit.sh --prebuilt .gpu           (or bench/cuda_session.sh .gpu OUT)
# --pack leaves only OUT_DIR/bundle.tar.xz (about 13 MB instead of 63, for a machine that is
# sent a size-limited copy of the tree); bench/cuda_session.sh unpacks it where it finds one,
# or: tar -C OUT_DIR -xJf OUT_DIR/bundle.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=0
if [[ ${1:-} == --pack ]]; then
  pack=1
  shift
fi
build=${1:-build}
out=${2:-.gpu}

# The bench programs are not in the default build (bench/CMakeLists.txt): build them here.
[[ -f $build/build.ninja || -f $build/Makefile ]] && cmake --build "$build" --target benchmarks >/dev/null
programs=("$build"/cuda_*_test "$build/bench/bench_cuda_dit" "$build/bench/bench_cuda_attention"
  "$build/bench/bench_cuda_norms" "$build/bench/bench_cuda_unet" "$build/difftrain")
for p in "${programs[@]}"; do
  [[ -x $p ]] || { echo "bundle-gpu: $p is missing: build with CUDA first (make build)" >&2; exit 2; }
done
rm -rf "$out" && mkdir -p "$out/lib"
cp "${programs[@]}" "$out/"
strip "$out"/*test "$out/bench_cuda_dit" "$out/bench_cuda_attention" "$out/bench_cuda_norms" \
  "$out/bench_cuda_unet" "$out/difftrain"
# Every library the programs resolve here, less the C runtime and CUDA's.
for p in "${programs[@]}"; do ldd "$p" | awk '$3 ~ /^\// {print $3}'; done | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|libcuda|libcublas|libcudart|libnccl' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
if [[ $pack == 1 ]]; then
  tar -C "$out" -cf - . | xz -T0 -6 >"$out.tar.xz"
  rm -rf "$out" && mkdir -p "$out" && mv "$out.tar.xz" "$out/bundle.tar.xz"
fi
du -sh "$out"
