#!/usr/bin/env bash
# The chaos bench (docs/benchmarks.md): TRIALS trials of tests/integration/chaos_test.cc, a
# real controller and two real worker daemons under a supervisor with random faults (kill -9
# of a rank, a daemon or the controller, SIGTERM to the controller, SIGSTOP of a rank, a byte
# of the newest checkpoint flipped, a node's link cut when network namespaces can be made).
# Prints one line per trial, then the fault mix and the time until the job ran again after
# each kind of fault. Runs under `nice` (it is long); a failed trial prints its logs.
# Usage: bench/chaos.sh [BUILD=build] [TRIALS=200] [SEED=random]
set -euo pipefail
build=${1:-build}
trials=${2:-200}
seed=${3:-$RANDOM$RANDOM}
cmake --build "$build" --target difftrain chaos_test >/dev/null
# The daemons run a copy: a rebuild during the run must not replace the binary under it.
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
cp "$build/difftrain" "$build/chaos_test" "$copy/"
DIFFTRAIN_TEST_BINARY=$copy/difftrain DIFFTRAIN_CHAOS_TRIALS=$trials DIFFTRAIN_CHAOS_SEED=$seed \
  OMP_WAIT_POLICY=passive nice -n 19 "$copy/chaos_test"
