#!/usr/bin/env bash
# DiT training throughput on one GPU, difftrain beside PyTorch on the same GPU, in one go:
#   1. builds bench_cuda_dit and the GPU tests (CUDA build in build-cuda/), unless --prebuilt;
#   2. checks: every GPU test (each op and a whole DiT step against the CPU reference);
#      a failure stops the run before anything is timed (with --keep-going it is reported and
#      the timing runs anyway: a failing flash test says nothing of the GEMM attention's speed);
#   3. times, for each micro-batch: difftrain's bf16 step (CUDA graph) with each attention
#      of --attention (gemm: batched GEMMs, fused: the wmma kernels, flash: the mma.sync
#      kernels, -pipelined with two stages, -wide with two m-tiles a warp in the forward,
#      cudnn: cuDNN's fused attention; model/dit/cuda/dit.h) — and with --fp8 each again with
#      the blocks' Linear layers in FP8 (rows labelled ATTENTION+fp8) — then PyTorch's
#      (tests/reference/dit_bench_torch.py: bf16 autocast, scaled_dot_product_attention),
#      torch.compile and eager (--torch-modes: which of them, in that order);
#   4. prints a Markdown table with samples/s, TFLOP/s, MFU, peak memory and the ratio of
#      difftrain to torch.compile, and keeps every row in runs/cuda-bench/results.jsonl;
#   5. with --profile, where difftrain's step spends its time at the first micro-batch
#      (Nsight Compute's kernel durations, bench/ncu_summary.py; runs/cuda-bench/ncu.csv), with
#      the first attention of --attention.
#
#   bench/cuda_dit.sh [--model DiT-XL/2] [--micro-batches 32,64,128,256] [--steps 20]
#                     [--peak-tflops 989] [--attention flash-pipelined-wide-stored[,flash][,gemm]]
#                     [--prebuilt DIR] [--fp8]
#                     [--no-torch] [--torch-modes compile,eager] [--profile] [--keep-going]
#
# --prebuilt DIR: DIR holds bench_cuda_dit and the GPU test programs (cuda_*_test) already built,
# for a GPU machine without the build's dependencies (then LD_LIBRARY_PATH must find the
# shared libraries they link).
set -euo pipefail
cd "$(dirname "$0")/.."

model=DiT-XL/2
micro_batches=32,64,128,256
steps=20
peak=989
attention=flash-pipelined-wide-stored  # the model's default (model/dit/cuda/dit.h)
prebuilt=
torch=1
torch_modes=compile,eager
profile=0
keep_going=0
fp8=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --micro-batches) micro_batches=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --peak-tflops) peak=$2; shift 2 ;;
    --attention) attention=$2; shift 2 ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    --no-torch) torch=0; shift ;;
    --torch-modes) torch_modes=$2; shift 2 ;;
    --profile) profile=1; shift ;;
    --keep-going) keep_going=1; shift ;;
    --fp8) fp8=1; shift ;;
    *) echo "bench/cuda_dit.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done

out=${CUDA_BENCH_OUT:-runs/cuda-bench}  # the rows (results.jsonl) and each run's log
mkdir -p "$out"
results=$out/results.jsonl
: >"$results"

if [[ -n $prebuilt ]]; then
  bin=$prebuilt
  tests=$(ls "$bin"/cuda_*_test)
else
  make deps
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DDIFFTRAIN_CUDA=ON >/dev/null
  # Every GPU test program: model/cuda/X_test.cc and model/<family>/cuda/X_test.cc build as
  # cuda_X_test.
  gpu_tests=()
  for src in model/cuda/*_test.cc model/*/cuda/*_test.cc; do
    gpu_tests+=("cuda_$(basename "$src" .cc)")
  done
  cmake --build build-cuda --target bench_cuda_dit "${gpu_tests[@]}"
  bin=build-cuda
  tests=$(printf "build-cuda/%s\n" "${gpu_tests[@]}")
fi

echo "== checks: the GPU tests"
for t in $tests; do
  log=$out/$(basename "$t").log
  start=$SECONDS
  if ! "$t" --gtest_brief=1 >"$log" 2>&1; then
    cat "$log"
    if [[ $keep_going == 1 ]]; then
      echo "bench/cuda_dit.sh: $(basename "$t") FAILED (--keep-going: timing anyway)" >&2
      continue
    fi
    echo "bench/cuda_dit.sh: $(basename "$t") failed: nothing is timed" >&2
    exit 1
  fi
  # Skipped for want of a GPU: nothing to time either. (One GPU runs everything but the
  # test that needs two, which says so; gtest counts a skipped test as "PASSED ] 0 tests".)
  if grep -v "needs 2 GPUs" "$log" | grep -m1 "GPU test skipped" >&2; then
    echo "bench/cuda_dit.sh: $(basename "$t") found no usable GPU: nothing is timed" >&2
    exit 1
  fi
  echo "$(basename "$t"): $(grep -o 'PASSED.*' "$log") ($((SECONDS - start)) s)"
  # What a test reports of the path it took (a line "note: ..."), e.g. the GEMM epilogues.
  # (None is no failure: under `set -e -o pipefail` a grep that matches nothing would end the run.)
  grep '^note: ' "$log" | sort -u || true
done

echo "== timing $model, micro-batches $micro_batches, $steps steps each (${SECONDS} s in)"
IFS=, read -ra batches <<<"$micro_batches"
IFS=, read -ra attentions <<<"$attention"
variants=("${attentions[@]}")
if [[ $fp8 == 1 ]]; then
  for a in "${attentions[@]}"; do variants+=("$a+fp8"); done
fi
for b in "${batches[@]}"; do
  for a in "${variants[@]}"; do
    start=$SECONDS
    precision=()
    [[ $a == *+fp8 ]] && precision=(--fp8)
    if ! "$bin/bench_cuda_dit" --model "$model" --micro-batch "$b" --steps "$steps" \
        --peak-tflops "$peak" --attention "${a%+fp8}" "${precision[@]}" >>"$results" \
        2>"$out/difftrain-$b-$a.err"; then
      printf '{"impl": "difftrain", "model": "%s", "micro_batch": %d, "attention": "%s", "error": "%s"}\n' \
        "$model" "$b" "$a" "$(tail -n 1 "$out/difftrain-$b-$a.err" | tr -d '"\\')" >>"$results"
    fi
    echo "difftrain, micro-batch $b, $a attention: $((SECONDS - start)) s"
  done
  if [[ $torch == 1 ]]; then
    IFS=, read -ra modes <<<"$torch_modes"
    for mode in "${modes[@]}"; do  # compile first, the target's baseline, should time run out
      start=$SECONDS
      python3 tests/reference/dit_bench_torch.py --model "$model" --micro-batches "$b" \
        --steps "$steps" --mode "$mode" --peak-tflops "$peak" --json "$out/torch.json" \
        >"$out/torch-$mode-$b.log" 2>&1 || true
      python3 -c 'import json,sys; [print(json.dumps(dict(r, impl="torch"))) for r in json.load(open(sys.argv[1]))]' \
        "$out/torch.json" >>"$results" 2>/dev/null || \
        printf '{"impl": "torch", "mode": "%s", "micro_batch": %d, "error": "see %s"}\n' "$mode" "$b" \
          "$out/torch-$mode-$b.log" >>"$results"
      rm -f "$out/torch.json"
      echo "torch $mode, micro-batch $b: $((SECONDS - start)) s"
    done
  fi
done

python3 - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def find(impl, mode, b, attention=None):
    for r in rows:
        if r.get("impl") == impl and r.get("micro_batch") == b and (mode is None or r.get("mode") == mode) \
                and (attention is None or r.get("attention") == attention):
            return r
def cell(r, key, fmt):
    if r is None: return "—"
    if r.get("status") == "OOM" or "out of memory" in r.get("error", ""): return "OOM"
    if r.get("error") or r.get(key) is None: return "error"
    return fmt.format(r[key])
print("| micro batch | attention | difftrain samples/s | TFLOP/s | MFU | peak GiB | torch eager samples/s | torch.compile samples/s | TFLOP/s | MFU | peak GiB | difftrain / compile |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
attentions = list(dict.fromkeys(r["attention"] for r in rows if r.get("impl") == "difftrain"))
for b in sorted({r["micro_batch"] for r in rows}):
  for a in attentions:
    d, e, c = find("difftrain", None, b, a), find("torch", "eager", b), find("torch", "compile", b)
    ratio = "—"
    if d and c and d.get("samples_per_s") and c.get("samples_per_s"):
        ratio = "{:.2f}×".format(d["samples_per_s"] / c["samples_per_s"])
    print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
        b, a, cell(d, "samples_per_s", "{:.1f}"), cell(d, "tflops", "{:.0f}"), cell(d, "mfu", "{:.1%}"),
        cell(d, "peak_mem_gib", "{:.1f}"), cell(e, "samples_per_s", "{:.1f}"),
        cell(c, "samples_per_s", "{:.1f}"), cell(c, "tflops", "{:.0f}"), cell(c, "mfu", "{:.1%}"),
        cell(c, "peak_mem_gib", "{:.1f}"), ratio))
# What cuBLASLt autotuning found in each difftrain run (bench_cuda_dit's gemm_tuning: one step's
# GEMMs timed on the heuristic's first choices and on the fastest candidates).
for r in rows:
    t = r.get("gemm_tuning")
    if r.get("impl") == "difftrain" and t:
        print("GEMM autotuning, micro-batch {} {}: {:.2f} ms a step on cuBLASLt's first choices, "
              "{:.2f} tuned ({} of {} plans timed, {} changed)".format(
                  r["micro_batch"], r["attention"], t["heuristic_ms_a_step"], t["tuned_ms_a_step"],
                  t["tuned"], t["plans"], t["changed"]))
# Where the EMA was updated (bench_cuda_dit's ema: the row's way, and the median step the other
# way, timed right after in the same run).
for r in rows:
    e = r.get("ema")
    if r.get("impl") == "difftrain" and e and r.get("step_ms_median") and "step_ms_the_other_way" in e:
        ways = ("on its own stream", "in AdamW's pass")
        mine, other = ways if e["own_stream"] else ways[::-1]
        print("EMA, micro-batch {} {}: {:.2f} ms a step {}, {:.2f} {}".format(
            r["micro_batch"], r["attention"], r["step_ms_median"], mine,
            e["step_ms_the_other_way"], other))
EOF

if [[ $profile == 1 ]]; then
  echo "== where the time goes: $model, micro-batch ${batches[0]} (ncu, every kernel of 3 steps)"
  ncu --clock-control none --csv --print-kernel-base function --metrics gpu__time_duration.sum \
    "$bin/bench_cuda_dit" --model "$model" --micro-batch "${batches[0]}" \
    --attention "${attentions[0]}" --warmup 1 --steps 2 --ema-other-way-steps 0 \
    >"$out/ncu.csv" 2>"$out/ncu.err" ||
    { tail -n 3 "$out/ncu.err" >&2; exit 1; }
  bench/ncu_summary.py "$out/ncu.csv"
fi
