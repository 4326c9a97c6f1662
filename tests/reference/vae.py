#!/usr/bin/python3
"""diffusers' AutoencoderKL as the reference of difftrain's VAE (model/vae/vae.h):

    PYTHON tests/reference/vae.py make DIR CONFIG_JSON SEED

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2).
Builds AutoencoderKL(**CONFIG_JSON), moves every parameter by 0.1 * N(0, 1) from its own
initialisation (the GroupNorms start at weight 1, bias 0, where a swapped tensor would not
show), and writes
  DIR/vae/       the model by save_pretrained (config.json, float32 safetensors)
  DIR/old/       the same weights under diffusers' older names of the mid blocks' attention
                 (query, key, value, proj_attn), as older hub checkpoints have them
  DIR/expected.safetensors
      images   [2, C, H, W] uniform in [-1, 1] (H = W = 4 * downscale)
      mean, logvar   vae.encode(images).latent_dist's, computed in float64
      latents  [2, latent, h, w] N(0, 1): scaled latents as the models make them
      decoded  vae.decode(latents / scaling_factor).sample, in float64
Exit status: 0, or 2 for bad usage.
"""

import json
import os
import sys

import safetensors.torch  # noqa: F401  (before diffusers: its save_pretrained needs it)
import torch
from diffusers import AutoencoderKL
from safetensors.torch import load_file, save_file

RENAMED = {"to_q.": "query.", "to_k.": "key.", "to_v.": "value.", "to_out.0.": "proj_attn."}


def old_name(name):
    marker = ".attentions.0."
    if marker not in name:
        return name
    head, tail = name.split(marker, 1)
    for now, before in RENAMED.items():
        if tail.startswith(now):
            return head + marker + before + tail[len(now):]
    return name


def make(out, config, seed):
    torch.manual_seed(seed)
    vae = AutoencoderKL(**config)
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(0.1 * torch.randn_like(p))
    vae.save_pretrained(os.path.join(out, "vae"), safe_serialization=True)

    os.makedirs(os.path.join(out, "old"), exist_ok=True)
    weights = load_file(os.path.join(out, "vae", "diffusion_pytorch_model.safetensors"))
    save_file({old_name(k): v for k, v in weights.items()},
              os.path.join(out, "old", "diffusion_pytorch_model.safetensors"))
    with open(os.path.join(out, "vae", "config.json")) as f:
        saved_config = f.read()
    with open(os.path.join(out, "old", "config.json"), "w") as f:
        f.write(saved_config)

    vae = vae.double().eval()
    down = 2 ** (len(vae.config.block_out_channels) - 1)
    size = 4 * down
    images = (torch.rand(2, vae.config.in_channels, size, size) * 2 - 1).float()
    latents = torch.randn(2, vae.config.latent_channels, 4, 4).float()
    with torch.no_grad():
        posterior = vae.encode(images.double()).latent_dist
        decoded = vae.decode(latents.double() / vae.config.scaling_factor).sample
    save_file({"images": images, "mean": posterior.mean.float().contiguous(),
               "logvar": posterior.logvar.float().contiguous(), "latents": latents,
               "decoded": decoded.float().contiguous()},
              os.path.join(out, "expected.safetensors"))


def main(argv):
    if len(argv) != 5 or argv[1] != "make":
        print(__doc__, file=sys.stderr)
        return 2
    make(argv[2], json.loads(argv[3]), int(argv[4]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
