#!/usr/bin/env bash
# What a session lent a GPU runs first, in one call, for issue 23's open points: the attention
# kernels alone at DiT-XL/2's and Latte-L/2's shapes (bench_cuda_attention, every flash variant;
# a few seconds), the fused gated residual + LayerNorm-modulate alone against the memory's rate
# (bench_cuda_norms, a few seconds), cuDNN's fused attention beside them, then the GPU tests and DiT-XL/2's step timed beside PyTorch under
# torch.compile with the model's flash variant and the fastest one whose results matched;
# compute-sanitizer on the tiny DiT step and the flash kernels; where the step's time goes (Nsight Compute's duration of every kernel); why the
# flash kernels run at the rate they do (ncu's speed-of-light, occupancy and warp-stall sections
# of one launch of each); Latte-L/2's step over 16-frame videos; DiT-XL/2's and Latte-L/2's
# step with the blocks' Linear layers in FP8 (written without a GPU). Every result lands in OUT (a
# few files, for a machine that returns only a handful).
#
#   bench/cuda_session.sh PREBUILT OUT
#
# PREBUILT: the programs scripts/bundle-gpu.sh copied, packed or not (LD_LIBRARY_PATH must
# find their libraries: PREBUILT/lib); OUT: a folder for the results. A failing step is
# recorded and the next one runs. DiT-XL/2 runs at micro-batches 32 and 256 (MICRO_BATCHES),
# 32 and 128 on a GPU of less than 100 GiB (an H100: micro-batch 256 needs about 90).
# Each step has a time limit in seconds (BENCH_S, ATTENTION_S, NORMS_S, SANITIZER_S for each of
# memcheck, synccheck and initcheck, RACECHECK_S for each of 2 racechecks, PROFILE_S,
# UNET_PROFILE_S, KERNELS_S, LATTE_S for each Latte run, CUDNN_S, UNET_S for each UNet run,
# FP8_S for each FP8 run): 1,130 s in all,
# more than the device's 600 s a call. An H100 session (2026-11-27) took 505 s of the steps it
# had then (the bench 345 at micro-batches 32 and 128 with two attentions, 42 s of it the GPU
# tests, 120 each torch.compile's rows and ~16 s each of difftrain's); the bench now times three
# attentions (~390 s predicted, hence its 430). So a session of 900 s of device time plans two
# calls: the whole script first (attention, norms, bench, then the sanitizers and the profile as
# far as the 600 s reach), then PARTS (below) naming what OUT/steps.txt lacks, most useful first
# (fp8, profile, unet, sanitizers, latte, kernels).
# OUT/steps.txt says how long each step took and how it ended (124: out of time; 9: a
# sanitizer found errors).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=$1
out=$2
mkdir -p "$out"
# A bundle packed by scripts/bundle-gpu.sh --pack.
if [[ -f $bin/bundle.tar.xz ]]; then
  tar -C "$bin" -xJf "$bin/bundle.tar.xz" && rm -f "$bin/bundle.tar.xz"
fi
: "${BENCH_S:=430}" "${ATTENTION_S:=40}" "${NORMS_S:=15}" "${SANITIZER_S:=10}" "${RACECHECK_S:=25}"
: "${PROFILE_S:=50}" "${KERNELS_S:=55}" "${LATTE_S:=15}" "${CUDNN_S:=30}"
: "${UNET_PROFILE_S:=90}" "${UNET_S:=40}" "${UNET_MICRO_BATCH:=8}" "${FP8_S:=40}"
# The flash kernels' variants the attention bench times (FLASH_VARIANTS), and the attentions the
# step's bench times (ATTENTIONS; unset: flash and the fastest variant of the attention bench
# whose results match flash's, when that is not the model's default, flash-pipelined-wide-stored,
# beside flash-pipelined-wide, the same kernels recomputing dQ's scores: the default's first
# timing, written without a GPU; and cudnn, cuDNN's fused attention in the spatial blocks, also
# written without a GPU);
# PyTorch under torch.compile alone (TORCH_MODES), which with an EMA is the issue's baseline: an
# H100 session (2026-11-27) that timed two attentions and both PyTorch modes ran past its 350 s
# before PyTorch's rows at the second micro-batch.
: "${FLASH_VARIANTS:=flash,flash-pipelined,flash-wide,flash-pipelined-wide,flash-pipelined-wide-stored}"
: "${TORCH_MODES=compile}"  # set and empty: no PyTorch rows
# PARTS (comma-separated): the parts to run, in this order, all by default — attention, norms,
# bench, fp8, sanitizers, profile, kernels, latte, unet — so that a second call can run what a
# first one that reached the device's 600 s left out (e.g. PARTS=fp8,profile,latte,unet).
: "${PARTS:=attention,norms,bench,fp8,sanitizers,profile,kernels,latte,unet}"
want() { [[ ,$PARTS, == *,$1,* ]]; }
export PATH=$PATH:/usr/local/cuda/bin  # nvcc, compute-sanitizer, ncu
# cuDNN (model/cuda/cudnn_attention.h opens libcudnn.so.9): the system's where the loader finds
# it, else the one PyTorch's wheels put beside python3's packages (nvidia-cudnn).
cudnn_lib=
if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 ' && [[ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ]]
then
  cudnn_lib=$(python3 -c 'import importlib.util, os
spec = importlib.util.find_spec("nvidia.cudnn")
print(os.path.join(list(spec.submodule_search_locations)[0], "lib") if spec else "")' 2>/dev/null)
  [[ -n $cudnn_lib ]] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cudnn_lib
fi

# step NAME LIMIT COMMAND...: runs COMMAND under `timeout`, notes its time and exit status.
step() {
  local name=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  timeout -k 5 "$limit" "$@" || rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s (limit $limit s)" >>"$out/steps.txt"
  return "$rc"
}

# The GPU, its driver and CUDA head steps.txt (at most 8 files come back from a call: bench.txt,
# results.jsonl, attention.jsonl, sanitizer.txt, profile.txt, steps.txt, latte.jsonl, and an
# ncu CSV should its summary fail).
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/steps.txt" 2>&1
nvcc --version 2>/dev/null | tail -n 2 >>"$out/steps.txt"
echo "cuDNN: ${cudnn_lib:-as the loader finds it}" >>"$out/steps.txt"

memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
  head -n 1)
if [[ -z ${MICRO_BATCHES:-} ]]; then
  MICRO_BATCHES=32,256
  [[ $memory_mib =~ ^[0-9]+$ ]] && ((memory_mib < 102400)) && MICRO_BATCHES=32,128
fi

# The attention kernels alone (each checked against the first's results, then timed): DiT-XL/2's
# spatial attention at micro-batch 32 (256 tokens, head dim 72) and Latte-L/2's temporal
# attention at micro-batch 8 (8 videos × 256 positions over 16 frames, head dim 64); first, so
# that the step's bench can time the fastest flash variant whose results match flash's.
attention_kernels() {
  "$bin/bench_cuda_attention" --batch 32 --tokens 256 --hidden 1152 --heads 16 \
    --kernels "$FLASH_VARIANTS,gemm,fused" &&
    "$bin/bench_cuda_attention" --batch 2048 --tokens 16 --hidden 1024 --heads 16 \
      --kernels "$FLASH_VARIANTS,flash-short,fused"
}
export bin FLASH_VARIANTS
export -f attention_kernels  # for `timeout`, which runs programs, not functions
want attention &&
  step attention "$ATTENTION_S" bash -c attention_kernels >"$out/attention.jsonl" 2>&1
# cuDNN's fused attention beside the model's flash variant (the reference for its results), at
# DiT-XL/2's spatial shape and Latte-L/2's (8 videos × 16 frames of 256 tokens, head dim 64): a
# run of its own, so that no cuDNN (exit 2, its message) costs the rows above nothing.
cudnn_kernels() {
  "$bin/bench_cuda_attention" --batch 32 --tokens 256 --hidden 1152 --heads 16 \
    --kernels flash-pipelined-wide-stored,cudnn &&
    "$bin/bench_cuda_attention" --batch 128 --tokens 256 --hidden 1024 --heads 16 \
      --kernels flash-pipelined-wide-stored,cudnn
}
export -f cudnn_kernels
want attention &&
  step "attention cudnn" "$CUDNN_S" bash -c cudnn_kernels >>"$out/attention.jsonl" 2>&1
if [[ -z ${ATTENTIONS:-} ]]; then
  ATTENTIONS=flash-pipelined-wide-stored,flash-pipelined-wide
  best=$(python3 bench/fastest_attention.py "$out/attention.jsonl" 2>/dev/null)
  [[ -n $best && ,$ATTENTIONS, != *,$best,* ]] && ATTENTIONS=$ATTENTIONS,$best
  ATTENTIONS=$ATTENTIONS,cudnn
fi
echo "attentions timed in the step: $ATTENTIONS" >>"$out/steps.txt"

# The fused norms alone (rows a block 8, 16 and 32) and a 1 GiB copy for the memory's rate,
# their JSON lines after the attention bench's.
want norms && step norms "$NORMS_S" "$bin/bench_cuda_norms" >>"$out/attention.jsonl" 2>&1

if want bench; then
  echo "== checks and timing" >"$out/bench.txt"
  step bench "$BENCH_S" bench/cuda_dit.sh --prebuilt "$bin" --micro-batches "$MICRO_BATCHES" \
    --steps 20 --attention "$ATTENTIONS" --torch-modes "$TORCH_MODES" --keep-going \
    >>"$out/bench.txt" 2>&1
  cp "${CUDA_BENCH_OUT:-runs/cuda-bench}/results.jsonl" "$out/" 2>/dev/null
fi

# The blocks' Linear layers in FP8 (bench_cuda_dit --fp8; model/cuda/fp8.h; written without a
# GPU, its tests among the bench's checks: cuda_fp8_test, CudaDiTTest.Fp8*): DiT-XL/2 at each
# micro-batch of MICRO_BATCHES and Latte-L/2 over 16 frames, the model's default attention, a row
# each after the bf16 rows in results.jsonl (attention "…+fp8"; "fp8": how many products fell
# back to bf16), to set beside the bf16 rows and torch.compile's. The issue's MFU counts the
# model's FLOPs against the bf16 peak whatever the precision, as Megatron-Core reports FP8 runs.
fp8() {
  step "fp8 $*" "$FP8_S" "$bin/bench_cuda_dit" --fp8 --ema-other-way-steps 0 "$@" \
    >>"$out/results.jsonl" 2>&1
}
if want fp8; then
  IFS=, read -r -a fp8_batches <<<"$MICRO_BATCHES"
  for b in "${fp8_batches[@]}"; do
    fp8 --model DiT-XL/2 --micro-batch "$b"
  done
  fp8 --model Latte-L/2 --frames 16 --num-classes 0 --micro-batch 8 --warmup 3 --steps 10
fi

# The GPU's own sanitizers (issue 23 asks for all four on a tiny step): every tool on the tiny
# DiT step with each attention (GEMM, fused, flash with one and two stages), and racecheck on
# the flash kernels over several tiles, where one tile's reads meet the next one's writes (the
# CPU emulator checks their indexing and, under ThreadSanitizer, their barriers; not the
# hardware's accesses).
sanitize() {  # TOOL PROGRAM FILTER
  echo "== compute-sanitizer --tool $1: $(basename "$2") $3" >>"$out/sanitizer.txt"
  local limit=$SANITIZER_S
  [[ $1 == racecheck ]] && limit=$RACECHECK_S
  step "compute-sanitizer $1 $3" "$limit" compute-sanitizer --tool "$1" --error-exitcode 9 "$2" \
    --gtest_filter="$3" --gtest_brief=1 >"$out/sanitizer.log" 2>&1
  tail -n 4 "$out/sanitizer.log" >>"$out/sanitizer.txt"
}
if want sanitizers; then
  for tool in memcheck racecheck synccheck initcheck; do
    sanitize "$tool" "$bin/cuda_dit_test" 'CudaDiTTest.TinyStepMatchesTheCpuModel'
  done
  sanitize racecheck "$bin/cuda_attention_test" 'FlashAttentionTest.MatchesTheReference'
fi

# Where a step's time goes: Nsight Compute's duration of every kernel of two steps (a warm-up
# and one timed), summed by category (bench/ncu_summary.py); a CSV itself comes back only where
# the summary could not read it, and only one (the 8 files a call).
# ncu_profile NAME LIMIT PROGRAM ARGS...
ncu_profile() {
  local name=$1 limit=$2 csv="$out/ncu-$1.csv"
  shift 2
  step "ncu $name" "$limit" ncu --clock-control none --csv --print-kernel-base function \
    --metrics gpu__time_duration.sum "$@" --warmup 1 --steps 1 >"$csv" 2>>"$out/profile.txt"
  if bench/ncu_summary.py "$csv" >>"$out/profile.txt" 2>&1; then
    rm -f "$csv"
  elif compgen -G "$out/ncu-*.csv.gz" >/dev/null; then
    echo "(ncu-$name.csv not kept: another CSV came back)" >>"$out/profile.txt"
    rm -f "$csv"
  else
    gzip -9 "$csv"
  fi
}
# The UNet's first profile (never run on a GPU): SD2-base at 512 px, the micro-batch of its
# bench below, flash attention; how much of its step is the convolutions' im2col and col2im,
# the attention, the GEMMs (~3,000 launches predicted, ~20 ms each under ncu).
if want profile; then
  echo "== ncu: DiT-XL/2, micro-batch 32, the model's flash variant" >>"$out/profile.txt"
  ncu_profile dit "$PROFILE_S" "$bin/bench_cuda_dit" --model DiT-XL/2 --micro-batch 32 \
    --ema-other-way-steps 0
  echo "== ncu: SD2-base at 512 px, micro-batch $UNET_MICRO_BATCH, flash" >>"$out/profile.txt"
  ncu_profile unet "$UNET_PROFILE_S" "$bin/bench_cuda_unet" --model SD2-base \
    --micro-batch "$UNET_MICRO_BATCH" --attention flash
fi

# The model's flash kernels at DiT-XL/2's shapes (256 tokens, head dim 72, 32 × 16 heads), run
# by bench_cuda_attention (which builds no DiT-XL/2 model: under ncu the whole step took ~15 s
# a kernel on the H100; the attention bench's own time there is not yet measured), and the
# fused norm's backward at a DiT-XL/2 block's (bench_cuda_norms, 32 rows a block, the
# default): the first launch of each, its achieved throughput against the SM's and memory's,
# occupancy, memory traffic and what its warps wait on (an H100 session, 2026-11-27, measured
# the two-stage flash kernels at 125-136 TFLOP/s forward and 95 backward, as FlashAttention
# counts them, and the norm's backward at 1.9 TB/s against a copy's 3.0).
kernel_sections() {
  local k sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis)
  # FlashDq: FlashDqStoredKernel in the default; FlashDkv: FlashDkvKernel or ...ThreeBlocksKernel.
  for k in FlashForward FlashDq FlashDkv; do
    echo "== ncu: $k, DiT-XL/2, micro-batch 32"
    ncu --clock-control none -k "regex:^$k" -c 1 "${sections[@]}" "$bin/bench_cuda_attention" \
      --batch 32 --tokens 256 --hidden 1152 --heads 16 --kernels flash-pipelined-wide-stored \
      --reps 1 2>&1 | grep -v '^{'
  done
  echo "== ncu: GatedResidualNormBackwardKernel, DiT-XL/2, micro-batch 32"
  ncu --clock-control none -k "regex:^GatedResidualNormBackward" -c 1 "${sections[@]}" \
    "$bin/bench_cuda_norms" --rows 32 --reps 1 2>&1 | grep -v '^{'
}
export -f kernel_sections
want kernels &&
  step "ncu kernel sections" "$KERNELS_S" bash -c kernel_sections >>"$out/profile.txt" 2>&1

# Latte-L/2, 16 frames of 32×32 latents (4,096 tokens a video), unconditional: one JSON line
# per attention (difftrain alone: the PyTorch reference is DiT's), the first also with the general
# flash kernels in the temporal blocks (--no-short-attention; its row's short_attention: false)
# beside the short-sequence ones, the model's default, written without a GPU. LATTE_ATTENTIONS
# (comma-separated) replaces the step's ATTENTIONS here.
latte() {
  step "latte $*" "$LATTE_S" "$bin/bench_cuda_dit" --model Latte-L/2 --frames 16 --num-classes 0 \
    --micro-batch 8 --warmup 3 --steps 10 "$@" >>"$out/latte.jsonl" 2>&1
}
if want latte; then
  IFS=, read -r -a latte_attentions <<<"${LATTE_ATTENTIONS:-$ATTENTIONS}"
  latte --attention "${latte_attentions[0]}"
  latte --attention "${latte_attentions[0]}" --no-short-attention
  for a in "${latte_attentions[@]:1}"; do
    latte --attention "$a"
  done
fi

# The Stable Diffusion UNet's step at 512 px (64×64 latents), micro-batch UNET_MICRO_BATCH:
# SD2-base (head dim 64) with the flash kernels, its first timing on a GPU, beside the fused
# kernels it ran on before, and with cuDNN's self-attention (written without a GPU); SD1.5 (head
# dims 40, 80 and 160: flash and fused levels). Against
# the seed figures in ../shared/MODELS.md (NeMo SD v1 on an H800, MosaicML SD2-base on H100s).
# Their JSON lines go after the DiT rows in results.jsonl.
unet() {
  step "unet $*" "$UNET_S" "$bin/bench_cuda_unet" --micro-batch "$UNET_MICRO_BATCH" "$@" \
    >>"$out/results.jsonl" 2>&1
}
if want unet; then
  unet --model SD2-base --attention flash
  unet --model SD2-base --attention fused
  unet --model SD2-base --attention cudnn
  unet --model SD1.5 --attention flash
fi
rm -f "$out/sanitizer.log"
ls "$out"
