#!/usr/bin/env bash
# Control-plane scale (docs/benchmarks.md): a real controller and 1,024 fake worker daemons
# x 8 ranks on loopback, RUNS times; prints each run and the median of each figure.
# Usage: bench/control_plane.sh [BUILD=build] [RUNS=5] [NODES=1024] [RANKS_PER_NODE=8] [SECONDS=10]
set -euo pipefail
build=${1:-build}
runs=${2:-5}
nodes=${3:-1024}
ranks=${4:-8}
seconds=${5:-10}
cmake --build "$build" --target difftrain bench_control_plane >/dev/null
out=$(for _ in $(seq "$runs"); do
  "$build/bench/bench_control_plane" "$build/difftrain" "$nodes" "$ranks" "$seconds"
done)
echo "$out"
echo "$out" | /usr/bin/python3 -c '
import json, statistics, sys
rows = [json.loads(line) for line in sys.stdin if line.strip()]
keys = ["connect_s", "assignment_s", "rendezvous_s", "heartbeat_cpu_fraction"]
print("median of", len(rows), "runs:", {k: round(statistics.median(r[k] for r in rows), 4) for k in keys})
'
