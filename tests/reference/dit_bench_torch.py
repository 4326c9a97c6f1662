#!/usr/bin/python3
"""PyTorch baseline for difftrain's training-step benchmark: times a DiT training step the
way users run it in PyTorch, on the same GPU as the C++ trainer, and prints the results.

    python3 tests/reference/dit_bench_torch.py [--model DiT-XL/2] [--mode eager|compile]
        [--micro-batches 32,64,128,256] [--json PATH] ...

What is timed, per micro-batch size B (each with a freshly built model and optimizer):
one training step of the reference model of dit_torch.py, its attention computed by
torch.nn.functional.scaled_dot_product_attention (flash / memory-efficient kernels on
CUDA, as timm's fused attention runs it in DiT), in eager mode or under torch.compile:
  - x_t = q_sample(x0, noise, t) with t uniform over DiT's 1000 linear-schedule steps,
    noise drawn on the device each step, labels dropped to the null class with DiT's
    probability; x0 and labels are random and made once on the device (no data loader);
  - forward under bf16 autocast with fp32 master weights (fp32 without autocast by
    --dtype fp32, the default on the CPU);
  - loss = ε-MSE on the first C output channels (see LOSS), backward,
    clip_grad_norm_(1.0), AdamW (fused on CUDA; lr 1e-4, no weight decay as in DiT),
    zero_grad(set_to_none=True);
  - the EMA of the weights (decay 0.9999), updated after every step as DiT's train.py does
    and difftrain's step does, with one multi-tensor lerp over the parameters (--no-ema
    leaves it out).
After warm-up (more of it under torch.compile, whose first steps compile), every step is
timed with CUDA events (wall clock on the CPU); a row reports the median step time,
samples/s = B / median, TFLOP/s = B * training FLOPs per sample / median, MFU against
--peak-tflops, and the peak memory allocated. Training FLOPs per sample are 3 x the forward
FLOPs of ../shared/REFERENCE.md's count (2 FLOPs per multiply-accumulate). An out-of-memory
at one B is reported as an "OOM" row and the sweep goes on.

Output: a header (lines starting with '#') and one line per B on stdout; with --json, a list
of objects {model, mode, micro_batch, status, step_ms_median, samples_per_s, tflops, mfu,
peak_mem_gib, steps, device, dtype, loss, ema, torch_version, gpu_name} (null where not
applicable; status "ok" or "OOM").

Needs PyTorch >= 2.1 (scaled_dot_product_attention with scale=) and, through dit_torch.py,
numpy.
"""

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import dit_torch  # noqa: E402
except ModuleNotFoundError as error:
    if error.name != "numpy":
        raise
    sys.exit("dit_bench_torch.py: dit_torch.py needs numpy to build the model: pip install numpy")

NUM_TIMESTEPS = 1000
LEARNING_RATE = 1e-4
EMA_DECAY = 0.9999  # DiT's train.py, and difftrain's train.ema_decay default
COMPILE_EXTRA_WARMUP = 3
DIT_XL2_256PX_TRAIN_GFLOP = 712  # ../shared/REFERENCE.md
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class SDPAAttention(dit_torch.Attention):
    """dit_torch.Attention (same parameters, same head split) with the attention product
    computed by scaled_dot_product_attention instead of an explicit softmax(QK^T)V."""

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, head_dim]
        x = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class DeviceTimestepEmbedder(dit_torch.TimestepEmbedder):
    """dit_torch.TimestepEmbedder with the sinusoidal embedding computed on t's device in
    float32, as DiT computes it (dit_torch.py builds it in float64 on the CPU, which a CUDA
    model cannot take)."""

    def forward(self, t):
        half = dit_torch.FREQUENCY_EMBEDDING_SIZE // 2
        freqs = torch.exp(-math.log(10000) / half
                          * torch.arange(half, dtype=torch.float32, device=t.device))
        args = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


def build_model(cfg, device):
    """dit_torch's DiT with SDPA attention and an on-device timestep embedding; the classes
    are swapped in place, so parameter names and initialisation are dit_torch's."""
    model = dit_torch.DiT(cfg, device=device)
    for block in model.blocks:
        block.attn.__class__ = SDPAAttention
    model.t_embedder.__class__ = DeviceTimestepEmbedder
    return model.train()


def forward_macs_per_sample(cfg):
    """Forward multiply-accumulates per sample, counted as ../shared/REFERENCE.md counts
    them: per block 12·D²·T + 2·T²·D + 6·D² (for mlp_ratio 4), plus the patch and timestep
    embedders and the final layer; label lookups, norms and activations are not counted."""
    D, T = cfg.hidden_size, cfg.num_patches
    mlp_hidden = int(D * cfg.mlp_ratio)
    pixels_per_patch = cfg.patch_size ** 2
    block = (4 * D * D + 2 * D * mlp_hidden) * T + 2 * T * T * D + 6 * D * D
    patch_embed = T * D * pixels_per_patch * cfg.in_channels
    timestep_embed = dit_torch.FREQUENCY_EMBEDDING_SIZE * D + D * D
    final_layer = 2 * D * D + T * D * pixels_per_patch * cfg.out_channels
    return cfg.depth * block + patch_embed + timestep_embed + final_layer


def train_flop_per_sample(cfg):
    """Training FLOPs per sample: forward + backward = 3 x forward, 2 FLOPs per MAC."""
    return 3 * 2 * forward_macs_per_sample(cfg)


def loss_description(cfg):
    if not cfg.learn_sigma:
        return "eps-MSE"
    # diffusion_torch.py's full objective (with the VB term) works in float64 from numpy
    # tables on the CPU, so it is not a cheap on-device loss; the variance channels go
    # untrained here, but the model still computes all of them.
    return f"eps-MSE on the first {cfg.in_channels} of {cfg.out_channels} channels (no VB term)"


def make_train_step(model, forward, micro_batch, cfg, device, bf16, ema):
    """A closure running one training step on random latents made once on the device."""
    x0 = torch.randn(micro_batch, cfg.in_channels, cfg.input_size, cfg.input_size, device=device)
    labels = torch.randint(0, cfg.num_classes, (micro_batch,), device=device)
    betas = torch.as_tensor(dit_torch.linear_beta_schedule(NUM_TIMESTEPS), device=device)
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0,
                                  fused=device.type == "cuda")
    params = list(model.parameters())
    ema_params = [p.detach().clone() for p in params] if ema else None

    def step():
        t = torch.randint(0, NUM_TIMESTEPS, (micro_batch,), device=device)
        noise = torch.randn_like(x0)
        a = alphas_cumprod[t].view(-1, 1, 1, 1)
        x_t = a.sqrt() * x0 + (1.0 - a).sqrt() * noise
        dropped = torch.rand(micro_batch, device=device) < cfg.class_dropout_prob
        y = torch.where(dropped, cfg.num_classes, labels)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            output = forward(x_t, t, y)
        loss = dit_torch.epsilon_mse_loss(output, noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ema_params is not None:
            with torch.no_grad():
                update_ema(ema_params, params)

    return step


def update_ema(ema_params, params):
    """ema ← decay·ema + (1 − decay)·param over every tensor, in multi-tensor kernels."""
    if hasattr(torch, "_foreach_lerp_"):
        torch._foreach_lerp_(ema_params, params, 1.0 - EMA_DECAY)
    else:
        torch._foreach_mul_(ema_params, EMA_DECAY)
        torch._foreach_add_(ema_params, params, alpha=1.0 - EMA_DECAY)


def time_steps(step, steps, device):
    """Runs `steps` steps and returns each one's time in ms."""
    if device.type != "cuda":
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    torch.cuda.synchronize(device)
    for start, end in zip(starts, ends):
        start.record()
        step()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def benchmark_micro_batch(args, cfg, micro_batch, device):
    """Builds a fresh model and optimizer, warms up, and returns the timed steps' times (ms)."""
    torch.manual_seed(0)
    model = build_model(cfg, device)
    forward = model
    warmup = args.warmup
    if args.mode == "compile":
        forward = torch.compile(model, mode=args.compile_mode, dynamic=False)
        warmup += COMPILE_EXTRA_WARMUP
    step = make_train_step(model, forward, micro_batch, cfg, device, args.dtype == "bf16",
                           ema=not args.no_ema)
    for _ in range(warmup):
        step()
    return time_steps(step, args.steps, device)


def release_memory(args, device):
    if args.mode == "compile":
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_row(args, cfg, micro_batch, device):
    """One result row for micro-batch size `micro_batch`; an out-of-memory makes an OOM row."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        times = benchmark_micro_batch(args, cfg, micro_batch, device)
    except torch.cuda.OutOfMemoryError:
        times = None
    peak_mem_gib = None
    if device.type == "cuda" and times is not None:
        peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2 ** 30
    release_memory(args, device)
    return make_row(args, cfg, micro_batch, device, times, peak_mem_gib)


def make_row(args, cfg, micro_batch, device, times, peak_mem_gib):
    row = {
        "model": args.model,
        "mode": args.mode if args.compile_mode in (None, "default") else f"compile:{args.compile_mode}",
        "micro_batch": micro_batch,
        "status": "OOM" if times is None else "ok",
        "step_ms_median": None, "samples_per_s": None, "tflops": None, "mfu": None,
        "peak_mem_gib": peak_mem_gib,
        "steps": args.steps,
        "device": device.type,
        "dtype": args.dtype,
        "loss": loss_description(cfg),
        "ema": not args.no_ema,
        "torch_version": torch.__version__,
        "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    if times is not None:
        median_ms = statistics.median(times)
        row["step_ms_median"] = median_ms
        row["samples_per_s"] = micro_batch / (median_ms / 1e3)
        row["tflops"] = micro_batch * train_flop_per_sample(cfg) / (median_ms / 1e3) / 1e12
        if device.type == "cuda":
            row["mfu"] = row["tflops"] / args.peak_tflops
    return row


def format_row(row):
    head = f"{row['model']} {row['mode']} B={row['micro_batch']}:"
    if row["status"] == "OOM":
        return f"{head} OOM"
    line = (f"{head} {row['step_ms_median']:.2f} ms/step  {row['samples_per_s']:.1f} samples/s  "
            f"{row['tflops']:.2f} TFLOP/s")
    if row["mfu"] is not None:
        line += f"  MFU {100 * row['mfu']:.1f}%"
    if row["peak_mem_gib"] is not None:
        line += f"  peak {row['peak_mem_gib']:.2f} GiB"
    return line


def model_config(args):
    cfg = dataclasses.replace(dit_torch.DIT_CONFIGS[args.model], input_size=args.input_size)
    if args.model == "DiT-XL/2" and args.input_size == 32:
        gflop = train_flop_per_sample(cfg) / 1e9
        assert round(gflop) == DIT_XL2_256PX_TRAIN_GFLOP, f"DiT-XL/2 at 256 px: {gflop} GFLOP/sample"
    return cfg


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="DiT-XL/2", choices=sorted(dit_torch.DIT_CONFIGS),
                        help="DiT configuration (default DiT-XL/2)")
    parser.add_argument("--input-size", type=int, default=32,
                        help="latent side length (32 = 256 px images; default 32)")
    parser.add_argument("--mode", default="eager", choices=["eager", "compile"],
                        help="run the model eagerly or under torch.compile (default eager)")
    parser.add_argument("--compile-mode", choices=COMPILE_MODES,
                        help="torch.compile mode, with --mode compile (default: torch's default)")
    parser.add_argument("--micro-batches", default="32,64,128,256",
                        help="comma-separated micro-batch sizes to sweep (default 32,64,128,256)")
    parser.add_argument("--warmup", type=int, default=5,
                        help=f"untimed steps before timing (default 5; --mode compile adds "
                             f"{COMPILE_EXTRA_WARMUP})")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="default cuda")
    parser.add_argument("--dtype", choices=["bf16", "fp32"],
                        help="bf16: autocast over fp32 weights; fp32: no autocast "
                             "(default bf16 on cuda, fp32 on cpu)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the GPU's peak TFLOP/s for MFU (default 989, H100 SXM dense bf16)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows to PATH as JSON")
    parser.add_argument("--no-ema", action="store_true",
                        help="leave out the EMA update (difftrain's step always makes it)")
    args = parser.parse_args()
    args.micro_batches = [int(b) for b in args.micro_batches.split(",")]
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    if args.compile_mode is not None and args.mode != "compile":
        parser.error("--compile-mode needs --mode compile")
    if args.steps < 1 or args.warmup < 0 or min(args.micro_batches) < 1:
        parser.error("--steps and the micro-batch sizes must be positive, --warmup not negative")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available in this PyTorch; use --device cpu")
    if not hasattr(F, "scaled_dot_product_attention"):
        parser.error(f"PyTorch {torch.__version__} has no scaled_dot_product_attention; needs >= 2.1")
    if args.mode == "compile" and not hasattr(torch, "compile"):
        parser.error(f"PyTorch {torch.__version__} has no torch.compile; use --mode eager")
    return args


def main():
    args = parse_args()
    cfg = model_config(args)
    device = torch.device(args.device)
    print(f"# {args.model} at {8 * cfg.input_size} px, {args.mode}, {args.dtype}, "
          f"torch {torch.__version__} on "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    print(f"# training FLOPs per sample {train_flop_per_sample(cfg) / 1e9:.2f} GFLOP; "
          f"loss: {loss_description(cfg)}", flush=True)
    rows = []
    for micro_batch in args.micro_batches:
        rows.append(run_row(args, cfg, micro_batch, device))
        print(format_row(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
