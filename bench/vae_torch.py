#!/usr/bin/python3
"""diffusers' AutoencoderKL on the CPU beside bench_vae (bench/vae.sh runs both):

    PYTHON bench/vae_torch.py save DIR            Stable Diffusion's VAE config, random
                                                  weights (seed 0), by save_pretrained
    PYTHON bench/vae_torch.py time DIR SIZE REPEATS THREADS

`time` prints seconds per image of encode (the posterior's mean) and decode, each run and the
median, fp32, torch.no_grad, THREADS intra-op threads.
"""

import statistics
import sys
import time

import safetensors.torch  # noqa: F401  (before diffusers: its save_pretrained needs it)
import torch
from diffusers import AutoencoderKL


def save(out):
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512),
                        down_block_types=["DownEncoderBlock2D"] * 4,
                        up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2,
                        sample_size=256)
    vae.save_pretrained(out, safe_serialization=True)


def time_it(folder, size, repeats, threads):
    torch.set_num_threads(threads)
    vae = AutoencoderKL.from_pretrained(folder).eval()
    x = torch.rand(1, 3, size, size) * 2 - 1
    encode, decode = [], []
    with torch.no_grad():
        for r in range(repeats):
            t0 = time.perf_counter()
            mean = vae.encode(x).latent_dist.mean
            t1 = time.perf_counter()
            vae.decode(mean)
            t2 = time.perf_counter()
            encode.append(t1 - t0)
            decode.append(t2 - t1)
            print(f"run {r}: encode {encode[-1]:.3f} s/image, decode {decode[-1]:.3f} s/image")
    print(f"diffusers {size}px batch 1: encode {statistics.median(encode):.3f} s/image, "
          f"decode {statistics.median(decode):.3f} s/image (median of {repeats})")


def main(argv):
    if len(argv) == 3 and argv[1] == "save":
        save(argv[2])
    elif len(argv) == 6 and argv[1] == "time":
        time_it(argv[2], int(argv[3]), int(argv[4]), int(argv[5]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
