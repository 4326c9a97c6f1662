#!/usr/bin/env python3
"""The fastest flash variant in bench_cuda_attention's output, at DiT-XL/2's spatial shape.

    bench/fastest_attention.py attention.jsonl [--tokens 256]

Reads the JSON lines bench_cuda_attention printed (other lines are skipped), keeps the rows of
kernels named flash* at --tokens whose results matched the first kernel's ("matches_first"),
and prints the name of the one with the least forward + backward median time. Exits 1, printing
nothing, when no row qualifies.
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl")
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    best = None
    with open(args.jsonl) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or row.get("tokens") != args.tokens:
                continue
            if not str(row.get("kernel", "")).startswith("flash") or not row.get("matches_first"):
                continue
            total = row["forward_ms"] + row["backward_ms"]
            if best is None or total < best[0]:
                best = (total, row["kernel"])
    if best is None:
        sys.exit(1)
    print(best[1])


if __name__ == "__main__":
    main()
