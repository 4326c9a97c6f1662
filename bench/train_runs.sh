# Sourced by the step benchmarks (bench/dora_steps.sh, bench/textual_inversion_steps.sh):
#   train_runs DIFFTRAIN WORK RUNS KIND…
# trains WORK/KIND.yaml for each KIND, RUNS times round, each run from scratch; keeps run R's
# metrics as WORK/KIND-R.jsonl and its peak RSS (KiB) as WORK/KIND-R.rss, and removes its
# checkpoint. A failed run prints its log and exits.
train_runs() {
  difftrain=$1 work=$2 runs=$3
  shift 3
  for run in $(seq "$runs"); do
    for kind in "$@"; do
      rm -rf "$work/$kind-ckpt" "$work/$kind-0.jsonl"
      /usr/bin/time -f "%M" -o "$work/$kind-$run.rss" \
        "$difftrain" train --config "$work/$kind.yaml" >"$work/$kind.log" 2>&1 ||
        { cat "$work/$kind.log"; exit 1; }
      cp "$work/$kind-0.jsonl" "$work/$kind-$run.jsonl"
      rm -rf "$work/$kind-ckpt"  # the last step's checkpoint: SD 1.5's whole state is 14 GB
    done
  done
}
