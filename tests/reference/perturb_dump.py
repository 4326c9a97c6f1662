#!/usr/bin/python3
"""Writes a copy of a debug dump with some tensors scaled, for the checkers' own tests.

    PYTHON tests/reference/perturb_dump.py IN OUT PREFIX FACTOR
    PYTHON tests/reference/perturb_dump.py IN OUT --metadata KEY VALUE

Every tensor whose name starts with PREFIX is multiplied by FACTOR (in float64, stored back
in the tensor's dtype); the rest, and the metadata, are copied unchanged. Exit status 2 when
no tensor matches. With --metadata, the tensors are copied and metadata KEY is set to VALUE."""

import sys

import safetensors_np


def main(argv):
    if len(argv) == 5 and argv[2] == "--metadata":
        tensors, metadata = safetensors_np.read(argv[0])
        metadata[argv[3]] = argv[4]
        safetensors_np.write(argv[1], tensors, metadata)
        print(f"metadata {argv[3]} set to {argv[4]}")
        return 0
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    source, target, prefix, factor = argv[0], argv[1], argv[2], float(argv[3])
    tensors, metadata = safetensors_np.read(source)
    matched = [name for name in tensors if name.startswith(prefix)]
    if not matched:
        print(f"error: no tensor of {source} starts with {prefix!r}", file=sys.stderr)
        return 2
    for name in matched:
        tensors[name] = (tensors[name].astype("float64") * factor).astype(tensors[name].dtype)
    safetensors_np.write(target, tensors, metadata)
    print(f"{len(matched)} tensors scaled by {factor:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
