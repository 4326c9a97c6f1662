#!/usr/bin/python3
"""An SD 1.5-shaped pipeline (random weights) and diffusers' loading times, for
bench/single_file.sh:

    PYTHON bench/single_file_torch.py make DIR TOKENIZER
    PYTHON bench/single_file_torch.py load DIR FILE REPEATS THREADS

PYTHON is tests/reference/diffusers_env.sh's. make: DIR gets a StableDiffusionPipeline of Stable
Diffusion 1.5's UNet, VAE and CLIP ViT-L/14 text model configs (float32, initialised from seed
0; TOKENIZER, a CLIP tokenizer folder, is its tokenizer) and the scheduler from_single_file
gives. load: seconds to StableDiffusionPipeline.from_pretrained(DIR) and to
from_single_file(FILE, original_config_file=FILE.yaml) (the text model and tokenizer passed,
as difftrain takes them from --text-encoder), medians of REPEATS, alternating.
"""

import os
import shutil
import statistics
import sys
import time

import safetensors.torch  # noqa: F401
import torch
from diffusers import (AutoencoderKL, DDIMScheduler, StableDiffusionPipeline,
                       UNet2DConditionModel)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer


def make(folder, tokenizer_dir):
    torch.manual_seed(0)
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                        latent_channels=4, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, sample_size=512)
    text = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12,
                                        max_position_embeddings=77, hidden_act="quick_gelu",
                                        projection_dim=768))
    tokenizer = CLIPTokenizer.from_pretrained(tokenizer_dir)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    pipeline = StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tokenizer, unet=unet,
                                       scheduler=scheduler, safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
    pipeline.save_pretrained(folder, safe_serialization=True)
    print(f"saved {folder}")
    return 0


def load(folder, single, repeats, threads):
    torch.set_num_threads(threads)
    text = CLIPTextModel.from_pretrained(os.path.join(folder, "text_encoder"))
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer"))
    times = {"from_pretrained": [], "from_single_file": []}
    for _ in range(repeats):
        start = time.perf_counter()
        StableDiffusionPipeline.from_pretrained(folder, safety_checker=None,
                                                requires_safety_checker=False)
        times["from_pretrained"].append(time.perf_counter() - start)
        start = time.perf_counter()
        StableDiffusionPipeline.from_single_file(single, original_config_file=single + ".yaml",
                                                 text_encoder=text, tokenizer=tokenizer,
                                                 local_files_only=True)
        times["from_single_file"].append(time.perf_counter() - start)
    for name, t in times.items():
        print(f"diffusers {name}: median {statistics.median(t):.2f} s of {t}")
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "make":
        return make(argv[2], argv[3])
    if len(argv) == 6 and argv[1] == "load":
        return load(argv[2], argv[3], int(argv[4]), int(argv[5]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
