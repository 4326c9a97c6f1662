#!/usr/bin/python3
"""An SD 1.5- or SDXL-shaped pipeline (random weights) and diffusers' loading times, for
bench/single_file.sh:

    PYTHON bench/single_file_torch.py make DIR TOKENIZER [sdxl]
    PYTHON bench/single_file_torch.py load DIR FILE REPEATS THREADS [sdxl]
    PYTHON bench/single_file_torch.py sample-sdxl DIR FILE OUT THREADS

PYTHON is tests/reference/diffusers_env.sh's. make: DIR gets a StableDiffusionPipeline of Stable
Diffusion 1.5's UNet, VAE and CLIP ViT-L/14 text model configs (float32, initialised from seed
0; TOKENIZER, a CLIP tokenizer folder, is its tokenizer) and the scheduler from_single_file
gives; with `sdxl`, a StableDiffusionXLPipeline of SDXL base 1.0's UNet, VAE, CLIP ViT-L and
OpenCLIP ViT-bigG text model configs, in float16 as SDXL ships (tokenizer_2 the same vocabulary
with SDXL's pad token "!"); `load` and `sample-sdxl` write FILE.yaml, the original config they
read the file with. load: seconds to from_pretrained(DIR) and to
from_single_file(FILE, original_config_file=FILE.yaml) (the text models and tokenizers passed,
as difftrain takes them from --text-encoder), medians of REPEATS, alternating. sample-sdxl:
diffusers' StableDiffusionXLPipeline.from_single_file of FILE in float32 samples one 64 px
picture (seed 0, 2 Euler steps, guidance 5, "a photo of a boat") into OUT (noise, latents,
decoded), which `difftrain sample --initial-noise OUT` repeats.
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


def make_sdxl(folder, tokenizer_dir):
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from transformers import CLIPTextModelWithProjection
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=128, cross_attention_dim=2048, attention_head_dim=(5, 10, 20),
        block_out_channels=(320, 640, 1280), transformer_layers_per_block=(1, 2, 10),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                        latent_channels=4, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, sample_size=1024,
                        scaling_factor=0.13025)
    text = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12,
                                        max_position_embeddings=77, hidden_act="quick_gelu",
                                        projection_dim=768))
    text_2 = CLIPTextModelWithProjection(CLIPTextConfig(
        hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
        max_position_embeddings=77, hidden_act="gelu", projection_dim=1280))
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012,
                                       beta_schedule="scaled_linear", steps_offset=1,
                                       timestep_spacing="leading")
    pipeline = StableDiffusionXLPipeline(
        vae=vae, text_encoder=text, text_encoder_2=text_2,
        tokenizer=CLIPTokenizer.from_pretrained(tokenizer_dir),
        tokenizer_2=CLIPTokenizer.from_pretrained(tokenizer_dir, pad_token="!"), unet=unet,
        scheduler=scheduler, add_watermarker=False)
    pipeline.to(torch.float16).save_pretrained(folder, safe_serialization=True)
    print(f"saved {folder}")
    return 0


def sdxl_original_config(path):
    """SDXL base's original config as much of it as diffusers' from_single_file reads."""
    import yaml
    unet = {"adm_in_channels": 2816, "num_classes": "sequential", "in_channels": 4,
            "out_channels": 4, "model_channels": 320, "attention_resolutions": [4, 2],
            "num_res_blocks": 2, "channel_mult": [1, 2, 4], "num_head_channels": 64,
            "use_linear_in_transformer": True, "transformer_depth": [1, 2, 10],
            "context_dim": 2048, "spatial_transformer_attn_type": "softmax-xformers"}
    ddconfig = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3,
                "out_ch": 3, "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2,
                "attn_resolutions": [], "dropout": 0.0}
    config = {"model": {"target": "sgm.models.diffusion.DiffusionEngine", "params": {
        "scale_factor": 0.13025,
        "network_config": {"target": "sgm.modules.diffusionmodules.openaimodel.UNetModel",
                           "params": unet},
        "first_stage_config": {"target": "sgm.models.autoencoder.AutoencoderKLInferenceWrapper",
                               "params": {"embed_dim": 4, "ddconfig": ddconfig}}}}}
    with open(path, "w") as f:
        yaml.safe_dump(config, f)


def from_single_file_sdxl(folder, single, dtype):
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTextModelWithProjection
    sdxl_original_config(single + ".yaml")
    return StableDiffusionXLPipeline.from_single_file(
        single, original_config_file=single + ".yaml",
        text_encoder=CLIPTextModel.from_pretrained(os.path.join(folder, "text_encoder"),
                                                   torch_dtype=dtype),
        text_encoder_2=CLIPTextModelWithProjection.from_pretrained(
            os.path.join(folder, "text_encoder_2"), torch_dtype=dtype),
        tokenizer=CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer")),
        tokenizer_2=CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer_2")),
        torch_dtype=dtype, local_files_only=True, add_watermarker=False)


def sample_sdxl(folder, single, out, threads):
    torch.set_num_threads(threads)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
    from sd_pipeline import sample
    pipeline = from_single_file_sdxl(folder, single, torch.float32)
    print(f"diffusers reads a UNet of {sum(p.numel() for p in pipeline.unet.parameters()):,} "
          f"parameters, transformer depth {pipeline.unet.config.transformer_layers_per_block}")
    return sample(pipeline, out, {"prompt": "a photo of a boat", "images": 1, "steps": 2,
                                  "guidance": 5.0, "seed": 0, "height": 64, "width": 64})


def load_sdxl(folder, single, repeats, threads):
    from diffusers import StableDiffusionXLPipeline
    torch.set_num_threads(threads)
    times = {"from_pretrained": [], "from_single_file": []}
    for _ in range(repeats):
        start = time.perf_counter()
        StableDiffusionXLPipeline.from_pretrained(folder, torch_dtype=torch.float16,
                                                  add_watermarker=False)
        times["from_pretrained"].append(time.perf_counter() - start)
        start = time.perf_counter()
        from_single_file_sdxl(folder, single, torch.float16)
        times["from_single_file"].append(time.perf_counter() - start)
    for name, t in times.items():
        print(f"diffusers {name} (float16): median {statistics.median(t):.2f} s of {t}")
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
    if len(argv) in (4, 5) and argv[1] == "make" and argv[4:] in ([], ["sdxl"]):
        return (make_sdxl if argv[4:] else make)(argv[2], argv[3])
    if len(argv) in (6, 7) and argv[1] == "load" and argv[6:] in ([], ["sdxl"]):
        return (load_sdxl if argv[6:] else load)(argv[2], argv[3], int(argv[4]), int(argv[5]))
    if len(argv) == 6 and argv[1] == "sample-sdxl":
        return sample_sdxl(argv[2], argv[3], argv[4], int(argv[5]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
