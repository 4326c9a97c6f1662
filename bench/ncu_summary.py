#!/usr/bin/env python3
"""Where a GPU step's time goes, from Nsight Compute's CSV of kernel durations.

    ncu --clock-control none --csv --print-kernel-base function \
        --metrics gpu__time_duration.sum PROGRAM ... > ncu.csv
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
GEMM = ("GEMM (cuBLASLt)", r"nvjet|xmma|cutlass|gemm|sm\d\d_")
CATEGORIES = [
    # cuDNN's fused attention (model/cuda/cudnn_attention.h): its kernels' names hold "sdpa" or
    # "fmha", and an "sm90_" the GEMM pattern would take.
    ("attention", r"sdpa|fmha"),
    GEMM,
    ("attention", r"Attention|Flash|Softmax|SplitHeads|MergeHeads"),
    ("norms, modulation, residuals", r"LayerNorm|GatedResidual|GroupNorm|AddInto"),
    # cuBLASLt's BGRADB epilogue runs as its own kernel, globalKernelBgradAB*; a convolution's
    # bias gradient sums its output gradient's planes (SumPlanes).
    ("bias gradients", r"BiasGradient|Bgrad|SumPlanes"),
    # The UNet's convolutions around their GEMMs (model/cuda/conv2d.h): the columns written and
    # gathered back, the zero-padded weight copies.
    ("convolutions' im2col, col2im", r"Im2col|Col2im|PadWeight|AddUnpadded"),
    # ZeroRanges: the gradients a step's first micro-batch does not write whole.
    ("optimizer, EMA, gradients", r"AdamW|Ema|SumOfSquares|ZeroRanges"),
    ("activations, casts", r"Gelu|Silu|Geglu|Cast"),
    ("embeddings, layout, loss", r"Patchify|Unpatchify|Embedding|Timestep|SwapAxes|Loss|Tokens|Planes|Concat|Upsample"),
]

UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,
         "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def base_name(kernel):
    """The kernel's function name alone: ncu prints it so with --print-kernel-base function,
    and by default demangled, with its return type, namespaces (anonymous ones written
    "(anonymous namespace)"), template arguments and parameter list."""
    outside, depth = [], 0
    for c in kernel:
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth = max(depth - 1, 0)
        elif depth == 0:
            outside.append(c)
    words = "".join(outside).split()
    return words[-1].split("::")[-1] if words else kernel.strip()


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
    by_name, launches, full = collections.Counter(), collections.Counter(), {}
    for row in rows:
        if len(row) <= max(name_at, value_at, unit_at):
            continue
        try:
            ms = float(row[value_at].replace(",", "")) * UNITS[row[unit_at]]
        except (ValueError, KeyError):
            continue
        name = base_name(row[name_at])
        full.setdefault(name, row[name_at])
        by_name[name] += ms
        launches[name] += 1
    total = sum(by_name.values())
    if total == 0:
        sys.exit(f"{args.csv}: no kernel durations")
    by_category = collections.Counter()
    for name, ms in by_name.items():
        # A library's kernel may have a plain function name (cutlass::Kernel2<...gemm...>):
        # its template arguments then say what it is.
        category = next((c for c, pattern in CATEGORIES if re.search(pattern, name)), None)
        if category is None:
            category = GEMM[0] if re.search(GEMM[1], full[name]) else "other"
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
