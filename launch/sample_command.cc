// `difftrain sample`: class-conditional samples from a checkpoint's model, or a text model's
// from prompts, written as a PNG grid (one row per class or prompt; a video model's: one row
// of frames per video, and an animated GIF of the grid) and optionally as raw floats
// (docs/sampling.md).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/log.h"
#include "launch/command.h"
#include "launch/model_options.h"
#include "launch/sample_denoiser.h"
#include "launch/sample_files.h"
#include "launch/sample_image.h"
#include "launch/sample_options.h"
#include "launch/sample_prompts.h"
#include "launch/sample_sampler.h"
#include "launch/sample_source.h"
#include "launch/sample_watch.h"
#include "model/cpu/embed.h"
#include "model/data/text_table.h"
#include "model/diffusion/sampler.h"
#include "model/family/family.h"
#include "model/io/checkpoint.h"
#include "model/io/gif.h"
#include "model/io/lora.h"
#include "model/io/png.h"
#include "model/io/safetensors.h"
#include "model/text/embedder.h"
#include "model/train/trainer.h"
#include "model/vae/vae.h"

namespace difftrain::launch {
namespace {

// DiT's sample.py defaults: 250 respaced steps and guidance scale 4; a diffusers pipeline's
// (StableDiffusionPipeline.__call__): 50 steps and guidance scale 7.5 (DiTPipeline's: 50 steps
// and DiT's 4).
constexpr int kDefaultSteps = 250;
constexpr double kDefaultGuidance = 4.0;
constexpr int kPipelineSteps = 50;
constexpr double kPipelineGuidance = 7.5;
// LatentConsistencyModelPipeline's num_inference_steps; TCD's too, as its model cards sample.
constexpr int kLcmSteps = 4;
constexpr double kTcdGamma = 0.3;  // TCDScheduler.step's eta
// LatentConsistencyModelPipeline's guidance_scale, for a model that embeds it.
constexpr double kEmbeddedGuidance = 8.5;
// StableDiffusionImg2ImgPipeline's strength, and StableDiffusionInpaintPipeline's; SDXL's
// pipelines' (StableDiffusionXLImg2ImgPipeline's 0.3, made to refine;
// StableDiffusionXLInpaintPipeline's 0.9999: the image noised to the second step).
constexpr double kImageStrength = 0.8;
constexpr double kInpaintStrength = 1.0;
constexpr double kSdxlImageStrength = 0.3;
constexpr double kSdxlInpaintStrength = 0.9999;

int RunSample(const SampleOptions& o) {
  auto bad = [](const std::string& message) { return ReportBadInput("sample", message); };
  if (Status s = SetupLogging(o.log_level); !s.ok()) return bad(s.message());
  if (o.out.empty() && o.out_dir.empty() && o.raw.empty() && o.gif.empty())
    return bad(
        "give --out (a PNG grid), --out-dir (a PNG a sample), --gif (a video model's), "
        "--raw, or several");
  if (!o.tensorboard.empty()) return bad("--tensorboard logs what --watch samples: add --watch");
  if (o.per_class < 1) return bad(fmt::format("--per-class must be positive, got {}", o.per_class));
  if (o.batch < 1) return bad(fmt::format("--batch must be positive, got {}", o.batch));
  if (o.lora_scales.size() > 1 && o.lora_scales.size() != o.loras.size()) {
    return bad(fmt::format("--lora-scale: give one scale, or one per --lora ({}), got {}",
                           o.loras.size(), o.lora_scales.size()));
  }
  if (o.checkpoint.empty() == o.pretrained.empty())
    return bad("give --checkpoint (a difftrain checkpoint) or --pretrained (weights)");
  if (!o.checkpoint.empty() && (o.model_given || o.diffusion_given))
    return bad("the model and diffusion flags are for --pretrained: a checkpoint names its own");
  Result<SampleSource> loaded = [&]() -> Result<SampleSource> {
    if (!o.checkpoint.empty()) return LoadCheckpointSource(o.checkpoint);
    std::optional<ModelSpec> spec;
    std::optional<int> latent_size;  // --image-size/--input-size alone: the folder's model
    if (o.model_given) {
      DT_ASSIGN_OR_RETURN(latent_size, o.model.SizeOnly());
      DT_ASSIGN_OR_RETURN(spec, o.model.Build());
    }
    return LoadPretrainedSource(o.pretrained, std::move(spec),
                                o.diffusion_given ? std::optional(o.diffusion) : std::nullopt,
                                latent_size);
  }();
  if (!loaded.ok()) {
    return bad((o.checkpoint.empty() ? "--pretrained: " : "--checkpoint: ") +
               loaded.status().message());
  }
  SampleSource& ckpt = *loaded;
  const Result<Sampling> sampling = ChooseSampling(o, ckpt);
  if (!sampling.ok()) return bad(sampling.status().message());
  const SamplerKind kind = sampling->kind;
  const bool pipeline_defaults = ckpt.spacing.has_value();
  const ModelFamily& family = FamilyOf(ckpt.model);
  SampleSchema m = family.Samples(ckpt.model);
  const bool text_model = m.context_length > 0;
  std::optional<Prompts> prompts;
  if (text_model) {
    Result<Prompts> resolved = ResolvePrompts(o, ckpt, m);
    if (!resolved.ok()) return bad(resolved.status().message());
    prompts = std::move(resolved).value();
  } else if (!o.prompts.empty() || !o.caption_ids.empty() || !o.text_table.empty() ||
             !o.text_encoder.empty() || o.skip_layers || o.negative_prompt ||
             !o.textual_inversions.empty()) {
    return bad(
        "--prompt, --captions, --negative-prompt, --text-table, --text-encoder, --skip-layers "
        "and --textual-inversion are for text-conditional models");
  }
  // A text model's "classes" are its prompts, and its null class the unconditional text.
  const int num_rows = text_model ? static_cast<int>(prompts->ids.size()) : m.num_classes;
  const bool has_null_class =
      text_model ? m.context_dropout > 0 : m.num_classes > 0 && m.label_dropout > 0;
  if (o.negative_prompt && !has_null_class) {
    return bad(
        "--negative-prompt steers guidance, and this model has no unconditional text to guide "
        "with (text_dropout 0)");
  }
  if (!o.gif.empty() && !m.video) return bad("--gif is for video models (Latte)");
  if (!o.images.empty() && m.video) return bad("--image is for image models, not videos");
  if (o.strength && o.images.empty()) return bad("--strength is for sampling from --image");
  if (o.denoising_start) {
    if (o.images.empty() || !std::all_of(o.images.begin(), o.images.end(), IsSafetensorsPath)) {
      return bad(
          "--denoising-start takes the noisy latents of a --denoising-end run as --image "
          "(its --raw safetensors file)");
    }
    if (o.strength || !o.initial_noise.empty() || !o.masks.empty()) {
      return bad(
          "--denoising-start takes its --image as it is: not with --strength, --initial-noise "
          "or --mask");
    }
  }
  if (o.denoising_end && (!o.out.empty() || !o.gif.empty() || o.raw.empty())) {
    return bad("--denoising-end stops with the samples still noisy: write them with --raw alone");
  }
  const bool inpainting = !o.masks.empty();
  if (inpainting && o.images.empty()) return bad("--mask is for inpainting an --image");
  if (m.conditioning_channels > 0 && !inpainting) {
    return bad(fmt::format(
        "the {} model takes {} conditioning channels besides the {} it samples (an inpainting "
        "UNet): give the --image to paint and its --mask",
        ckpt.model.name(), m.conditioning_channels, m.channels));
  }
  if (o.gif_delay_cs < 1) return bad("--gif-delay must be positive");
  // An unconditional model draws one row of --per-class samples, label 0.
  Result<std::vector<int>> given_classes = ClassNumbers(o.classes, ckpt);
  if (!given_classes.ok()) return bad(given_classes.status().message());
  std::vector<int> classes = *given_classes;
  if (text_model) {
    for (int r = 0; r < num_rows; ++r)
      classes.push_back(r);
  } else if (m.num_classes == 0) {
    if (!classes.empty()) return bad("--classes: this model has no classes");
    classes = {0};
  } else if (classes.empty()) {
    return bad("--classes is required for a class-conditional model");
  }
  for (int label : *given_classes) {
    if (label < 0 || label >= m.num_classes) {
      return bad(
          fmt::format("--classes: class {} is outside the model's [0, {})", label, m.num_classes));
    }
  }
  Result<std::optional<Vae>> vae = LoadSampleVae(o, ckpt, m);
  if (!vae.ok()) return bad(vae.status().message());
  Result<std::optional<ModelSpec>> resized =
      ResizedForSampling(o, ckpt.model, m, *vae ? &**vae : nullptr);
  if (!resized.ok()) return bad(resized.status().message());
  if (*resized) {
    ckpt.model = std::move(**resized);
    m = family.Samples(ckpt.model);
  }
  std::vector<float> negative_time_ids;  // the unconditional text's
  if (Status s = ChooseTimeIds(o, ckpt, *vae ? &**vae : nullptr, m, negative_time_ids); !s.ok())
    return bad(s.message());
  if (!o.out_dir.empty() && m.video) return bad("--out-dir is for image models (Latte: --gif)");
  if ((!o.out.empty() || !o.out_dir.empty() || !o.gif.empty()) && !*vae && m.channels != 1 &&
      m.channels != 3) {
    return bad(fmt::format(
        "--out: a PNG needs 1 or 3 channels and this model makes {} (latents: decode them "
        "with --vae, a diffusers AutoencoderKL folder)",
        m.channels));
  }

  const GaussianDiffusion diffusion(ckpt.diffusion);
  SamplerOptions options;
  options.kind = kind;
  const bool distilled = kind == SamplerKind::kLcm || kind == SamplerKind::kTcd;
  options.steps = o.steps.value_or(std::min(distilled           ? kLcmSteps
                                            : pipeline_defaults ? kPipelineSteps
                                                                : kDefaultSteps,
                                            diffusion.steps()));
  options.spacing = sampling->spacing;
  options.eta = o.eta.value_or(kind == SamplerKind::kTcd ? kTcdGamma : 0.0);
  options.cfg_scale = o.cfg.value_or(
      has_null_class ? (pipeline_defaults && text_model ? kPipelineGuidance : kDefaultGuidance)
                     : 1.0);
  // A guidance-distilled model takes the scale as an embedding in one conditional pass, as
  // LatentConsistencyModelPipeline runs it: no unconditional model to guide against.
  std::vector<float> guidance_embedding;
  const double embedded_guidance = o.cfg.value_or(kEmbeddedGuidance);
  if (m.guidance_embedding_dim > 0) {
    if (o.negative_prompt || o.guidance_rescale || !o.cfg_interval.empty()) {
      return bad(
          "--negative-prompt, --guidance-rescale and --cfg-interval steer classifier-free "
          "guidance, and this model takes its guidance scale as an embedding "
          "(time_cond_proj_dim): --cfg alone sets it");
    }
    guidance_embedding.resize(m.guidance_embedding_dim);
    cpu::GuidanceScaleEmbedding(guidance_embedding.data(), embedded_guidance,
                                m.guidance_embedding_dim);
    options.cfg_scale = 1;
  }
  if (!o.cfg_interval.empty()) {
    if (o.cfg_interval.size() != 2) {
      return bad(fmt::format("--cfg-interval takes two timesteps FROM,TO, got {} values",
                             o.cfg_interval.size()));
    }
    options.cfg_from = o.cfg_interval[0];
    options.cfg_to = o.cfg_interval[1];
  }
  // Without a scheduler config, pixel models are clipped to the data range at every step and
  // latents (not bounded to [−1, 1]) are not, as DiT's sample.py does; a pipeline's scheduler
  // says itself (clip_sample).
  // (Pretrained weights say nothing of their data: 1- or 3-channel samples are taken for pixels.)
  const bool latents =
      ckpt.pretrained ? m.channels != 1 && m.channels != 3 : ckpt.data_kind == "latent_folder";
  if (Status s = ChooseClipping(o, ckpt, kind, latents, options); !s.ok()) return bad(s.message());
  if (Status s = ChooseSolverOptions(o, ckpt, kind, options); !s.ok()) return bad(s.message());
  if (Status s = ChooseLcmOptions(o, ckpt, kind, options); !s.ok()) return bad(s.message());
  options.guidance_rescale = o.guidance_rescale.value_or(0.0);
  options.seed = o.seed;
  const bool sdxl = m.pooled_text_dim > 0;
  const double strength =
      o.strength.value_or(inpainting ? (sdxl ? kSdxlInpaintStrength : kInpaintStrength)
                                     : (sdxl ? kSdxlImageStrength : kImageStrength));
  if (inpainting) {
    // StableDiffusionInpaintPipeline at strength 1 starts from x_T itself, not the image noised.
    if (strength != 1) options.strength = strength;
  } else if (o.denoising_start) {
    options.denoising_start = o.denoising_start;  // the image as it is, no strength
  } else if (!o.images.empty()) {
    // A guidance-distilled LCM's image pipeline (LatentConsistencyModelImg2ImgPipeline) takes
    // its steps from the strength's part of the schedule; the others run the strength's part
    // of the steps (StableDiffusionImg2ImgPipeline).
    const bool in_schedule = kind == SamplerKind::kLcm && m.guidance_embedding_dim > 0;
    options.strength = in_schedule ? 1.0 : strength;
    if (in_schedule) options.lcm.strength = strength;
  }
  options.denoising_end = o.denoising_end;
  DenoiserShape shape{
      m.channels, m.height, m.width, m.learn_sigma(), has_null_class ? num_rows : -1, m.frames};
  Result<Sampler> sampler = Sampler::Create(diffusion, shape, options);
  if (!sampler.ok()) return bad(sampler.status().message());

  Result<std::unique_ptr<Model>> created = family.CreateForInference(ckpt.model);
  if (!created.ok()) return bad("--checkpoint: " + created.status().message());
  Model& model = **created;
  if (Status s = FillModelWeights(ckpt, o.weights == "ema", model); !s.ok())
    return bad((ckpt.pretrained ? "--pretrained: " : "--checkpoint: ") + s.message());
  for (size_t i = 0; i < o.loras.size(); ++i) {
    const std::string& lora = o.loras[i];
    const bool text_fused = prompts && prompts->lora_text_encoder;
    Result<io::LoraFused> fused = io::FuseLora(
        lora, o.LoraScale(i), {{io::kLoraUNet, &model.global_parameter_table(), model.params()}},
        text_fused ? std::vector<std::string>{io::kLoraTextEncoder, io::kLoraTextEncoder2}
                   : std::vector<std::string>{},
        "difftrain fuses only where the prompts are all embedded by a text encoder (--pretrained "
        "PIPELINE without --text-table or --captions)");
    if (!fused.ok()) return bad("--lora: " + fused.status().message());
    spdlog::info("fused the LoRA {} into {} modules of the model (rank up to {}) at scale {}", lora,
                 fused->modules, fused->rank, o.LoraScale(i));
  }
  SampleDenoiser calls(model, m, guidance_embedding);
  const Denoiser denoiser =
      text_model ? calls.ForPrompts(*prompts, negative_time_ids, o.batch) : calls.ForLabels();
  const size_t conditioning_floats = calls.conditioning_floats();

  // Sample k (row-major in the grid) is column k % per_class of the row of class k / per_class.
  const int total = static_cast<int>(classes.size()) * o.per_class;
  std::vector<int32_t> labels(total);
  for (int k = 0; k < total; ++k)
    labels[k] = classes[k / o.per_class];
  const size_t n = m.elements();
  std::vector<float> images(total * n);
  std::vector<float> start;  // image to image: x0 of every sample
  if (!o.images.empty()) {
    Result<std::vector<float>> read =
        ReadStartImages(o.images, m, *vae ? &**vae : nullptr, static_cast<int>(classes.size()),
                        o.per_class, o.seed);
    if (!read.ok()) return bad("--image: " + read.status().message());
    start = std::move(read).value();
  }
  // Inpainting: each sample's mask and, for an inpainting UNet, its conditioning channels (the
  // mask, then the masked image's latents).
  InpaintInputs inpaint;
  std::vector<float> conditioning_rows;
  if (inpainting) {
    Result<InpaintInputs> read =
        ReadInpaintInputs(o.masks, o.images, m, *vae ? &**vae : nullptr,
                          static_cast<int>(classes.size()), o.per_class, o.seed);
    if (!read.ok()) return bad(read.status().message());
    inpaint = std::move(read).value();
    const size_t plane = size_t(m.height) * m.width;
    for (int k = 0; k < total && conditioning_floats > 0; ++k) {
      conditioning_rows.insert(conditioning_rows.end(), inpaint.mask.begin() + k * plane,
                               inpaint.mask.begin() + (k + 1) * plane);
      conditioning_rows.insert(conditioning_rows.end(), inpaint.masked.begin() + k * n,
                               inpaint.masked.begin() + (k + 1) * n);
    }
  }
  if (!o.initial_noise.empty()) {
    if (Status s = ReadInitialNoise(o.initial_noise, total, m, images); !s.ok())
      return bad("--initial-noise: " + s.message());
  }
  spdlog::info(
      "sampling {} images of {} ({}): {} {} steps{}{}, guidance {}{}, seed {}", total,
      ckpt.model.name(),
      ckpt.pretrained ? fmt::format("{} weights of {}", o.weights, ckpt.path)
                      : fmt::format("{} weights of step {} in {}", o.weights, ckpt.step, ckpt.path),
      sampling->name, options.steps,
      kind == SamplerKind::kDdim  ? fmt::format(" (eta {})", options.eta)
      : kind == SamplerKind::kTcd ? fmt::format(" (gamma {})", options.eta)
                                  : "",
      distilled ? fmt::format(" of the distillation's {} timesteps", options.lcm.original_steps)
      : options.spacing.diffusers()
          ? fmt::format(" spaced {} (steps_offset {}, set_alpha_to_one {}){}", options.spacing.kind,
                        options.spacing.steps_offset, options.spacing.set_alpha_to_one,
                        options.spacing.karras ? ", Karras sigmas" : "")
          : "",
      guidance_embedding.empty() ? options.cfg_scale : embedded_guidance,
      !guidance_embedding.empty() ? " (embedded)"
      : o.cfg_interval.empty()
          ? ""
          : fmt::format(" at timesteps {}..{}", options.cfg_from, options.cfg_to),
      o.seed);
  if (options.strength) {
    spdlog::info("from {} at strength {}: {} of the steps, from timestep {}",
                 fmt::join(o.images, ", "), strength, sampler->steps_run(),
                 sampler->start_timestep());
  }
  if (options.denoising_start || options.denoising_end) {
    spdlog::info("{} of the steps{}, from timestep {}{}", sampler->steps_run(),
                 options.denoising_start ? fmt::format(" on {} as it is", fmt::join(o.images, ", "))
                                         : std::string(),
                 sampler->start_timestep(),
                 options.denoising_end ? " (stopping noisy at the denoising end)" : "");
  }
  if (inpainting) {
    spdlog::info("inpainting {} where {} is white{}", fmt::join(o.images, ", "),
                 fmt::join(o.masks, ", "),
                 conditioning_floats > 0 ? ", the model seeing the mask and the masked image"
                                         : ", the image kept elsewhere at every step");
  }
  std::vector<float> noise;  // an inpainting batch's x_T (--initial-noise)
  for (int first = 0; first < total; first += o.batch) {
    const int B = std::min(o.batch, total - first);
    float* x = images.data() + first * n;
    calls.SetConditioning(conditioning_rows.empty()
                              ? nullptr
                              : conditioning_rows.data() + first * conditioning_floats,
                          B);
    // A model of the sampled channels alone inpaints by keeping the image outside the mask.
    std::optional<KeptImage> kept;
    if (inpainting && conditioning_floats == 0) {
      kept = KeptImage{start.data() + first * n,
                       inpaint.mask.data() + first * size_t(m.height) * m.width, nullptr};
      if (!o.initial_noise.empty()) {
        noise.assign(x, x + B * n);
        kept->noise = noise.data();
      }
    }
    const KeptImage* keep = kept ? &*kept : nullptr;
    if (options.denoising_start) {
      // A denoising end's noisy latents, from where it stopped.
      std::copy_n(start.data() + first * n, B * n, x);
      sampler->Denoise(denoiser, labels.data() + first, B, first, x, keep);
    } else if (!options.strength && o.initial_noise.empty()) {
      sampler->Sample(denoiser, labels.data() + first, B, first, x, keep);
    } else if (o.initial_noise.empty()) {
      sampler->SampleFrom(denoiser, labels.data() + first, B, first, start.data() + first * n, x,
                          keep);
    } else {
      // From --initial-noise's x_T, or its noise on the images.
      if (options.strength) sampler->AddNoise(start.data() + first * n, x, B * n, x);
      sampler->Denoise(denoiser, labels.data() + first, B, first, x, keep);
    }
    spdlog::info("sampled {}/{}", first + B, total);
  }

  // What the PNG and GIF show: the samples, or what the VAE decodes them into.
  std::vector<float> decoded;
  SampleSchema pictures = m;
  if (*vae) {
    Result<SampleSchema> schema = DecodeSamples(**vae, images, total, m, decoded);
    if (!schema.ok()) {
      spdlog::error("{}", schema.status().message());
      return kExitJobFailed;
    }
    pictures = *schema;
  }
  const std::vector<float>& shown = *vae ? decoded : images;
  if (m.video) {
    Status s = WriteVideos(o.out, o.gif, o.gif_delay_cs, shown, total, o.per_class, pictures);
    if (!s.ok()) {
      spdlog::error("{}", s.message());
      return kExitJobFailed;
    }
  } else if (!o.out.empty()) {
    Status s = io::WriteImageGrid(o.out, shown.data(), total, pictures.channels, pictures.height,
                                  pictures.width, o.per_class, kGridPadding);
    if (!s.ok()) {
      spdlog::error("{}", s.message());
      return kExitJobFailed;
    }
    spdlog::info("wrote {}", o.out);
  }
  if (!o.out_dir.empty()) {
    // A text model's samples are captioned with their rows' prompts.
    std::vector<std::string> captions;
    for (int k = 0; k < total && prompts; ++k)
      captions.push_back(prompts->table.captions[prompts->ids[k / o.per_class]]);
    Status s = WriteImageFolder(o.out_dir, shown, total, pictures, captions);
    if (!s.ok()) {
      spdlog::error("{}", s.message());
      return kExitJobFailed;
    }
    spdlog::info("wrote {} images to {}", total, o.out_dir);
  }
  if (!o.raw.empty()) {
    nlohmann::json how = {{"weights", o.weights},
                          {"sampler", sampling->name},
                          {"steps", options.steps},
                          {"timestep_spacing", options.spacing.ToJson()},
                          {"eta", options.eta},
                          {"cfg_scale", options.cfg_scale},
                          {"cfg_interval", o.cfg_interval},
                          {"clip_denoised", options.clip_denoised},
                          {"seed", o.seed}};
    if (!o.initial_noise.empty()) how["initial_noise"] = o.initial_noise;
    if (!start.empty()) {
      how["image"] = o.images;
      if (!options.denoising_start) how["strength"] = strength;
    }
    if (o.denoising_end) how["denoising_end"] = *o.denoising_end;
    if (o.denoising_start) how["denoising_start"] = *o.denoising_start;
    if (inpainting) how["mask"] = o.masks;
    if (kind == SamplerKind::kDpmSolver || kind == SamplerKind::kDpmSolverSinglestep)
      how["dpm_solver"] = options.dpm.ToJson();
    if (kind == SamplerKind::kDeis) how["deis"] = options.deis.ToJson();
    if (kind == SamplerKind::kUniPc) how["unipc"] = options.unipc.ToJson();
    if (distilled) how["lcm"] = options.lcm.ToJson();
    if (options.guidance_rescale != 0) how["guidance_rescale"] = options.guidance_rescale;
    if (!guidance_embedding.empty()) how["embedded_guidance"] = embedded_guidance;
    if (!o.loras.empty()) {
      how["lora"] = o.loras;
      std::vector<double> scales;
      for (size_t i = 0; i < o.loras.size(); ++i)
        scales.push_back(o.LoraScale(i));
      how["lora_scale"] = scales;
    }
    if (ckpt.pretrained) {
      how["pretrained"] = ckpt.path;
      how["diffusion"] = ckpt.diffusion.ToJson();
    } else {
      how["checkpoint"] = ckpt.path;
      how["step"] = ckpt.step;
    }
    nlohmann::json described = how;
    if (*vae) described["vae"] = (*vae)->source();
    std::vector<int64_t> raw_labels(labels.begin(), labels.end());
    if (text_model) {
      // The label of a sample is the class its text names (the table's labels), so that
      // `difftrain eval` scores a prompt's samples against its class; the row without labels.
      std::vector<std::string> texts;
      for (int64_t id : prompts->ids)
        texts.push_back(prompts->table.captions[id]);
      described["prompts"] = texts;
      described["text_ids"] = prompts->ids;
      described["text_table"] = prompts->table_path;
      if (!prompts->text_encoder.empty()) described["text_encoder"] = prompts->text_encoder;
      if (o.negative_prompt) described["negative_prompt"] = *o.negative_prompt;
      for (int64_t& label : raw_labels) {
        if (!prompts->table.labels.empty()) label = prompts->table.labels[prompts->ids[label]];
      }
    }
    Status s = WriteRaw(o.raw, images, decoded, pictures, raw_labels, ckpt.model, described);
    if (!s.ok()) {
      spdlog::error("{}", s.message());
      return kExitJobFailed;
    }
    spdlog::info("wrote {}", o.raw);
  }
  return kExitOk;
}

}  // namespace

DIFFTRAIN_COMMAND(kSample, {"sample",
                            "Draw samples of a checkpoint or pretrained weights: classes or "
                            "prompts, image to image, inpainting",
                            [](CLI::App& app) {
                              auto o = std::make_shared<SampleOptions>();
                              const std::vector<CLI::Option*> diffusion = AddSampleOptions(app, *o);
                              return [o, diffusion] {
                                o->model_given = o->model.given();
                                o->diffusion_given = std::any_of(
                                    diffusion.begin(), diffusion.end(),
                                    [](const CLI::Option* d) { return d->count() > 0; });
                                return o->watch ? WatchCheckpoints(*o, RunSample) : RunSample(*o);
                              };
                            }});

}  // namespace difftrain::launch
