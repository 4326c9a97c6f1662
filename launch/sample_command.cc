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

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/log.h"
#include "launch/command.h"
#include "launch/model_options.h"
#include "launch/sample_source.h"
#include "model/data/latent_folder.h"
#include "model/data/text_table.h"
#include "model/diffusion/sampler.h"
#include "model/family/family.h"
#include "model/io/checkpoint.h"
#include "model/io/gif.h"
#include "model/io/png.h"
#include "model/io/safetensors.h"
#include "model/text/embedder.h"
#include "model/train/trainer.h"
#include "model/vae/vae.h"

namespace difftrain::launch {
namespace {

namespace fs = std::filesystem;

struct SampleOptions {
  std::string checkpoint;
  std::string pretrained;  // weights to sample from, with the model (and diffusion) flags
  ModelOptions model;
  DiffusionConfig diffusion;
  bool model_given = false, diffusion_given = false;
  std::vector<int> classes;
  std::vector<std::string> prompts;
  std::vector<int64_t> caption_ids;
  std::string text_table;    // "": the text table of the checkpoint's training data
  std::string text_encoder;  // "": the text table's, if it names one; "none": no encoder
  std::optional<std::string> negative_prompt;  // the text guidance steers away from
  std::optional<int> skip_layers;
  int per_class = 8;
  std::optional<int> steps;
  std::string sampler = "ddpm";
  std::optional<double> eta;
  std::optional<double> cfg;
  std::vector<int> cfg_interval;  // [from, to] in timesteps; empty: every step
  uint64_t seed = 0;
  int batch = 16;
  std::string out;
  std::string gif;
  int gif_delay_cs = 12;
  std::string raw;
  std::string weights = "ema";
  std::optional<bool> clip_denoised;
  std::string vae;  // a diffusers AutoencoderKL decoding a latent model's samples
  std::string log_level = "info";
};

// DiT's sample.py defaults: 250 respaced steps and guidance scale 4.
constexpr int kDefaultSteps = 250;
constexpr double kDefaultGuidance = 4.0;
// Black pixels between the images of the grid.
constexpr int kGridPadding = 2;

// A text model's grid rows: the texts sampled from (rows of `table`).
struct Prompts {
  TextTable table;               // with the prompts a text encoder embedded appended
  std::string table_path;        // "": no table (a pretrained model's prompts, all embedded here)
  std::vector<int64_t> ids;      // one per row
  std::string text_encoder;      // the encoder that embedded prompts here, if one did
  std::vector<float> null_text;  // [L, D]: the unconditional text; empty: zeros
};

// The text encoder given for the prompts: --text-encoder, else pretrained weights' pipeline
// if it has a text_encoder/; "" for none (`none` included).
std::string GivenTextEncoder(const SampleOptions& o, const SampleSource& ckpt) {
  if (o.text_encoder == "none") return "";
  if (!o.text_encoder.empty()) return o.text_encoder;
  std::error_code ec;
  if (!ckpt.pipeline.empty() && fs::is_directory(fs::path(ckpt.pipeline) / "text_encoder", ec))
    return ckpt.pipeline;
  return "";
}

// The text encoder that embeds prompts the table lacks: the one given (GivenTextEncoder),
// else the one the table records (data embed --encoder), else none.
Result<std::optional<TextEmbedder>> PromptEncoder(const SampleOptions& o, const SampleSource& ckpt,
                                                  const TextTable& table,
                                                  const std::string& table_path) {
  if (o.text_encoder == "none") return std::optional<TextEmbedder>();
  std::string path = GivenTextEncoder(o, ckpt);
  if (path.empty()) path = table.text_encoder;
  if (path.empty()) return std::optional<TextEmbedder>();
  Result<TextEmbedder> embedder = TextEmbedder::Load(path);
  if (!embedder.ok()) {
    return embedder.status().WithContext(
        !o.text_encoder.empty() ? std::string("--text-encoder")
        : path == table.text_encoder
            ? fmt::format("the text encoder the text table '{}' was embedded with "
                          "(--text-encoder none: look prompts up only)",
                          table_path)
            : std::string("the pipeline's text encoder"));
  }
  return std::optional<TextEmbedder>(std::move(embedder).value());
}

// The rows a text model samples: each --prompt (found in the text table by its exact text, or
// embedded by the text encoder) and each --captions id. The table is --text-table, or the one
// in the folder the checkpoint was trained from; from --pretrained weights with a text encoder
// it may be none, and the unconditional text is the empty prompt's embedding.
Result<Prompts> ResolvePrompts(const SampleOptions& o, const SampleSource& ckpt,
                               const SampleSchema& m) {
  if (!o.classes.empty()) {
    return Status::Error("--classes: a text-conditional model samples from --prompt or --captions");
  }
  if (o.prompts.empty() && o.caption_ids.empty()) {
    return Status::Error(
        "a text-conditional model needs --prompt TEXT (repeatable) or --captions "
        "IDS");
  }
  Prompts p;
  p.table_path = o.text_table;
  const bool encoder_only = p.table_path.empty() && ckpt.pretrained &&
                            !GivenTextEncoder(o, ckpt).empty() && o.caption_ids.empty();
  if (p.table_path.empty() && !encoder_only) {
    if (ckpt.data_kind != "latent_folder" || ckpt.data_path.empty()) {
      return Status::Error(
          "--text-table: the checkpoint was not trained on a latent folder with "
          "texts; give the text table to take the prompts' embeddings from (or, with "
          "--pretrained, --text-encoder to embed the prompts)");
    }
    p.table_path = ckpt.data_path + "/text.safetensors";
  }
  if (encoder_only) {
    p.table.length = m.context_length;
    p.table.dim = m.context_dim;
  } else {
    Result<TextTable> table = ReadTextTable(p.table_path);
    if (!table.ok()) return table.status().WithContext("--text-table");
    p.table = std::move(table).value();
  }
  if (p.table.length != m.context_length || p.table.dim != m.context_dim) {
    return Errorf("--text-table: '{}' holds texts of {}x{}, the model takes {}x{}", p.table_path,
                  p.table.length, p.table.dim, m.context_length, m.context_dim);
  }
  DT_ASSIGN_OR_RETURN(std::optional<TextEmbedder> encoder,
                      PromptEncoder(o, ckpt, p.table, p.table_path));
  if (encoder && encoder->dim() != m.context_dim) {
    return Errorf("--text-encoder: '{}' embeds {} features per token, the model takes {}",
                  encoder->path(), encoder->dim(), m.context_dim);
  }
  const int skip = o.skip_layers.value_or(encoder_only ? 0 : p.table.skip_layers);
  std::vector<std::string> wanted = o.prompts;  // the rows' texts, then the negative prompt
  if (o.negative_prompt) wanted.push_back(*o.negative_prompt);
  std::vector<std::string> missing;  // texts the table lacks, in order, once each
  for (size_t k = 0; k < wanted.size(); ++k) {
    const std::string& prompt = wanted[k];
    if (p.table.Find(prompt)) continue;
    if (!encoder) {
      return Errorf(
          "{}: '{}' is not in the text table '{}' ({} texts), and no text encoder "
          "embeds new prompts: give one with --text-encoder, or add the prompt to the captions "
          "and embed them again (docs/sampling.md)",
          k < o.prompts.size() ? "--prompt" : "--negative-prompt", prompt, p.table_path,
          p.table.size());
    }
    if (std::find(missing.begin(), missing.end(), prompt) == missing.end())
      missing.push_back(prompt);
  }
  if (!missing.empty()) {
    Result<std::vector<float>> embedded = encoder->Embed(missing, m.context_length, skip);
    if (!embedded.ok()) return embedded.status().WithContext("--prompt");
    p.table.embeddings.insert(p.table.embeddings.end(), embedded->begin(), embedded->end());
    for (const std::string& prompt : missing) {
      p.table.captions.push_back(prompt);
      if (!p.table.labels.empty()) p.table.labels.push_back(-1);  // names no known class
      if (!p.table.held_out.empty()) p.table.held_out.push_back(false);
    }
    p.text_encoder = encoder->path();
    spdlog::info("embedded {} prompt(s) with the text encoder '{}' ({})", missing.size(),
                 encoder->path(), encoder->encoder().config().Describe());
  }
  for (const std::string& prompt : o.prompts)
    p.ids.push_back(*p.table.Find(prompt));
  for (int64_t id : o.caption_ids) {
    if (id < 0 || id >= p.table.size()) {
      return Errorf("--captions: {} is outside the text table's [0, {})", id, p.table.size());
    }
    p.ids.push_back(id);
  }
  // The unconditional text: the negative prompt's; else, for pretrained weights (Stable
  // Diffusion's), guided with the empty prompt's embedding, that; models trained here were
  // guided with zeros (text dropout).
  if (o.negative_prompt) {
    const float* e = p.table.embedding(*p.table.Find(*o.negative_prompt));
    p.null_text.assign(e, e + p.table.text_floats());
  } else if (ckpt.pretrained && encoder) {
    Result<std::vector<float>> empty = encoder->Embed({""}, m.context_length, skip);
    if (!empty.ok()) return empty.status().WithContext("the empty prompt");
    p.null_text = std::move(empty).value();
  }
  return p;
}

// The shape of N samples of `m`: [N, C, H, W], a video model's [N, F, C, H, W].
std::vector<int64_t> SamplesShape(int64_t N, const SampleSchema& m) {
  if (m.video) return {N, m.frames, m.channels, m.height, m.width};
  return {N, m.channels, m.height, m.width};
}

// `decoded`, when not empty, holds the samples through the VAE, shaped as `pictures` says.
Status WriteRaw(const std::string& path, const std::vector<float>& images,
                const std::vector<float>& decoded, const SampleSchema& pictures,
                const std::vector<int64_t>& labels, const ModelSpec& model,
                const nlohmann::json& how) {
  const SampleSchema m = FamilyOf(model).Samples(model);
  io::SafetensorsWriter file;
  const int64_t N = static_cast<int64_t>(labels.size());
  file.AddF32("images", SamplesShape(N, m), images.data());
  if (!decoded.empty()) file.AddF32("decoded", SamplesShape(N, pictures), decoded.data());
  file.Add("labels", io::DType::kI64, {N}, labels.data());
  file.SetMetadata("format", "difftrain-samples");
  file.SetMetadata("version", "1");
  file.SetMetadata("family", model.family);
  file.SetMetadata("config", model.config.dump());
  file.SetMetadata("sampling", how.dump());
  return file.WriteAtomic(path);
}

// A video model's samples: `filmstrip`, a PNG of one row of frames per video, and `gif`, an
// animated GIF whose frame f is the grid (`columns` videos a row) of every video's frame f.
Status WriteVideos(const std::string& filmstrip, const std::string& gif, int delay_cs,
                   const std::vector<float>& videos, int N, int columns, const SampleSchema& m) {
  const size_t frame = size_t(m.channels) * m.height * m.width;
  if (!filmstrip.empty()) {
    DT_RETURN_IF_ERROR(io::WriteImageGrid(filmstrip, videos.data(), N * m.frames, m.channels,
                                          m.height, m.width, m.frames, kGridPadding));
    spdlog::info("wrote {}", filmstrip);
  }
  if (gif.empty()) return Status::Ok();
  std::vector<io::PngImage> grids;
  std::vector<float> frames(N * frame);
  for (int f = 0; f < m.frames; ++f) {
    for (int n = 0; n < N; ++n) {
      std::copy_n(videos.data() + (size_t(n) * m.frames + f) * frame, frame,
                  frames.data() + n * frame);
    }
    DT_ASSIGN_OR_RETURN(io::PngImage grid, io::MakeImageGrid(frames.data(), N, m.channels, m.height,
                                                             m.width, columns, kGridPadding));
    grids.push_back(std::move(grid));
  }
  std::vector<const uint8_t*> pixels;
  for (const io::PngImage& g : grids)
    pixels.push_back(g.pixels.data());
  DT_RETURN_IF_ERROR(
      io::WriteGif(gif, pixels, grids[0].width, grids[0].height, m.channels, delay_cs));
  spdlog::info("wrote {}", gif);
  return Status::Ok();
}

// The VAE that decodes the samples: --vae's; without it, for a PNG or GIF, the one the
// checkpoint's training data (a latent folder) was encoded with, as its index.json names it;
// none with `--vae none`. Checked against the model's samples (its latents) and, for a PNG or
// GIF, its images' channels; nullopt when there is none.
Result<std::optional<Vae>> LoadSampleVae(const SampleOptions& o, const SampleSource& ckpt,
                                         const SampleSchema& m) {
  std::string path = o.vae;
  if (path == "none") return std::optional<Vae>();
  std::error_code ec;
  if (path.empty() && !ckpt.pipeline.empty() && (!o.out.empty() || !o.gif.empty()) &&
      fs::is_directory(fs::path(ckpt.pipeline) / "vae", ec)) {
    path = ckpt.pipeline;
    spdlog::info("decoding with the pipeline's VAE: {}/vae", path);
  }
  if (path.empty()) {
    if (ckpt.data_kind != "latent_folder" || ckpt.data_path.empty() ||
        (o.out.empty() && o.gif.empty())) {
      return std::optional<Vae>();
    }
    Result<std::optional<LatentFolderVae>> encoded = ReadLatentFolderVae(ckpt.data_path);
    if (!encoded.ok() || !*encoded) return std::optional<Vae>();  // nothing says which
    path = (*encoded)->path;
    if (!fs::exists(path, ec)) {
      return Errorf(
          "--vae: the checkpoint's training data '{}' was encoded by the VAE '{}', which is not "
          "there: give --vae PATH, or --vae none for the latents themselves",
          ckpt.data_path, path);
    }
    spdlog::info("decoding with the VAE the training data was encoded with: {} (from {}/{})", path,
                 ckpt.data_path, kLatentFolderIndex);
  }
  Result<Vae> vae = Vae::Load(path);
  if (!vae.ok()) return vae.status().WithContext("--vae");
  const VaeConfig& c = vae->config();
  if (c.latent_channels != m.channels) {
    return Errorf("--vae: '{}' decodes latents of {} channels and this model makes {}",
                  vae->source(), c.latent_channels, m.channels);
  }
  if ((!o.out.empty() || !o.gif.empty()) && c.out_channels != 1 && c.out_channels != 3) {
    return Errorf("--vae: a PNG needs 1 or 3 channels and '{}' decodes {}", vae->source(),
                  c.out_channels);
  }
  return std::optional<Vae>(std::move(vae).value());
}

// Decodes `total` samples of `m` (a video's frames one by one, as its latents were encoded)
// into `pictures` of the returned schema.
Result<SampleSchema> DecodeSamples(const Vae& vae, const std::vector<float>& samples, int total,
                                   const SampleSchema& m, std::vector<float>& pictures) {
  SampleSchema decoded = m;
  decoded.channels = vae.config().out_channels;
  decoded.height = m.height * vae.config().downscale();
  decoded.width = m.width * vae.config().downscale();
  pictures.resize(size_t(total) * decoded.elements());
  const int images = total * m.frames;
  spdlog::info("decoding {} latents through the VAE {}", images, vae.source());
  DT_RETURN_IF_ERROR(vae.Decode(samples.data(), images, m.height, m.width, pictures.data()));
  return decoded;
}

int RunSample(const SampleOptions& o) {
  auto bad = [](const std::string& message) { return ReportBadInput("sample", message); };
  if (Status s = SetupLogging(o.log_level); !s.ok()) return bad(s.message());
  if (o.out.empty() && o.raw.empty() && o.gif.empty())
    return bad("give --out (a PNG grid), --gif (a video model's), --raw, or several");
  if (o.per_class < 1) return bad(fmt::format("--per-class must be positive, got {}", o.per_class));
  if (o.batch < 1) return bad(fmt::format("--batch must be positive, got {}", o.batch));
  Result<SamplerKind> kind = ParseSamplerKind(o.sampler);
  if (!kind.ok()) return bad("--sampler: " + kind.status().message());
  if (o.eta && *kind != SamplerKind::kDdim) return bad("--eta is for --sampler ddim only");

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
  const SampleSource& ckpt = *loaded;
  const ModelFamily& family = FamilyOf(ckpt.model);
  const SampleSchema m = family.Samples(ckpt.model);
  const bool text_model = m.context_length > 0;
  std::optional<Prompts> prompts;
  if (text_model) {
    Result<Prompts> resolved = ResolvePrompts(o, ckpt, m);
    if (!resolved.ok()) return bad(resolved.status().message());
    prompts = std::move(resolved).value();
  } else if (!o.prompts.empty() || !o.caption_ids.empty() || !o.text_table.empty() ||
             !o.text_encoder.empty() || o.skip_layers || o.negative_prompt) {
    return bad(
        "--prompt, --captions, --negative-prompt, --text-table, --text-encoder and "
        "--skip-layers are for text-conditional models");
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
  if (o.gif_delay_cs < 1) return bad("--gif-delay must be positive");
  // An unconditional model draws one row of --per-class samples, label 0.
  std::vector<int> classes = o.classes;
  if (text_model) {
    for (int r = 0; r < num_rows; ++r)
      classes.push_back(r);
  } else if (m.num_classes == 0) {
    if (!classes.empty()) return bad("--classes: this model has no classes");
    classes = {0};
  } else if (classes.empty()) {
    return bad("--classes is required for a class-conditional model");
  }
  for (int label : o.classes) {
    if (label < 0 || label >= m.num_classes) {
      return bad(
          fmt::format("--classes: class {} is outside the model's [0, {})", label, m.num_classes));
    }
  }
  Result<std::optional<Vae>> vae = LoadSampleVae(o, ckpt, m);
  if (!vae.ok()) return bad(vae.status().message());
  if ((!o.out.empty() || !o.gif.empty()) && !*vae && m.channels != 1 && m.channels != 3) {
    return bad(fmt::format(
        "--out: a PNG needs 1 or 3 channels and this model makes {} (latents: decode them "
        "with --vae, a diffusers AutoencoderKL folder)",
        m.channels));
  }

  const GaussianDiffusion diffusion(ckpt.diffusion);
  SamplerOptions options;
  options.kind = *kind;
  options.steps = o.steps.value_or(std::min(kDefaultSteps, diffusion.steps()));
  options.eta = o.eta.value_or(0.0);
  options.cfg_scale = o.cfg.value_or(has_null_class ? kDefaultGuidance : 1.0);
  if (!o.cfg_interval.empty()) {
    if (o.cfg_interval.size() != 2) {
      return bad(fmt::format("--cfg-interval takes two timesteps FROM,TO, got {} values",
                             o.cfg_interval.size()));
    }
    options.cfg_from = o.cfg_interval[0];
    options.cfg_to = o.cfg_interval[1];
  }
  // Pixel models are clipped to the data range at every step; latents (not bounded to
  // [−1, 1]) are not, as DiT's sample.py does for them.
  // (Pretrained weights say nothing of their data: 1- or 3-channel samples are taken for pixels.)
  const bool latents =
      ckpt.pretrained ? m.channels != 1 && m.channels != 3 : ckpt.data_kind == "latent_folder";
  options.clip_denoised = o.clip_denoised.value_or(!latents);
  options.seed = o.seed;
  DenoiserShape shape{
      m.channels, m.height, m.width, m.learn_sigma(), has_null_class ? num_rows : -1, m.frames};
  Result<Sampler> sampler = Sampler::Create(diffusion, shape, options);
  if (!sampler.ok()) return bad(sampler.status().message());

  Result<std::unique_ptr<Model>> created = family.Create(ckpt.model);
  if (!created.ok()) return bad("--checkpoint: " + created.status().message());
  Model& model = **created;
  if (Status s = FillModelWeights(ckpt, o.weights == "ema", model); !s.ok())
    return bad((ckpt.pretrained ? "--pretrained: " : "--checkpoint: ") + s.message());
  const size_t out_floats = m.output_elements();
  auto forward = [&model, out_floats](const float* x_t, const float* t, const int32_t* y,
                                      const float* context, int B, float* out) {
    model.Reserve(B, 1);
    const Status s = model.Forward(0, ModelInputs{x_t, t, y, context}, nullptr, nullptr);
    DT_CHECK(s.ok(), "{}", s.message());
    std::memcpy(out, model.output(0), B * out_floats * sizeof(float));
  };
  Denoiser denoiser = [&forward](const float* x_t, const float* t, const int32_t* y, int B,
                                 float* out) { forward(x_t, t, y, nullptr, B, out); };
  if (text_model) {
    std::vector<float> embeddings;
    for (int64_t id : prompts->ids) {
      const float* e = prompts->table.embedding(id);
      embeddings.insert(embeddings.end(), e, e + prompts->table.text_floats());
    }
    const std::vector<int32_t> no_labels(2 * o.batch, 0);
    denoiser = PromptDenoiser(
        [&forward, &no_labels](const float* x_t, const float* t, const float* context, int B,
                               float* out) { forward(x_t, t, no_labels.data(), context, B, out); },
        std::move(embeddings), m.context_length, m.context_dim, prompts->null_text);
  }

  // Sample k (row-major in the grid) is column k % per_class of the row of class k / per_class.
  const int total = static_cast<int>(classes.size()) * o.per_class;
  std::vector<int32_t> labels(total);
  for (int k = 0; k < total; ++k)
    labels[k] = classes[k / o.per_class];
  const size_t n = m.elements();
  std::vector<float> images(total * n);
  spdlog::info(
      "sampling {} images of {} ({}): {} {} steps{}, guidance {}{}, seed {}", total,
      ckpt.model.name(),
      ckpt.pretrained ? fmt::format("{} weights of {}", o.weights, ckpt.path)
                      : fmt::format("{} weights of step {} in {}", o.weights, ckpt.step, ckpt.path),
      o.sampler, options.steps,
      *kind == SamplerKind::kDdim ? fmt::format(" (eta {})", options.eta) : "", options.cfg_scale,
      o.cfg_interval.empty()
          ? ""
          : fmt::format(" at timesteps {}..{}", options.cfg_from, options.cfg_to),
      o.seed);
  for (int first = 0; first < total; first += o.batch) {
    const int B = std::min(o.batch, total - first);
    sampler->Sample(denoiser, labels.data() + first, B, first, images.data() + first * n);
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
  if (!o.raw.empty()) {
    nlohmann::json how = {{"weights", o.weights},
                          {"sampler", o.sampler},
                          {"steps", options.steps},
                          {"eta", options.eta},
                          {"cfg_scale", options.cfg_scale},
                          {"cfg_interval", o.cfg_interval},
                          {"clip_denoised", options.clip_denoised},
                          {"seed", o.seed}};
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

DIFFTRAIN_COMMAND(
    kSample,
    {"sample", "Draw class-conditional samples from a checkpoint into a PNG grid",
     [](CLI::App& app) {
       auto o = std::make_shared<SampleOptions>();
       app.add_option("--checkpoint", o->checkpoint,
                      "checkpoint directory (its newest complete step) or one step directory");
       app.add_option("--pretrained", o->pretrained,
                      "sample from these weights instead of a checkpoint: a safetensors file "
                      "(DiT's released weights), a diffusers UNet folder or pipeline, or another "
                      "run's checkpoint directory; the model from --model/--config and the shape "
                      "flags (default: a diffusers UNet's config.json), the diffusion from "
                      "--schedule, --beta-start, --beta-end, --prediction (default: a pipeline's "
                      "scheduler config, else DiT's); a pipeline's text_encoder/ and vae/ serve "
                      "as --text-encoder and --vae")
           ->excludes("--checkpoint");
       app.add_option("--classes", o->classes,
                      "class labels, one grid row each: 0,1,2 (required unless the model has "
                      "no classes)")
           ->delimiter(',');
       app.add_option("--prompt", o->prompts,
                      "a text model's prompt, one grid row each (repeat it); found in the text "
                      "table by its exact text, or embedded by the text encoder")
           ->allow_extra_args(false);
       app.add_option("--captions", o->caption_ids, "a text model's rows as text table ids: 0,6,12")
           ->delimiter(',');
       app.add_option("--text-table", o->text_table,
                      "the text embeddings of the prompts (default: text.safetensors of the "
                      "latent folder the checkpoint was trained on)");
       app.add_option("--text-encoder", o->text_encoder,
                      "embeds the prompts the text table lacks: a transformers BERT or CLIP text "
                      "model folder with its tokenizer, or a Stable Diffusion pipeline's folder "
                      "(default: a --pretrained pipeline's, else the encoder the table was "
                      "embedded with, if difftrain's; `none`: look prompts up only)");
       app.add_option("--negative-prompt", o->negative_prompt,
                      "a text model's guidance steers away from this text: its embedding in "
                      "place of the unconditional one (default: zeros, as text dropout trained "
                      "the model; for --pretrained weights with a text encoder the empty "
                      "prompt's, as diffusers)");
       app.add_option("--skip-layers", o->skip_layers,
                      "with a text encoder: the hidden state this many layers before the last "
                      "(default: the table's, else 0)");
       app.add_option("--per-class", o->per_class, "samples per class or prompt (grid columns)")
           ->capture_default_str();
       app.add_option("--steps", o->steps,
                      "sampling steps, respaced from the diffusion's (default 250, or all if "
                      "fewer)");
       app.add_option("--sampler", o->sampler, "ddpm or ddim")->capture_default_str();
       app.add_option("--eta", o->eta, "DDIM eta in [0, 1] (default 0: deterministic)");
       app.add_option("--cfg", o->cfg,
                      "classifier-free guidance scale; 1 = none (default 4, or 1 for a model "
                      "without a null class)");
       app.add_option("--cfg-interval", o->cfg_interval,
                      "guide only the steps whose timestep lies in FROM,TO (e.g. 0,600); "
                      "default: every step")
           ->delimiter(',');
       app.add_option("--seed", o->seed, "seed of the noise")->capture_default_str();
       app.add_option("--batch", o->batch, "samples per model call (twice that with guidance)")
           ->capture_default_str();
       app.add_option("--out", o->out,
                      "PNG grid: one row per class (a video model: a filmstrip, one row of frames "
                      "per video)");
       app.add_option("--gif", o->gif,
                      "a video model's animated GIF: frame f shows the grid of every video's "
                      "frame f, one row per class");
       app.add_option("--gif-delay", o->gif_delay_cs, "GIF frame duration, 1/100 s")
           ->capture_default_str();
       app.add_option("--raw", o->raw,
                      "safetensors file of the samples: images F32 [N, C, H, W] ([N, F, C, H, "
                      "W] for videos), labels I64 [N], and with a VAE decoded F32");
       app.add_option("--weights", o->weights, "ema or model")
           ->check(CLI::IsMember({"ema", "model"}))
           ->capture_default_str();
       app.add_option("--clip-denoised", o->clip_denoised,
                      "clip x0 predictions to [-1, 1] every step (default: true, false for "
                      "models trained on latents)");
       app.add_option("--vae", o->vae,
                      "decode a latent model's samples for --out and --gif (and into --raw's "
                      "`decoded`) with this diffusers AutoencoderKL: its folder, a pipeline's, "
                      "or its safetensors file (default for --out/--gif: a --pretrained "
                      "pipeline's vae/, else the VAE the training data was packed with, if its "
                      "index names one; `none`: no decoding)");
       app.add_option("--log-level", o->log_level, "trace|debug|info|warn|error|off")
           ->capture_default_str();
       // With --pretrained: the model and the diffusion the weights were trained with.
       o->model.AddTo(app);
       const std::vector<CLI::Option*> diffusion = AddDiffusionOptions(app, o->diffusion);
       return [o, diffusion] {
         o->model_given = o->model.given();
         o->diffusion_given = std::any_of(diffusion.begin(), diffusion.end(),
                                          [](const CLI::Option* d) { return d->count() > 0; });
         return RunSample(*o);
       };
     }});

}  // namespace difftrain::launch
