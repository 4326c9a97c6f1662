#!/usr/bin/env bash
# What a session lent a GPU runs first, in one call, for issue 23's open points: the GPU tests
# (the flash attention's among them), compute-sanitizer on the flash kernels, DiT-XL/2 timed with
# the batched-GEMM and the flash attention beside PyTorch, and where the flash step's time goes.
# Every result lands in OUT (a few files, for a machine that returns only a handful).
#
#   bench/cuda_session.sh PREBUILT OUT
#
# PREBUILT: the programs scripts/bundle-gpu.sh copied (LD_LIBRARY_PATH must find their
# libraries); OUT: a folder for the results. A failing step is recorded and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1
out=$2
mkdir -p "$out"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
nvcc --version 2>/dev/null | tail -n 2 >>"$out/gpu.txt"

echo "== checks and timing" >"$out/bench.txt"
bench/cuda_dit.sh --prebuilt "$bin" --micro-batches 32,256 --steps 20 --attention gemm,flash \
  >>"$out/bench.txt" 2>&1 || echo "bench/cuda_dit.sh exited $?" >>"$out/bench.txt"
cp runs/cuda-bench/results.jsonl "$out/" 2>/dev/null

# The CPU emulator cannot see races between warps; the GPU's sanitizers can.
for tool in memcheck racecheck synccheck initcheck; do
  echo "== compute-sanitizer --tool $tool (flash attention)" >>"$out/sanitizer.txt"
  compute-sanitizer --tool "$tool" "$bin/cuda_attention_test" \
    --gtest_filter='FlashAttentionTest.MatchesTheReference' --gtest_brief=1 2>&1 |
    tail -n 4 >>"$out/sanitizer.txt"
done

echo "== ncu: DiT-XL/2, micro-batch 32, flash attention" >"$out/profile.txt"
ncu --clock-control none --csv --metrics gpu__time_duration.sum "$bin/bench_cuda_dit" \
  --model DiT-XL/2 --micro-batch 32 --attention flash --warmup 1 --steps 2 \
  >"$out/ncu-flash.csv" 2>>"$out/profile.txt" &&
  bench/ncu_summary.py "$out/ncu-flash.csv" >>"$out/profile.txt" 2>&1
rm -f "$out/ncu-flash.csv"
ls "$out"
