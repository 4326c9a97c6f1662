#!/bin/sh
# What writing and restoring checkpoints takes beside a rank's arenas, against the plan: MODEL
# (DiT-B/2: 32x32 latents, 256 tokens) at micro-batch 1 on the two ranks of LAYOUT, synthetic data,
# OMP_NUM_THREADS=1 a rank. A first run trains 2 steps and writes a checkpoint after each; a second
# resumes it and trains a third. Prints the memory `validate` plans for the job and, for each run
# and rank, its peak RSS (GNU time's maximum resident set) in GiB, and how long each checkpoint
# took rank 0 (from its step's log line to its "written" line: gather, write, commit).
#
#   bench/checkpoint_memory.sh [BUILD_DIR] [LAYOUT] [MODEL]   (build, "tp: 2", DiT-B/2)
set -eu
difftrain=$(cd "${1:-build}" && pwd)/difftrain
layout=${2:-"tp: 2"}
model=${3:-DiT-B/2}
work=$(mktemp -d /tmp/checkpoint_memory.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
cat >"$work/job.yaml" <<YAML
model: {name: $model, learn_sigma: false}
batch: {micro: 1, global: 1}
train: {steps: 3, log_every: 1}
parallel: {$layout, zero1: true}
checkpoint: {dir: $work/ckpt, every: 1, keep: 2}
cluster: {nodes: 1, devices_per_node: 2}
YAML
"$difftrain" validate "$work/job.yaml" | grep -E "^memory per rank|^  \+"
# run NAME STEPS: both ranks of the job, each under GNU time.
run() {
  for rank in 1 0; do
    OMP_NUM_THREADS=1 /usr/bin/time -f "%M" -o "$work/$1-$rank.rss" "$difftrain" train \
      --config "$work/job.yaml" --rank $rank --world 2 --store "$work/store-$1" --steps "$2" \
      >"$work/$1-$rank.log" 2>&1 &
  done
  wait
  for rank in 0 1; do
    grep -q "^[0-9]" "$work/$1-$rank.rss" || { cat "$work/$1-$rank.log"; exit 1; }
    printf '%s rank %s: peak RSS %.2f GiB\n' "$1" $rank \
      "$(awk '{ print $1 / 1048576 }' "$work/$1-$rank.rss")"
  done
  # Rank 0's log: from a step's line to its checkpoint's "written" line (gather, write, commit).
  awk -v run="$1" '
    function seconds(stamp) { split(stamp, t, ":"); return t[1] * 3600 + t[2] * 60 + t[3] }
    / step [0-9]+\/[0-9]+ / { at = seconds(substr($2, 1, length($2) - 1)) }
    / checkpoint step [0-9]+ written / {
      printf "%s checkpoint step %s: %.1f s\n", run, $6, seconds(substr($2, 1, length($2) - 1)) - at
    }' "$work/$1-0.log"
}
run train 2
run resume 3
grep -h "resumed from step" "$work/resume-0.log" | head -n 1
