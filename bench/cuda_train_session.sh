#!/usr/bin/env bash
# What a session lent a GPU runs second, after bench/cuda_session.sh, for issue 23's
# "trains" point: the Fashion-MNIST benchmark job (jobs/fashion-mnist.yaml) with
# `train.device: cuda`, timed as `difftrain train` runs it (its micro-batches made on the host
# while the GPU computes), the GPU Trainer's tests, and the trained model's samples scored by
# the project's classifier as bench/fashion_learning.sh scores the CPU model's.
#
#   bench/cuda_train_session.sh PREBUILT DATA OUT
#
# PREBUILT: the programs scripts/bundle-gpu.sh copied, packed or not (LD_LIBRARY_PATH must
# find PREBUILT/lib); DATA: a directory holding Fashion-MNIST's four IDX files (a GPU machine
# has no Debian package: carry a copy of /usr/share/datasets/fashion-mnist); OUT: a folder
# for the results, four files: steps.txt (each step's time and exit status), train.log,
# tests.txt and eval.txt. DEVICE=cpu STEPS=N SEEDS=... change what runs (a CPU dry run of the
# script itself: DEVICE=cpu STEPS=20 SEEDS=1 PER_CLASS=2). Limits in seconds: TRAIN_S,
# TESTS_S, EVAL_S (sampling and scoring, per seed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bin=$1
data=$2
out=$3
mkdir -p "$out"
if [[ -f $bin/bundle.tar.xz ]]; then
  tar -C "$bin" -xJf "$bin/bundle.tar.xz" && rm -f "$bin/bundle.tar.xz"
fi
[[ -x $bin/difftrain ]] || { echo "cuda_train_session: no $bin/difftrain" >&2; exit 2; }
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do
  [[ -f $data/$f ]] || { echo "cuda_train_session: $data has no $f" >&2; exit 2; }
done
: "${DEVICE:=cuda}" "${SEEDS:=1 3}" "${PER_CLASS:=100}" "${TRAIN_S:=120}" "${TESTS_S:=120}"
: "${EVAL_S:=120}"
export OMP_WAIT_POLICY=passive

step() {  # NAME LIMIT COMMAND...: runs COMMAND under `timeout`, notes its time and status
  local name=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  timeout -k 5 "$limit" "$@" || rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s (limit $limit s)" >>"$out/steps.txt"
  return "$rc"
}

# The benchmark job as written, but on DEVICE, reading DATA, checkpointing into a scratch run
# directory (a checkpoint is several files; OUT returns only a few).
run=runs/cuda-train
rm -rf "$run" && mkdir -p "$run"
data_abs=$(cd "$data" && pwd)
sed -e "s|^  device: cpu.*|  device: $DEVICE|" \
  -e "s|^  kind: fashion_mnist|  kind: fashion_mnist\n  path: $data_abs|" \
  -e "s|^  dir: runs/fashion-mnist/checkpoints|  dir: $run/checkpoints|" \
  jobs/fashion-mnist.yaml >"$run/job.yaml"
if ! grep -q "device: $DEVICE" "$run/job.yaml" || ! grep -q "path: $data_abs" "$run/job.yaml"; then
  echo "cuda_train_session: jobs/fashion-mnist.yaml changed; cannot rewrite it" >&2
  exit 2
fi

start=$(date +%s%N)
step train "$TRAIN_S" "$bin/difftrain" train --config "$run/job.yaml" ${STEPS:+--steps "$STEPS"} \
  >"$out/train.log" 2>&1
echo "train: $((($(date +%s%N) - start) / 1000000)) ms wall on $DEVICE" >>"$out/steps.txt"

# The GPU Trainer against the CPU Trainer, resume, OOM, a one-rank NCCL group.
if [[ $DEVICE == cuda ]]; then
  step tests "$TESTS_S" "$bin/cuda_train_step_test" >"$out/tests.txt" 2>&1
fi

classifier=model/eval/fashion_mnist_classifier.safetensors
for seed in $SEEDS; do
  samples=$run/samples-$seed.safetensors
  # shellcheck disable=SC2016  # the inner script's own arguments
  step "sample+eval seed $seed" "$EVAL_S" bash -c '
    "$1" sample --checkpoint "$2/checkpoints" --classes 0,1,2,3,4,5,6,7,8,9 --sampler ddim \
      --steps 50 --cfg 5 --cfg-interval 250,750 --per-class "$3" --seed "$4" --raw "$5" &&
    "$1" eval --classifier "$6" --samples "$5" --floor --seed "$4" --data-dir "$7"' \
    _ "$bin/difftrain" "$run" "$PER_CLASS" "$seed" "$samples" "$classifier" "$data_abs" \
    >>"$out/eval.txt" 2>&1
done
cat "$out/steps.txt"
