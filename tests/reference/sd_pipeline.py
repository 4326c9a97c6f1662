#!/usr/bin/python3
"""diffusers' StableDiffusionPipeline as the reference of `difftrain sample --pretrained
PIPELINE` (launch/sample_command.cc):

    PYTHON tests/reference/sd_pipeline.py make DIR SEED \
        [sd|lcm|ldm1|ldm2|inpaint|sdxl|ldmxl|refiner|ldmxl_refiner]
    PYTHON tests/reference/sd_pipeline.py run DIR OUT.safetensors SETTINGS_JSON

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2 with
transformers 4.40.2).

make: DIR/text_encoder and DIR/tokenizer hold a CLIP text model and its tokenizer
(tests/reference/text_encoder.py sd); builds a small UNet2DConditionModel (cross-attention of
the text model's width) and AutoencoderKL, every parameter moved by 0.1 * N(0, 1) from its
own initialisation, and a DDIMScheduler as Stable Diffusion 2's 768 px pipeline configures it
(scaled_linear 0.00085 to 0.012, v_prediction, leading with steps_offset 1, set_alpha_to_one
false), and writes the whole pipeline into DIR by StableDiffusionPipeline.save_pretrained.
With `lcm`, a LatentConsistencyModelPipeline instead: the UNet guidance-distilled in shape
(time_cond_proj_dim 8), an LCMScheduler (scaled_linear, epsilon, 50 original steps). With
`ldm1` or `ldm2`, one an original Stable Diffusion checkpoint can hold (ldm_checkpoint.py):
GroupNorm of 32 in the UNet (channels 32, 64; 8 heads, SD 1.x's convolutional projections) or
(`ldm2`: channels 64, 128, heads of 64 channels, SD 2.x's linear projections) and the VAE
(channels 32, 64), and the scheduler diffusers' from_single_file gives one (DDIM, epsilon,
leading, steps_offset 1, set_alpha_to_one false). With `inpaint`, the UNet an inpainting
pipeline has: 9 input channels (the latents, the mask and the masked image's latents), 4 out.
With `sdxl`, a StableDiffusionXLPipeline: DIR holds its text half (text_encoder.py sdxl); a UNet
of SDXL's kind (transformers of 1 and 2 blocks, the text_time micro-conditioning), a VAE
(scaling_factor 0.13025, SDXL's) and SDXL's EulerDiscreteScheduler (leading, steps_offset 1);
`ldmxl` the same as an original SDXL checkpoint can hold it (GroupNorm of 32, UNet channels 64,
128 in heads of 64 channels, VAE channels 32, 64). `refiner`: SDXL's refiner, a
StableDiffusionXLImg2ImgPipeline of text_encoder_2 alone, a UNet of five time ids (the aesthetic
score, requires_aesthetics_score) and force_zeros_for_empty_prompt false; `ldmxl_refiner` the
refiner as an original checkpoint can hold it, shaped as SDXL's refiner is (channels 64, 128,
128, attention at the middle level only, transformers of 2 blocks in it and the mid block).

run: SETTINGS_JSON holds prompt, negative_prompt (null: none), steps, guidance, spacing (null:
the scheduler's), scheduler ("ddim", "ddpm", "pndm", "euler", "euler_ancestral", "heun", "lms",
"kdpm2", "dpmsolver", "dpmsolver_singlestep", "dpmsolver_sde", "deis", "unipc" or "tcd"), karras
(optional: use_karras_sigmas), clip_sample (optional: the scheduler's, set), guidance_rescale
(optional, default 0), eta (optional, default 0: the pipeline's, DDIM's η or TCD's γ), lora and
lora_scale (optional: lists of LoRA files and their scales, fused into the UNet and the text
encoder in turn as tests/reference/lora.py fuses them), step_noise (optional: a safetensors file
whose "noise" [steps, 1, images, 4, h, w] EulerAncestralDiscreteScheduler.step (DDPM's, TCD's)
draws in place of its own, or [steps, 2, images, 4, h, w], the two draws a step from which
DPMSolverSDEScheduler's Brownian increments are made, step_brownian.py) and images; the pipeline
is called with latents N(0, 1) [images, 4, h, w] (seeded) and output_type "latent", with its
scheduler swapped for DDIMScheduler.from_config(config, timestep_spacing=spacing),
DDPMScheduler's, PNDMScheduler's with skip_prk_steps (as SD 1.x's pipelines configure it), or
EulerDiscreteScheduler's, EulerAncestralDiscreteScheduler's, HeunDiscreteScheduler's,
LMSDiscreteScheduler's, KDPM2DiscreteScheduler's, DPMSolverMultistepScheduler's,
DPMSolverSinglestepScheduler's, DPMSolverSDEScheduler's, DEISMultistepScheduler's,
UniPCMultistepScheduler's or TCDScheduler's (a TCD step's noise the step_noise). OUT:
  noise    the latents x_T it started from
  latents  the final latents
  decoded  vae.decode(latents / scaling_factor).sample, as the pipeline decodes them
An LCM pipeline runs as LatentConsistencyModelPipeline (its LCMScheduler, guidance embedded,
no negative prompt), with the optional original_inference_steps of SETTINGS_JSON; its step noise
[steps, 1, images, 4, h, w] is what LCMScheduler.step draws.
Image to image: with "image" (a safetensors file whose "images" [1 or images, 4, h, w] are
latents, which the pipelines take as they are) and "strength" in SETTINGS_JSON, the pipeline
runs as StableDiffusionImg2ImgPipeline (an LCM one as LatentConsistencyModelImg2ImgPipeline, an
SDXL one as StableDiffusionXLImg2ImgPipeline) of
the same components, the noise its prepare_latents adds to the image the seeded N(0, 1) that
OUT's "noise" holds.
With "height" and "width" (pixels), the pipeline samples at that size; an SDXL pipeline takes
"original_size", "crops_coords_top_left" and "target_size" too, SDXL's refiner (which runs as
it is, an image pipeline) "aesthetic_score" and "negative_aesthetic_score", and either
"denoising_end" (the base, its latents left noisy there) or "denoising_start" (the refiner, its
image those latents, taken as they are). With
"textual_inversion" (a list of [file, token or null]), each is loaded first by the pipeline's
load_textual_inversion (an SDXL pipeline's: the file's clip_l into text_encoder, clip_g into
text_encoder_2, each with its tokenizer).
Inpainting: with "mask" (a picture) besides "image" and "strength", the pipeline runs as
StableDiffusionInpaintPipeline (an SDXL one as StableDiffusionXLInpaintPipeline), its
masked_image_latents the image file's tensor of that name
(else, for a 4-channel UNet, which does not read them, its images), the noise its prepare_latents
draws OUT's "noise".
Exit status: 0, or 2 for bad usage.
"""

import json
import os
import shutil
import sys

import safetensors.torch  # noqa: F401  (before diffusers: its save_pretrained needs it)
import torch
from diffusers import (AutoencoderKL, DDIMScheduler, DDPMScheduler, DEISMultistepScheduler,
                       DPMSolverMultistepScheduler,
                       DPMSolverSinglestepScheduler,
                       EulerAncestralDiscreteScheduler, EulerDiscreteScheduler,
                       HeunDiscreteScheduler, KDPM2DiscreteScheduler,
                       LatentConsistencyModelImg2ImgPipeline,
                       LatentConsistencyModelPipeline, LCMScheduler, LMSDiscreteScheduler,
                       PNDMScheduler, StableDiffusionImg2ImgPipeline,
                       StableDiffusionInpaintPipeline, StableDiffusionPipeline,
                       StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline,
                       StableDiffusionXLPipeline,
                       TCDScheduler, UNet2DConditionModel, UniPCMultistepScheduler)
from lora import fuse_into, fuse_text_encoder
from step_brownian import StepBrownian, dpm_solver_sde_module
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer


def perturbed(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def make_sdxl(folder, seed, original=False, refiner=False):
    """StableDiffusionXLPipeline: its text half already in FOLDER (text_encoder.py sdxl), a UNet
    of SDXL's kind (a plain first level, transformers of 2 blocks, linear projections, the
    text_time micro-conditioning), a VAE as the others', and SDXL's EulerDiscreteScheduler.
    `original`: GroupNorm of 32 and heads of 64 channels, as an original checkpoint's.
    `refiner`: a StableDiffusionXLImg2ImgPipeline as SDXL's refiner is: text_encoder_2 alone
    (text_encoder/ and tokenizer/ removed), a UNet attending to its width with five time ids
    (requires_aesthetics_score), the empty prompt's embedding unforced to zeros."""
    text_encoder = CLIPTextModel.from_pretrained(os.path.join(folder, "text_encoder"))
    text_encoder_2 = CLIPTextModelWithProjection.from_pretrained(
        os.path.join(folder, "text_encoder_2"))
    torch.manual_seed(seed)
    width = text_encoder.config.hidden_size + text_encoder_2.config.hidden_size
    if refiner:
        width = text_encoder_2.config.hidden_size
    time_features = 8
    shape = dict(block_out_channels=(8, 16), norm_num_groups=4)
    vae_shape = dict(block_out_channels=(4, 8), norm_num_groups=2)
    if original:
        shape = dict(block_out_channels=(64, 128), norm_num_groups=32)
        vae_shape = dict(block_out_channels=(32, 64), norm_num_groups=32)
    levels = dict(attention_head_dim=(1, 2),
                  down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                  transformer_layers_per_block=(1, 2))
    if original and refiner:
        # As SDXL's refiner: a last level without attention, the mid block's depth that of the
        # levels that attend.
        shape = dict(block_out_channels=(64, 128, 128), norm_num_groups=32)
        levels = dict(attention_head_dim=(1, 2, 2),
                      down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                      transformer_layers_per_block=2)
    unet = perturbed(UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=2, **shape, **levels,
        use_linear_projection=True,
        cross_attention_dim=width, addition_embed_type="text_time",
        addition_time_embed_dim=time_features,
        projection_class_embeddings_input_dim=text_encoder_2.config.projection_dim
        + (5 if refiner else 6) * time_features), seed)
    vae = perturbed(AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, scaling_factor=0.13025, **vae_shape), seed + 1)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012,
                                       beta_schedule="scaled_linear", steps_offset=1,
                                       timestep_spacing="leading", prediction_type="epsilon")
    if refiner:
        pipeline = StableDiffusionXLImg2ImgPipeline(
            vae=vae, text_encoder=None, text_encoder_2=text_encoder_2, tokenizer=None,
            tokenizer_2=CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer_2")),
            unet=unet, scheduler=scheduler, requires_aesthetics_score=True,
            force_zeros_for_empty_prompt=False, add_watermarker=False)
        for part in ("text_encoder", "tokenizer"):
            shutil.rmtree(os.path.join(folder, part))
        pipeline.save_pretrained(folder, safe_serialization=True)
        print(f"saved the SDXL refiner pipeline to {folder}")
        return 0
    pipeline = StableDiffusionXLPipeline(
        vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
        tokenizer=CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer")),
        tokenizer_2=CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer_2")),
        unet=unet, scheduler=scheduler, force_zeros_for_empty_prompt=True,
        add_watermarker=False)
    pipeline.save_pretrained(folder, safe_serialization=True)
    print(f"saved the SDXL pipeline to {folder}")
    return 0


def make(folder, seed, kind):
    if kind in ("sdxl", "ldmxl", "refiner", "ldmxl_refiner"):
        return make_sdxl(folder, seed, original=kind.startswith("ldmxl"),
                         refiner=kind.endswith("refiner"))
    text_encoder = CLIPTextModel.from_pretrained(os.path.join(folder, "text_encoder"))
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer"))
    torch.manual_seed(seed)
    shape = dict(block_out_channels=(8, 16), attention_head_dim=2, norm_num_groups=4)
    vae_shape = dict(block_out_channels=(4, 8), norm_num_groups=2)
    if kind == "ldm1":
        shape = dict(block_out_channels=(32, 64), attention_head_dim=8, norm_num_groups=32)
    if kind == "ldm2":
        shape = dict(block_out_channels=(64, 128), attention_head_dim=(1, 2), norm_num_groups=32,
                     use_linear_projection=True)
    if kind.startswith("ldm"):
        vae_shape = dict(block_out_channels=(32, 64), norm_num_groups=32)
    unet = perturbed(UNet2DConditionModel(
        sample_size=8, in_channels=9 if kind == "inpaint" else 4, out_channels=4,
        layers_per_block=1,
        cross_attention_dim=text_encoder.config.hidden_size,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        time_cond_proj_dim=8 if kind == "lcm" else None, **shape), seed)
    vae = perturbed(AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, **vae_shape), seed + 1)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              clip_sample=False, set_alpha_to_one=False, steps_offset=1,
                              prediction_type="epsilon" if kind.startswith("ldm")
                              else "v_prediction")
    pipeline_class = StableDiffusionPipeline
    if kind == "lcm":
        scheduler = LCMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                 original_inference_steps=50)
        pipeline_class = LatentConsistencyModelPipeline
    pipeline = pipeline_class(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              unet=unet, scheduler=scheduler, safety_checker=None,
                              feature_extractor=None, requires_safety_checker=False)
    pipeline.save_pretrained(folder, safe_serialization=True)
    print(f"saved the pipeline to {folder}")
    return 0


def draw_step_noise(pipeline, path):
    """What the pipeline scheduler's step draws (Euler ancestral's, TCD's, LCM's): the tensors of
    PATH's "noise", one a step."""
    step_noise = list(load_file(path)["noise"].unbind(0))
    sys.modules[type(pipeline.scheduler).__module__].randn_tensor = \
        lambda shape, **kwargs: step_noise.pop(0).reshape(shape)


def sample(pipeline, out, settings, **call):
    """Runs the pipeline from seeded latents N(0, 1) (image to image: the settings' image with
    that noise added) with the settings' prompt, images, steps and guidance and `call`'s other
    arguments; writes OUT."""
    unet = pipeline.unet.config
    generator = torch.Generator().manual_seed(settings.get("seed", 0))
    scale = 2 ** (len(pipeline.vae.config.block_out_channels) - 1)
    height = settings.get("height", unet.sample_size * scale) // scale
    width = settings.get("width", unet.sample_size * scale) // scale
    noise = torch.randn((settings["images"], unet.out_channels, height, width),
                        generator=generator)
    if settings.get("height"):
        call.update(height=settings["height"], width=settings["width"])
    if settings.get("mask"):
        inpaint_class = (StableDiffusionXLInpaintPipeline
                         if isinstance(pipeline, StableDiffusionXLPipeline)
                         else StableDiffusionInpaintPipeline)
        pipeline = inpaint_class(**pipeline.components)
        sys.modules[inpaint_class.__module__].randn_tensor = lambda shape, **kwargs: noise.clone()
        images = load_file(settings["image"])
        call.update(image=images["images"], mask_image=Image.open(settings["mask"]),
                    masked_image_latents=images.get("masked_image_latents", images["images"]),
                    strength=settings["strength"])
    elif settings.get("image") and isinstance(pipeline, StableDiffusionXLImg2ImgPipeline):
        # SDXL's refiner is an image pipeline already (its config, requires_aesthetics_score,
        # stays with it).
        sys.modules[type(pipeline).__module__].randn_tensor = lambda shape, **kwargs: noise.clone()
        call.update(image=load_file(settings["image"])["images"], strength=settings["strength"])
    elif settings.get("image"):
        image_class = (LatentConsistencyModelImg2ImgPipeline
                       if isinstance(pipeline, LatentConsistencyModelPipeline)
                       else StableDiffusionXLImg2ImgPipeline
                       if isinstance(pipeline, StableDiffusionXLPipeline)
                       else StableDiffusionImg2ImgPipeline)
        pipeline = image_class(**pipeline.components)
        sys.modules[image_class.__module__].randn_tensor = lambda shape, **kwargs: noise.clone()
        call.update(image=load_file(settings["image"])["images"], strength=settings["strength"])
    else:
        call.update(latents=noise.clone())
    with torch.no_grad():
        latents = pipeline(prompt=settings["prompt"], num_images_per_prompt=settings["images"],
                           num_inference_steps=settings["steps"],
                           guidance_scale=settings["guidance"], output_type="latent",
                           **call).images
        decoded = pipeline.vae.decode(latents / pipeline.vae.config.scaling_factor).sample
    save_file({"noise": noise, "latents": latents.contiguous(), "decoded": decoded.contiguous()},
              out)
    return 0


def run_lcm(folder, out, settings):
    pipeline = LatentConsistencyModelPipeline.from_pretrained(folder, safety_checker=None,
                                                              requires_safety_checker=False)
    draw_step_noise(pipeline, settings["step_noise"])
    return sample(pipeline, out, settings,
                  original_inference_steps=settings.get("original_inference_steps"))


def run(folder, out, settings):
    with open(os.path.join(folder, "model_index.json")) as f:
        pipeline_class = json.load(f)["_class_name"]
    if pipeline_class == "LatentConsistencyModelPipeline":
        return run_lcm(folder, out, settings)
    call = {}
    if pipeline_class in ("StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"):
        xl_class = (StableDiffusionXLPipeline if pipeline_class == "StableDiffusionXLPipeline"
                    else StableDiffusionXLImg2ImgPipeline)
        pipeline = xl_class.from_pretrained(folder, add_watermarker=False)
        for key in ("original_size", "crops_coords_top_left", "target_size"):
            if settings.get(key):
                call[key] = tuple(settings[key])
        for key in ("aesthetic_score", "negative_aesthetic_score", "denoising_end",
                    "denoising_start"):
            if settings.get(key) is not None:
                call[key] = settings[key]
    else:
        pipeline = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None,
                                                           requires_safety_checker=False)
    for inversion, token in settings.get("textual_inversion", []):
        if not pipeline_class.startswith("StableDiffusionXL"):
            pipeline.load_textual_inversion(inversion, token=token)
            continue
        # SDXL's embeddings: clip_l for its first encoder, clip_g for its second.
        state = load_file(inversion)
        for key, encoder, tokenizer in (("clip_l", pipeline.text_encoder, pipeline.tokenizer),
                                        ("clip_g", pipeline.text_encoder_2,
                                         pipeline.tokenizer_2)):
            if encoder is None:  # the refiner's missing text_encoder
                continue
            pipeline.load_textual_inversion(state[key], token=token, text_encoder=encoder,
                                            tokenizer=tokenizer)
    for lora, scale in zip(settings.get("lora", []), settings.get("lora_scale", [])):
        # Fused as diffusers reads the file (tests/reference/lora.py); SDXL's with its UNet's
        # config (kohya's original-layout names) and its second text encoder.
        xl = pipeline_class.startswith("StableDiffusionXL")
        parts = [(pipeline.unet, lambda s, f, k: fuse_into(
                     s, f, k, unet_config=pipeline.unet.config if xl else None)),
                 (pipeline.text_encoder, fuse_text_encoder)]
        if xl:
            parts.append((pipeline.text_encoder_2, lambda s, f, k: fuse_text_encoder(
                s, f, k, prefix="text_encoder_2.")))
        for model, fuse in parts:
            if model is None:  # the refiner's missing text_encoder
                continue
            state = {k: v.double() for k, v in model.state_dict().items()}
            fuse(state, lora, scale)
            model.load_state_dict({k: v.float() for k, v in state.items()})
    config = dict(pipeline.scheduler.config)
    if settings.get("spacing"):
        config["timestep_spacing"] = settings["spacing"]
    if settings.get("karras"):
        config["use_karras_sigmas"] = True
    if settings.get("clip_sample") is not None:
        config["clip_sample"] = settings["clip_sample"]
    classes = {"ddpm": DDPMScheduler, "euler": EulerDiscreteScheduler,
               "euler_ancestral": EulerAncestralDiscreteScheduler,
               "heun": HeunDiscreteScheduler, "lms": LMSDiscreteScheduler,
               "kdpm2": KDPM2DiscreteScheduler,
               "dpmsolver": DPMSolverMultistepScheduler,
               "dpmsolver_singlestep": DPMSolverSinglestepScheduler,
               "deis": DEISMultistepScheduler,
               "dpmsolver_sde": dpm_solver_sde_module().DPMSolverSDEScheduler,
               "unipc": UniPCMultistepScheduler, "tcd": TCDScheduler}
    if settings.get("step_noise") and settings.get("scheduler") == "dpmsolver_sde":
        step_noise = load_file(settings["step_noise"])["noise"]
        dpm_solver_sde_module().BrownianTreeNoiseSampler = \
            lambda x, *args, **kwargs: StepBrownian(step_noise.reshape(
                step_noise.shape[:2] + x.shape))
    if settings.get("scheduler") == "pndm":
        pipeline.scheduler = PNDMScheduler.from_config(config, skip_prk_steps=True)
    elif settings.get("scheduler") in classes:
        pipeline.scheduler = classes[settings["scheduler"]].from_config(config)
    else:
        pipeline.scheduler = DDIMScheduler.from_config(config)
    if settings.get("step_noise") and settings.get("scheduler") != "dpmsolver_sde":
        draw_step_noise(pipeline, settings["step_noise"])
    return sample(pipeline, out, settings, negative_prompt=settings["negative_prompt"],
                  guidance_rescale=settings.get("guidance_rescale", 0.0),
                  eta=settings.get("eta", 0.0), **call)


def main(argv):
    if len(argv) in (4, 5) and argv[1] == "make" and argv[4:] in (
            [], ["sd"], ["lcm"], ["ldm1"], ["ldm2"], ["inpaint"], ["sdxl"], ["ldmxl"], ["refiner"],
            ["ldmxl_refiner"]):
        return make(argv[2], int(argv[3]), argv[4] if len(argv) == 5 else "sd")
    if len(argv) == 5 and argv[1] == "run":
        with open(argv[4]) as f:
            return run(argv[2], argv[3], json.load(f))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
