#!/usr/bin/env python3
"""Where a GPU step's time goes, from Nsight Compute's CSV of kernel durations.

    ncu --clock-control none --csv --metrics gpu__time_duration.sum PROGRAM ... > ncu.csv
    bench/ncu_summary.py ncu.csv [--top 20]

Prints the share of the summed kernel time by category (cuBLASLt GEMMs, attention, norms and
modulation, bias gradients, optimizer, the rest) and the largest kernels by name. ncu writes
its own "==PROF==" lines and the program's output around the CSV: the table starts at the row
that names the columns.
"""
import argparse
import collections
import csv
import re
import sys

# Category by kernel name, first match wins (difftrain's kernels are named in model/cuda/*.cu;
# cuBLASLt's are nvjet, xmma, cutlass or sm90 kernels).
CATEGORIES = [
    ("GEMM (cuBLASLt)", r"nvjet|xmma|cutlass|gemm|sm\d\d_"),
    ("attention", r"Attention|Flash|Softmax|SplitHeads|MergeHeads"),
    ("norms, modulation, residuals", r"LayerNorm|GatedResidual|GroupNorm"),
    ("bias gradients", r"BiasGradient"),
    ("optimizer, EMA, gradient norm", r"AdamW|Ema|SumOfSquares"),
    ("activations, casts", r"Gelu|Silu|Geglu|Cast"),
    ("embeddings, layout, loss", r"Patchify|Unpatchify|Embedding|Timestep|SwapAxes|Loss|Im2col|Col2im|Tokens|Planes|Concat|Upsample"),
]

UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,
         "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows):
        if "Kernel Name" in row and "Metric Value" in row:
            return row, rows[i + 1:]
    sys.exit(f"{path}: no row names the columns 'Kernel Name' and 'Metric Value' (ncu --csv?)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    head, rows = read(args.csv)
    name_at, value_at, unit_at = (head.index(c) for c in ("Kernel Name", "Metric Value", "Metric Unit"))
    by_name, launches = collections.Counter(), collections.Counter()
    for row in rows:
        if len(row) <= max(name_at, value_at, unit_at):
            continue
        try:
            ms = float(row[value_at].replace(",", "")) * UNITS[row[unit_at]]
        except (ValueError, KeyError):
            continue
        name = row[name_at].replace("(anonymous namespace)::", "")
        name = re.sub(r"[(<].*", "", re.sub(r"^void ", "", name)).strip()
        name = name.removeprefix("difftrain::cuda::")
        by_name[name] += ms
        launches[name] += 1
    total = sum(by_name.values())
    if total == 0:
        sys.exit(f"{args.csv}: no kernel durations")
    by_category = collections.Counter()
    for name, ms in by_name.items():
        category = next((c for c, pattern in CATEGORIES if re.search(pattern, name)), "other")
        by_category[category] += ms
    print(f"{sum(launches.values())} launches, {total:.1f} ms of kernel time")
    print("| share | ms | category |\n|---|---|---|")
    for category, ms in by_category.most_common():
        print(f"| {100 * ms / total:.1f}% | {ms:.2f} | {category} |")
    print(f"\n| share | ms | launches | kernel |\n|---|---|---|---|")
    for name, ms in by_name.most_common(args.top):
        print(f"| {100 * ms / total:.1f}% | {ms:.2f} | {launches[name]} | {name} |")


if __name__ == "__main__":
    main()
