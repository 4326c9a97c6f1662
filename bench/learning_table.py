#!/usr/bin/env python3
"""Prints the learning benchmarks' table (bench/fashion_learning.sh, bench/unet_learning.sh):
each seed's `difftrain eval --floor --json` (RUN/eval-SEED.json), the means, and whether the
targets are met (conditional accuracy >= 0.80, FD <= 3 x the mean floor).

  bench/learning_table.py RUN SEED...
"""
import json
import statistics
import sys

run, seeds = sys.argv[1], sys.argv[2:]
rows = [json.load(open(f"{run}/eval-{s}.json")) for s in seeds]
print("| seed | conditional accuracy | FD | floor FD | FD / floor |")
print("|---|---|---|---|---|")
for s, r in zip(seeds, rows):
    print(f"| {s} | {r['conditional_accuracy']:.3f} | {r['fd']:.1f} | {r['floor_fd']:.1f} | "
          f"{r['fd'] / r['floor_fd']:.2f} |")
acc, fd, floor = (statistics.mean(r[k] for r in rows)
                  for k in ("conditional_accuracy", "fd", "floor_fd"))
print(f"| mean | {acc:.3f} | {fd:.1f} | {floor:.1f} | {fd / floor:.2f} |")
print(f"targets: accuracy >= 0.80 ({'met' if acc >= 0.8 else 'not met'}), "
      f"FD <= 3 x floor = {3 * floor:.1f} ({'met' if fd <= 3 * floor else 'not met'})")
