#!/usr/bin/python3
"""How well-conditioned DDIM with clip_sample is on an SDXL pipeline's latents: diffusers'
StableDiffusionXLPipeline with DDIMScheduler.from_config of its scheduler config, run in fp32 and
in float64 (UNet, VAE, text encoders, prompt embeddings and ᾱ's in double) from the same x_T,
beside `difftrain sample --sampler ddim` of the same pipeline:

    PYTHON bench/ddim_clip_conditioning.py PIPELINE NOISE.safetensors DIFFTRAIN [clip|noclip] \
        STEPS:GUIDANCE ...

PYTHON is the interpreter tests/reference/diffusers_env.sh prints. NOISE holds "noise" [2, 4,
h, w] (sd_pipeline.py run's x_T, e.g. the sdxl_ddim case's _want file of
tests/sd_pipeline_reference_test.cc, whose folder a failed run keeps). Prints, per STEPS:GUIDANCE,
the relative L2 of diffusers' fp32 latents from its float64 ones, of difftrain's from float64,
and of difftrain's from diffusers' fp32.
"""

import subprocess
import sys
import tempfile

import safetensors.torch  # noqa: F401  (before diffusers)
import torch
from diffusers import DDIMScheduler, StableDiffusionXLPipeline
from safetensors.torch import load_file

PROMPT = "a photo of a boat"


def main(argv):
    if len(argv) < 6 or argv[4] not in ("clip", "noclip"):
        print(__doc__, file=sys.stderr)
        return 2
    folder, noise_path, difftrain, clip = argv[1:5]
    runs = [tuple(float(v) for v in arg.split(":")) for arg in argv[5:]]
    pipeline = StableDiffusionXLPipeline.from_pretrained(folder, add_watermarker=False)
    config = dict(pipeline.scheduler.config)
    noise = load_file(noise_path)["noise"]
    with torch.no_grad():
        embeddings = pipeline.encode_prompt(PROMPT, num_images_per_prompt=noise.shape[0],
                                            do_classifier_free_guidance=True)

    def run(steps, guidance, dtype):
        pipeline.scheduler = DDIMScheduler.from_config(config, clip_sample=clip == "clip")
        for model in (pipeline.unet, pipeline.vae, pipeline.text_encoder,
                      pipeline.text_encoder_2):
            model.to(dtype)
        if dtype == torch.float64:
            pipeline.scheduler.alphas_cumprod = pipeline.scheduler.alphas_cumprod.double()
            pipeline.scheduler.final_alpha_cumprod = \
                pipeline.scheduler.final_alpha_cumprod.double()
        prompt, negative, pooled, negative_pooled = (e.to(dtype) for e in embeddings)
        with torch.no_grad():
            return pipeline(prompt_embeds=prompt, negative_prompt_embeds=negative,
                            pooled_prompt_embeds=pooled,
                            negative_pooled_prompt_embeds=negative_pooled,
                            num_inference_steps=int(steps), guidance_scale=guidance,
                            output_type="latent",
                            latents=noise.clone().to(dtype)).images.double()

    def relative(a, b):
        return float((a - b).norm() / b.norm())

    with tempfile.TemporaryDirectory() as tmp:
        for steps, guidance in runs:
            fp32, fp64 = run(steps, guidance, torch.float32), run(steps, guidance, torch.float64)
            raw = f"{tmp}/difftrain.safetensors"
            subprocess.run([difftrain, "sample", "--pretrained", folder, "--initial-noise",
                            noise_path, "--prompt", PROMPT, "--cfg", str(guidance),
                            "--per-class", str(noise.shape[0]), "--steps", str(int(steps)),
                            "--sampler", "ddim", "--clip-denoised",
                            "true" if clip == "clip" else "false", "--raw", raw],
                           check=True, capture_output=True)
            ours = load_file(raw)["images"].double()
            print(f"{int(steps)} steps, guidance {guidance:g}, {clip}: diffusers fp32 from "
                  f"float64 {relative(fp32, fp64):.3g}, difftrain from float64 "
                  f"{relative(ours, fp64):.3g}, difftrain from diffusers fp32 "
                  f"{relative(ours, fp32):.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
