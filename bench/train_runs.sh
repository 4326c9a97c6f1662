# Sourced by the step benchmarks (bench/dora_steps.sh, bench/textual_inversion_steps.sh,
# bench/text_encoder_lora_steps.sh):
#   text_bench_setup NAME BUILD_DIR
# sets difftrain (BUILD_DIR's), here (the repository), work (a new /tmp/NAME.XXXXXX, removed at
# exit unless KEEP is set) and python (scripts/text_encoder_env.sh's), and saves SD 1.x's CLIP
# text model with random weights into WORK/sd (bench/text_encoder_torch.py save);
#   train_runs DIFFTRAIN WORK RUNS KIND…
# trains WORK/KIND.yaml for each KIND, RUNS times round, each run from scratch; keeps run R's
# metrics as WORK/KIND-R.jsonl and its peak RSS (KiB) as WORK/KIND-R.rss, and removes its
# checkpoint. A failed run prints its log and exits.
text_bench_setup() {
  difftrain=$(cd "$2" && pwd)/difftrain
  here=$(cd "$(dirname "$0")/.." && pwd)
  work=$(mktemp -d "/tmp/$1.XXXXXX")
  [ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
  python=$("$here/scripts/text_encoder_env.sh" | tail -n 1)
  (cd "$here/tests/reference" && "$python" "$here/bench/text_encoder_torch.py" save "$work/sd") \
    >/dev/null 2>&1
}

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
