#!/usr/bin/python3
"""Brightness of generated Fashion-MNIST images beside the real ones (bench/zero_snr_learning.sh).

    bench/brightness.py SAMPLES.safetensors [SAMPLES.safetensors ...]

Each image's brightness is its mean pixel in [-1, 1] (black -1). For the real training images
(Debian's Fashion-MNIST, /usr/share/datasets/fashion-mnist) and for each samples file
(`difftrain sample --raw`: "images" [N, 1, 32, 32] in [-1, 1], "labels" [N]): the mean
brightness, its spread over the images (standard deviation), the darkest and brightest 5 %
(percentiles), and the mean absolute gap between each class's mean and the real class mean.
Real images are 28x28, padded to 32x32 with black as difftrain's loader pads them.
"""
import gzip
import json
import struct
import sys

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"


def real():
    with gzip.open(f"{DATA}/train-images-idx3-ubyte.gz") as f:
        _, n, h, w = struct.unpack(">IIII", f.read(16))
        images = np.frombuffer(f.read(), np.uint8).reshape(n, h, w).astype(np.float64)
    with gzip.open(f"{DATA}/train-labels-idx1-ubyte.gz") as f:
        f.read(8)
        labels = np.frombuffer(f.read(), np.uint8).astype(np.int64)
    pixels = images / 127.5 - 1
    # 28x28 inside a black 32x32 frame: the mean over 1024 pixels.
    brightness = (pixels.sum(axis=(1, 2)) - (32 * 32 - h * w)) / (32 * 32)
    return brightness, labels


def samples(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()

    def tensor(name, dtype):
        begin, end = header[name]["data_offsets"]
        return np.frombuffer(data[begin:end], dtype).reshape(header[name]["shape"])

    images = tensor("images", np.float32).astype(np.float64)
    labels = tensor("labels", np.int64)
    return images.reshape(images.shape[0], -1).mean(axis=1), labels


def row(name, b, labels, class_means):
    gap = np.mean([abs(b[labels == c].mean() - class_means[c]) for c in class_means
                   if (labels == c).any()])
    p5, p95 = np.percentile(b, [5, 95])
    return (f"| {name} | {b.mean():+.3f} | {b.std():.3f} | {p5:+.3f} | {p95:+.3f} | "
            f"{gap:.3f} |")


def main(paths):
    rb, rl = real()
    class_means = {c: rb[rl == c].mean() for c in range(10)}
    print("| images | mean brightness | spread (std) | 5th pct | 95th pct | class-mean gap |")
    print("|---|---|---|---|---|---|")
    print(row("real (60k training)", rb, rl, class_means))
    for path in paths:
        b, labels = samples(path)
        print(row(path, b, labels, class_means))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
