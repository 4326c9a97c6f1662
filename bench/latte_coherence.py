#!/usr/bin/python3
"""How much a trained Latte uses the time axis: its denoising error on real videos, on the
same videos with their frames in a random order, and on "videos" whose frames come from
different videos of the same class.

A model that has learned motion denoises a real video better than the same frames
shuffled (the order tells it where the garment goes next); one that has learned that a video
shows one garment denoises a real video better than frames of several garments. The
difference at high noise is what sampling has to go on when it decides a video's path.

    difftrain data pack --dataset moving_fashion_mnist --split test --image-size 24 \
        --frames 8 --limit 256 --out runs/real-videos
    bench/latte_coherence.py runs/latte-moving-fashion/checkpoints/step-00007000 \
        runs/real-videos [--videos 128] [--timesteps 200,400,600,800,950] [--raw-weights]

With --denoise-from T1,T2,..., it then noises the same real videos to each timestep T and
denoises them with the model (DDIM over the 25-step spacing's timesteps up to T, guidance
--cfg), the path fixed by the real video, and scores the result with `difftrain eval video`
(build/difftrain): how far the denoiser alone, at noise levels below T, moves a garment
off its track and changes it between frames.

Prints, per timestep, the mean squared error of the model's x0 prediction (whatever the
job's prediction target) for each of the three inputs, all noised with the same noise.
Runs the checkpoint's EMA weights (--raw-weights: the trained ones) in the independent
PyTorch Latte of tests/reference (float32, Debian's torch), so it also checks that a
checkpoint loads by name into the reference model. Needs a one-rank checkpoint.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import diffusion_torch  # noqa: E402
import latte_torch  # noqa: E402
import safetensors_np  # noqa: E402


def load_model(checkpoint, ema):
    shards = sorted(glob.glob(os.path.join(checkpoint, "shard-*.safetensors")))
    if len(shards) != 1:
        sys.exit(f"{checkpoint}: needs a one-rank checkpoint (one shard), found {len(shards)}")
    tensors, meta = safetensors_np.read(shards[0])
    config = json.loads(meta["config"])
    if config.pop("name") != "latte":
        sys.exit(f"{checkpoint}: not a Latte checkpoint")
    train = json.loads(meta["train"])
    model = latte_torch.Latte(latte_torch.LatteConfig(**config))
    state = {}
    for name, ref in model.state_dict().items():
        key = "ema." + name if ema and "ema." + name in tensors else name
        if key not in tensors:
            sys.exit(f"{checkpoint}: no tensor {key}")
        state[name] = torch.from_numpy(np.array(tensors[key], dtype=np.float32)).reshape(ref.shape)
    model.load_state_dict(state)
    model.eval()
    return model, train["diffusion"], int(meta["step"])


def load_videos(folder, count):
    shards = sorted(glob.glob(os.path.join(folder, "shard-*.safetensors")))
    if not shards:
        sys.exit(f"{folder}: no latent folder shards (difftrain data pack writes them)")
    videos, labels = [], []
    for shard in shards:
        tensors, _ = safetensors_np.read(shard)
        videos.append(tensors["latents"])
        labels.append(tensors["labels"])
    return (torch.from_numpy(np.concatenate(videos)[:count].astype(np.float32)),
            torch.from_numpy(np.concatenate(labels)[:count].astype(np.int64)))


def alphas_bar(diffusion):
    if diffusion["schedule"] == "cosine":
        betas = diffusion_torch.cosine_betas(diffusion["steps"])
    else:
        betas = diffusion_torch.linear_betas(diffusion["steps"], diffusion["beta_start"],
                                             diffusion["beta_end"])
    return np.cumprod(1 - betas)


def predicted_x0(diffusion, a, x_t, out):
    """The model's x0 from its output at a timestep of alpha-bar `a`, clipped to [-1, 1]."""
    if diffusion.get("prediction", "epsilon") == "v":
        return (a ** 0.5 * x_t - (1 - a) ** 0.5 * out).clamp(-1, 1)
    return ((x_t - (1 - a) ** 0.5 * out) / a ** 0.5).clamp(-1, 1)


def x0_error(model, diffusion, abar, x0, y, t, noise):
    a = float(abar[t])
    x_t = a ** 0.5 * x0 + (1 - a) ** 0.5 * noise
    with torch.no_grad():
        out = model(x_t, torch.full((x0.shape[0],), float(t)), y)[:, :, :x0.shape[2]]
    return float(((predicted_x0(diffusion, a, x_t, out) - x0) ** 2).mean())


def denoise_from(model, diffusion, abar, x0, y, start, cfg, generator):
    """DDIM (eta 0) from x0 noised to timestep `start` down to 0, over the timesteps of DiT's
    25-step spacing that are at most `start`, with classifier-free guidance `cfg`."""
    T = diffusion["steps"]
    kept = [t for t in sorted({round(i * (T - 1) / 24) for i in range(25)}, reverse=True)
            if t <= start]
    a = float(abar[kept[0]])
    x = a ** 0.5 * x0 + (1 - a) ** 0.5 * torch.randn(x0.shape, generator=generator)
    null = torch.full_like(y, model.cfg.num_classes)
    for k, t in enumerate(kept):
        a = float(abar[t])
        a_next = float(abar[kept[k + 1]]) if k + 1 < len(kept) else 1.0
        step = torch.full((x.shape[0],), float(t))
        with torch.no_grad():
            out = model(x, step, y)[:, :, :x0.shape[2]]
            if cfg != 1:
                uncond = model(x, step, null)[:, :, :x0.shape[2]]
                out = uncond + cfg * (out - uncond)
        pred = predicted_x0(diffusion, a, x, out)
        eps = (x - a ** 0.5 * pred) / (1 - a) ** 0.5
        x = a_next ** 0.5 * pred + (1 - a_next) ** 0.5 * eps
    return x.clamp(-1, 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("videos", help="a latent folder of real videos (difftrain data pack)")
    parser.add_argument("--videos", dest="count", type=int, default=128)
    parser.add_argument("--timesteps", default="200,400,600,800,950")
    parser.add_argument("--raw-weights", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--denoise-from", default="", help="timesteps, e.g. 300,500")
    parser.add_argument("--cfg", type=float, default=1.0, help="guidance of --denoise-from")
    parser.add_argument("--out", default="runs/latte-coherence",
                        help="prefix of --denoise-from's video files")
    args = parser.parse_args()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))

    model, diffusion, step = load_model(args.checkpoint, ema=not args.raw_weights)
    x0, y = load_videos(args.videos, args.count)
    n, frames = x0.shape[:2]
    if frames != model.cfg.num_frames:
        sys.exit(f"the videos have {frames} frames, the model {model.cfg.num_frames}")
    g = torch.Generator().manual_seed(args.seed)
    shuffled = torch.stack([x0[i, torch.randperm(frames, generator=g)] for i in range(n)])
    mixed = x0.clone()  # frame f of video i from a random video of i's class
    for i in range(n):
        same = torch.nonzero(y == y[i]).flatten()
        for f in range(frames):
            mixed[i, f] = x0[same[torch.randint(len(same), (1,), generator=g)], f]
    noise = torch.randn(x0.shape, generator=g)
    abar = alphas_bar(diffusion)

    print(f"{args.checkpoint}: step {step}, {diffusion['schedule']} schedule, "
          f"{diffusion.get('prediction', 'epsilon')} prediction; {n} real videos")
    print("x0 mean squared error  timestep  real videos  frames shuffled  frames of other videos")
    for t in [int(s) for s in args.timesteps.split(",")]:
        errors = [x0_error(model, diffusion, abar, v, y, t, noise) for v in (x0, shuffled, mixed)]
        print(f"{'':22}  {t:8}  {errors[0]:11.4f}  {errors[1]:15.4f}  {errors[2]:22.4f}")

    difftrain = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                             "difftrain")
    classifier = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "eval",
                              "fashion_mnist_classifier.safetensors")
    for start in [int(s) for s in args.denoise_from.split(",") if s]:
        videos = denoise_from(model, diffusion, abar, x0, y, start, args.cfg, g)
        path = f"{args.out}-from-{start}.safetensors"
        safetensors_np.write(path, {"images": videos.numpy().astype(np.float32),
                                    "labels": y.numpy().astype(np.int64)})
        scored = subprocess.run([difftrain, "eval", "video", "--classifier", classifier,
                                 "--samples", path], capture_output=True, text=True, check=True)
        summary = [line for line in scored.stdout.splitlines()
                   if line.startswith(("frame accuracy", "track residual", "agreement"))]
        print(f"denoised from timestep {start} (guidance {args.cfg:g}), {path}:")
        print("\n".join("  " + line for line in summary))


if __name__ == "__main__":
    main()
