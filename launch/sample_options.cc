// The flags of `difftrain sample` (launch/sample_options.h).
#include "launch/sample_options.h"

namespace difftrain::launch {

std::vector<CLI::Option*> AddSampleOptions(CLI::App& app, SampleOptions& o) {
  app.add_option("--checkpoint", o.checkpoint,
                 "checkpoint directory (its newest complete step) or one step directory");
  app.add_option("--pretrained", o.pretrained,
                 "sample from these weights instead of a checkpoint: a safetensors file "
                 "(DiT's released weights), a diffusers UNet folder or pipeline, or another "
                 "run's checkpoint directory; the model from --model/--config and the shape "
                 "flags (default: a diffusers UNet's config.json), the diffusion from "
                 "--schedule, --beta-start, --beta-end, --prediction (default: a pipeline's "
                 "scheduler config, else DiT's); a pipeline's text_encoder/ and vae/ serve "
                 "as --text-encoder and --vae")
      ->excludes("--checkpoint");
  app.add_option("--classes", o.classes,
                 "class labels, one grid row each: 0,1,2, or names a DiTPipeline folder's "
                 "id2label gives (required unless the model has no classes)")
      ->delimiter(',');
  app.add_option("--prompt", o.prompts,
                 "a text model's prompt, one grid row each (repeat it); found in the text "
                 "table by its exact text, or embedded by the text encoder")
      ->allow_extra_args(false);
  app.add_option("--captions", o.caption_ids, "a text model's rows as text table ids: 0,6,12")
      ->delimiter(',');
  app.add_option("--text-table", o.text_table,
                 "the text embeddings of the prompts (default: text.safetensors of the "
                 "latent folder the checkpoint was trained on)");
  app.add_option("--text-encoder", o.text_encoder,
                 "embeds the prompts the text table lacks: a transformers BERT or CLIP text "
                 "model folder with its tokenizer, or a Stable Diffusion pipeline's folder "
                 "(default: a --pretrained pipeline's, else the encoder the table was "
                 "embedded with, if difftrain's; `none`: look prompts up only)");
  app.add_option("--negative-prompt", o.negative_prompt,
                 "a text model's guidance steers away from this text: its embedding in "
                 "place of the unconditional one (default: zeros, as text dropout trained "
                 "the model; for --pretrained weights with a text encoder the empty "
                 "prompt's, as diffusers)");
  app.add_option("--skip-layers", o.skip_layers,
                 "with a text encoder: the hidden state this many layers before the last "
                 "(default: the table's, else 0)");
  app.add_option("--per-class", o.per_class, "samples per class or prompt (grid columns)")
      ->capture_default_str();
  app.add_option("--steps", o.steps,
                 "sampling steps, spaced over the diffusion's (default 250, or all if "
                 "fewer; from a pipeline 50; lcm and tcd 4)");
  app.add_option("--sampler", o.sampler,
                 "ddpm, ddim, pndm, euler, euler_ancestral, heun, lms, kdpm2, "
                 "kdpm2_ancestral, dpmsolver, dpmsolver_singlestep, dpmsolver_sde, deis, "
                 "unipc, lcm or tcd (default ddpm; from a pipeline its scheduler's: DDPM, "
                 "DDIM, PNDM, EulerDiscrete, EulerAncestralDiscrete, HeunDiscrete, "
                 "LMSDiscrete, KDPM2Discrete, KDPM2AncestralDiscrete, DPMSolverMultistep, "
                 "DPMSolverSinglestep, DPMSolverSDE, DEISMultistep, UniPCMultistep, LCM or "
                 "TCD, else ddim)");
  app.add_option("--timestep-spacing", o.timestep_spacing,
                 "where the steps fall: respace (DiT's), or diffusers' leading, trailing or "
                 "linspace (default: a pipeline's scheduler's, else respace; "
                 "dpmsolver_singlestep: linspace only; lcm, tcd: none, their own timesteps)")
      ->check(CLI::IsMember({"respace", "leading", "trailing", "linspace"}));
  app.add_option("--steps-offset", o.steps_offset,
                 "added to leading's timesteps (default: a pipeline scheduler's "
                 "steps_offset, else 0)");
  app.add_option("--set-alpha-to-one", o.set_alpha_to_one,
                 "with a diffusers spacing, DDIM's last step goes to alpha-bar 1 (true) or "
                 "to timestep 0's (false) (default: a pipeline scheduler's, else true)");
  app.add_option("--karras-sigmas", o.karras_sigmas,
                 "euler, heun, lms, kdpm2(_ancestral), dpmsolver(_singlestep, _sde), deis "
                 "and unipc step on Karras et al.'s sigmas (true) or the spacing's (false) "
                 "(default: a pipeline scheduler's use_karras_sigmas, else false)");
  app.add_option("--solver-order", o.solver_order,
                 "the order of dpmsolver(_singlestep), deis and unipc: 1, 2 or 3 (DPM++ 3M; "
                 "not with the SDE) (default: a pipeline scheduler's solver_order, else 2)");
  app.add_option("--solver-type", o.solver_type,
                 "dpmsolver(_singlestep): midpoint or heun; deis: logrho; unipc: bh1 or bh2 "
                 "(default: a pipeline scheduler's solver_type, else midpoint, logrho and "
                 "bh2)");
  app.add_option("--algorithm-type", o.algorithm_type,
                 "dpmsolver: dpmsolver++ or sde-dpmsolver++ (DPM++ 2M SDE); "
                 "dpmsolver_singlestep: dpmsolver++; deis: deis (default: a pipeline "
                 "scheduler's algorithm_type, else dpmsolver++ and deis)");
  app.add_option("--final-sigmas-type", o.final_sigmas_type,
                 "dpmsolver(_singlestep): the last step goes to sigma 0 (zero) or to "
                 "timestep 0's (sigma_min) (default: a pipeline scheduler's "
                 "final_sigmas_type, else zero)")
      ->check(CLI::IsMember({"zero", "sigma_min"}));
  app.add_option("--lower-order-final", o.lower_order_final,
                 "dpmsolver(_singlestep), deis and unipc: lower the order of the last "
                 "steps (true) or not (false) (default: a pipeline scheduler's "
                 "lower_order_final, else true; dpmsolver_singlestep false)");
  app.add_option("--original-inference-steps", o.original_inference_steps,
                 "lcm, tcd: the steps of the schedule the model was distilled on, of which "
                 "--steps are taken (default: a pipeline scheduler's "
                 "original_inference_steps, else 50)");
  app.add_option("--eta", o.eta,
                 "DDIM's eta in [0, 1] (default 0: deterministic); TCD's gamma in [0, 1] "
                 "(default 0.3)");
  app.add_option(
      "--cfg", o.cfg,
      "classifier-free guidance scale; 1 = none (default 4, from a text "
      "model's pipeline 7.5; 1 for a model without a null class; a guidance-distilled model's "
      "embedded scale 8.5)");
  app.add_option("--guidance-rescale", o.guidance_rescale,
                 "phi in [0, 1]: each guided output rescaled toward the conditional "
                 "output's standard deviation, as diffusers' guidance_rescale (default 0)");
  app.add_option("--cfg-interval", o.cfg_interval,
                 "guide only the steps whose timestep lies in FROM,TO (e.g. 0,600); "
                 "default: every step")
      ->delimiter(',');
  app.add_option("--seed", o.seed, "seed of the noise")->capture_default_str();
  app.add_option("--batch", o.batch, "samples per model call (twice that with guidance)")
      ->capture_default_str();
  app.add_option("--out", o.out,
                 "PNG grid: one row per class (a video model: a filmstrip, one row of frames "
                 "per video)");
  app.add_option("--out-dir", o.out_dir,
                 "a folder of one PNG per sample (00000.png, …), with a text model's prompts in "
                 "metadata.jsonl: an image folder `data pack` reads (DreamBooth's class images)");
  app.add_option("--gif", o.gif,
                 "a video model's animated GIF: frame f shows the grid of every video's "
                 "frame f, one row per class");
  app.add_option("--gif-delay", o.gif_delay_cs, "GIF frame duration, 1/100 s")
      ->capture_default_str();
  app.add_option("--raw", o.raw,
                 "safetensors file of the samples: images F32 [N, C, H, W] ([N, F, C, H, "
                 "W] for videos), labels I64 [N], and with a VAE decoded F32");
  app.add_flag("--watch", o.watch,
               "sample every checkpoint of the run directory --checkpoint as training writes "
               "it, newest first, into per-step outputs (--out-dir D: D/step-00000020/; "
               "--out grid.png: grid-step-00000020.png; --gif, --raw alike); stop once the "
               "run's last step is sampled");
  app.add_option("--watch-timeout", o.watch_timeout,
                 "with --watch: seconds to wait for a new checkpoint before giving up (exit 1)")
      ->capture_default_str();
  app.add_option("--tensorboard", o.tensorboard,
                 "with --watch and --out: log each step's grid as the TensorBoard image "
                 "`samples` of that step, in DIR/samples (DIR: the run's "
                 "train.tensorboard_dir)");
  app.add_option("--weights", o.weights, "ema or model")
      ->check(CLI::IsMember({"ema", "model"}))
      ->capture_default_str();
  app.add_option("--initial-noise", o.initial_noise,
                 "x_T of every sample from this safetensors file, as diffusers pipelines' "
                 "`latents`: the tensor `noise` (or the file's only one), shaped as --raw's "
                 "images [N, C, H, W] in grid order (default: drawn from --seed)");
  app.add_option("--image", o.images,
                 "image to image: start from this picture (PNG or JPEG; stretched to the "
                 "samples' size and, for a latent model, encoded by the VAE) or safetensors "
                 "file of x0's (--raw's images); one for all samples, one per row or one per "
                 "sample (repeat it), as diffusers' StableDiffusionImg2ImgPipeline");
  app.add_option("--strength", o.strength,
                 "with --image: how far up the schedule the image is noised, in (0, 1]; "
                 "the last ⌊steps × strength⌋ steps run (a guidance-distilled LCM: its "
                 "steps from that part of the schedule) (default 0.8; inpainting 1: from "
                 "x_T)");
  app.add_option("--denoising-end", o.denoising_end,
                 "in (0, 1): stop where that part of the schedule is done, the samples still "
                 "noisy, for --raw (SDXL's base before its refiner, as diffusers' "
                 "denoising_end); the euler, ddim, dpmsolver, deis and unipc samplers");
  app.add_option("--denoising-start", o.denoising_start,
                 "in (0, 1): take --image (a --denoising-end run's --raw) as it is and run "
                 "the steps from that part of the schedule on (the refiner after its base, "
                 "as diffusers' denoising_start)");
  app.add_option("--mask", o.masks,
                 "inpainting: paint --image where this picture is white (binarised at "
                 "half), as diffusers' StableDiffusionInpaintPipeline: an inpainting UNet "
                 "(9 input channels) sees the mask and the masked image, any other model's "
                 "samples keep the image outside the mask at every step; one for all "
                 "samples, one per row or one per sample (repeat it)");
  app.add_option("--height", o.height,
                 "the samples' height in pixels, as diffusers' height (default: the "
                 "model's; a UNet samples at any multiple of the VAE's downscale times "
                 "2^(levels - 1))");
  app.add_option("--width", o.width, "the samples' width in pixels, likewise");
  app.add_option("--original-size", o.original_size,
                 "SDXL: H,W in pixels, the original size its time ids give, as diffusers' "
                 "original_size (default: the samples' size)")
      ->delimiter(',');
  app.add_option("--crop-top-left", o.crop_top_left,
                 "SDXL: TOP,LEFT in pixels, as diffusers' crops_coords_top_left (default 0,0)")
      ->delimiter(',');
  app.add_option("--target-size", o.target_size,
                 "SDXL: H,W in pixels, as diffusers' target_size (default: the samples' size; "
                 "not the refiner's)")
      ->delimiter(',');
  app.add_option("--aesthetic-score", o.aesthetic_score,
                 "SDXL's refiner: the aesthetic score its time ids give (default 6)");
  app.add_option("--negative-aesthetic-score", o.negative_aesthetic_score,
                 "SDXL's refiner: the unconditional text's (default 2.5)");
  app.add_option("--clip-denoised", o.clip_denoised,
                 "clip x0 predictions to [-1, 1] every step (default: true, false for "
                 "models trained on latents and for every sampler but ddpm and ddim)");
  app.add_option("--vae", o.vae,
                 "decode a latent model's samples for --out and --gif (and into --raw's "
                 "`decoded`) with this diffusers AutoencoderKL: its folder, a pipeline's, "
                 "or its safetensors file (default for --out/--gif: a --pretrained "
                 "pipeline's vae/, else the VAE the training data was packed with, if its "
                 "index names one; `none`: no decoding)");
  app.add_option("--lora", o.loras,
                 "fuse this LoRA (a safetensors file of diffusers', peft's or kohya's keys: "
                 "LCM-LoRA, TCD-LoRA, a style) into the model's weights before sampling, "
                 "its text encoder part into a pipeline's text encoder; repeat it to fuse "
                 "several");
  app.add_option("--textual-inversion", o.textual_inversions,
                 "load this textual inversion embedding (a safetensors file of one tensor, "
                 "[D] or [n, D]: diffusers' learned_embeds, A1111's) into the text encoder "
                 "as a new token, as diffusers' load_textual_inversion; repeat it for "
                 "several");
  app.add_option("--textual-inversion-token", o.inversion_tokens,
                 "the tokens of the --textual-inversion files, one each in order "
                 "(default: the file's tensor's name, diffusers' token)");
  app.add_option("--lora-scale", o.lora_scales,
                 "the LoRAs' scales (diffusers' fuse_lora lora_scale): one for all, or one "
                 "per --lora in order (default 1)")
      ->delimiter(',');
  app.add_option("--log-level", o.log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  // With --pretrained: the model and the diffusion the weights were trained with.
  o.model.AddTo(app);
  return AddDiffusionOptions(app, o.diffusion);
}

}  // namespace difftrain::launch
