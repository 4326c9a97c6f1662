// `difftrain export`: a checkpoint's model written in the forms other tools load
// (docs/export.md): a diffusers folder (UNet2DConditionModel or DiT's Transformer2DModel and its
// scheduler, or a whole pipeline around a base pipeline's other parts), an original single-file
// checkpoint (A1111, ComfyUI, diffusers' from_single_file), the bare state dict of any family, or
// a LoRA run's adapters as a LoRA file.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "launch/command.h"
#include "launch/sample_source.h"
#include "model/family/family.h"
#include "model/io/half.h"
#include "model/io/ldm_checkpoint.h"
#include "model/io/safetensors.h"
#include "model/train/lora_adapters.h"
#include "model/train/textual_inversion.h"

namespace difftrain::launch {
namespace {

namespace fs = std::filesystem;

struct ExportOptions {
  std::string checkpoint, out, format = "diffusers", pipeline, weights = "ema", dtype = "fp32",
                               log_level = "info";
};

// A safetensors file being written, its tensors in one dtype: F32 as given, F16 or BF16
// rounded to nearest even (kept here until written).
class TensorSink {
 public:
  explicit TensorSink(const std::string& dtype)
      : dtype_(dtype == "fp16"   ? io::DType::kF16
               : dtype == "bf16" ? io::DType::kBF16
                                 : io::DType::kF32) {
    file_.SetMetadata("format", "pt");
  }
  void Add(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    if (dtype_ == io::DType::kF32) return file_.AddF32(name, shape, data);
    size_t n = 1;
    for (int64_t d : shape)
      n *= static_cast<size_t>(d);
    std::vector<uint16_t>& bits = halves_.emplace_back(n);
    io::RoundFloats(data, n, dtype_ == io::DType::kBF16, bits.data());
    file_.Add(name, dtype_, shape, bits.data());
  }
  // A tensor of another file, as it is stored there (its dtype).
  void AddStored(const io::TensorView& t, const std::string& name,
                 const std::vector<int64_t>& shape) {
    file_.Add(name, t.dtype, shape, t.data);
  }
  // Bytes of `dtype` kept here until written.
  void AddOwned(const std::string& name, io::DType dtype, const std::vector<int64_t>& shape,
                std::vector<uint8_t> bytes) {
    file_.Add(name, dtype, shape, owned_.emplace_back(std::move(bytes)).data());
  }
  Status Write(const std::string& path) const { return file_.WriteAtomic(path); }

 private:
  io::DType dtype_;
  io::SafetensorsWriter file_;
  std::deque<std::vector<uint16_t>> halves_;
  std::deque<std::vector<uint8_t>> owned_;
};

Status WriteJson(const fs::path& path, const nlohmann::json& json) {
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) return Errorf("cannot write '{}'", path.string());
  return Status::Ok();
}

// The names of the model's parameters (diffusers' for the UNet).
std::vector<std::string> ParameterNames(const Model& model) {
  return model.global_parameter_table().Names();
}

// The model's parameters (under `names`) and fixed tensors into `file`.
void AddModelTensors(const Model& model, const float* params, const std::vector<std::string>& names,
                     TensorSink& file) {
  const std::vector<TensorSpec>& tensors = model.global_parameter_table().tensors();
  for (size_t i = 0; i < tensors.size(); ++i)
    file.Add(names[i], tensors[i].shape, params + tensors[i].offset);
  for (const FixedTensor& f : model.fixed_tensors())
    file.Add(f.name, f.shape, f.data);
}

// The safetensors file of a pipeline part's folder (`names` in order of preference).
Result<std::string> PartFile(const fs::path& folder, std::initializer_list<const char*> names) {
  std::error_code ec;
  for (const char* name : names) {
    if (fs::is_regular_file(folder / name, ec)) return (folder / name).string();
  }
  return Errorf("'{}' holds no {}", folder.string(), *names.begin());
}

// --pipeline's scheduler where it describes the checkpoint's diffusion, else the checkpoint's
// own DDIMScheduler config.
Status WriteScheduler(const SampleSource& source, const fs::path& base, const fs::path& out) {
  std::error_code ec;
  const fs::path config = base / "scheduler" / "scheduler_config.json";
  if (!base.empty() && fs::is_regular_file(config, ec)) {
    std::ifstream in(config);
    const nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
    Result<DiffusionConfig> theirs = DiffusionConfig::FromDiffusersScheduler(json);
    // The same process: the same scheduler keys written of it.
    if (theirs.ok() && theirs->ToDiffusersScheduler() == source.diffusion.ToDiffusersScheduler()) {
      return Status::Ok();  // copied with the rest
    }
    spdlog::info("{}'s scheduler does not describe the checkpoint's diffusion: writing its own",
                 base.string());
  }
  fs::create_directories(out / "scheduler", ec);
  // A model of pixels (1 or 3 channels, not trained on a latent folder) samples clipped, as from
  // its checkpoint; latents are not bounded.
  const int channels = FamilyOf(source.model).Samples(source.model).channels;
  const bool pixels = source.data_kind != "latent_folder" && (channels == 1 || channels == 3);
  return WriteJson(out / "scheduler" / "scheduler_config.json",
                   source.diffusion.ToDiffusersScheduler(pixels));
}

// The model's parameters in its family's diffusers form into `file`: each tensor cut from one
// of them (DiT's qkv as to_q, to_k and to_v, its embedders copied into every block).
Status AddDiffusersTensors(const ModelFamily& family, const Model& model, const float* params,
                           TensorSink& file) {
  const TensorTable& global = model.global_parameter_table();
  DT_ASSIGN_OR_RETURN(const std::vector<ModelFamily::DiffusersTensor> tensors,
                      family.DiffusersTensors(global));
  for (const ModelFamily::DiffusersTensor& d : tensors) {
    const TensorSpec* t = global.Find(d.source);
    if (t == nullptr)
      return Errorf("the diffusers form's '{}' has no source '{}'", d.name, d.source);
    std::vector<int64_t> shape = t->shape;
    size_t first = 0;
    if (d.rows >= 0) {
      if (shape.empty() || d.first_row + d.rows > shape[0])
        return Errorf("'{}': rows beyond '{}' {}", d.name, d.source, ShapeString(shape));
      first = size_t(d.first_row) * (t->numel / size_t(shape[0]));
      shape[0] = d.rows;
    }
    file.Add(d.name, shape, params + t->offset + first);
  }
  return Status::Ok();
}

// --format diffusers into the folder `out`: the model's folder (unet/, DiT's transformer/) and
// scheduler/, and with a base pipeline its other parts and model_index.json.
Status WriteDiffusers(const ExportOptions& o, const SampleSource& source, const Model& model,
                      const float* params, const fs::path& out) {
  const ModelFamily& family = FamilyOf(source.model);
  const std::string component(family.diffusers_component());
  const fs::path base = o.pipeline;
  std::error_code ec;
  if (!base.empty()) {
    if (!fs::is_regular_file(base / "model_index.json", ec))
      return Errorf("--pipeline '{}' is no diffusers pipeline (no model_index.json)", o.pipeline);
    if (!fs::is_directory(base / component, ec)) {
      return Errorf("--pipeline '{}' has no {}/ to put the {} model in", o.pipeline, component,
                    family.name());
    }
    for (const fs::directory_entry& entry : fs::directory_iterator(base, ec)) {
      if (entry.path().filename() == component) continue;
      fs::copy(entry.path(), out / entry.path().filename(), fs::copy_options::recursive, ec);
      if (ec) return Errorf("copying '{}': {}", entry.path().string(), ec.message());
    }
  }
  fs::create_directories(out / component, ec);
  DT_ASSIGN_OR_RETURN(const nlohmann::json config, family.DiffusersConfig(source.model));
  DT_RETURN_IF_ERROR(WriteJson(out / component / "config.json", config));
  TensorSink file(o.dtype);
  DT_RETURN_IF_ERROR(AddDiffusersTensors(family, model, params, file));
  DT_RETURN_IF_ERROR(
      file.Write((out / component / "diffusion_pytorch_model.safetensors").string()));
  return WriteScheduler(source, base, out);
}

// A CLIP text model of `hidden` features into `file` as the original holds an OpenCLIP one under
// `prefix`: each layer's q, k and v rows of one in_proj (bytes of the stored dtype), a projection
// transposed, the rest renamed (model/io/ldm_checkpoint.h's LdmOpenClipTensor, read backwards).
Status AddOpenClip(const io::SafetensorsFile& clip, int64_t hidden, const std::string& prefix,
                   TensorSink& file) {
  struct Merged {
    io::DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Merged> merged;
  for (const std::string& name : clip.Names()) {
    const io::TensorView* t = clip.Find(name);
    std::optional<io::LdmTensorPart> part = io::LdmOpenClipTensor(name, hidden);
    if (!part) return Errorf("the text encoder's '{}' has no place in OpenCLIP's layout", name);
    const std::string ldm = prefix + part->name;
    if (part->transposed) {
      if (t->shape.size() != 2) return Errorf("the text encoder's '{}' is not a matrix", name);
      const int64_t rows = t->shape[0], cols = t->shape[1];
      const size_t size = io::DTypeSize(t->dtype);
      std::vector<uint8_t> bytes(t->bytes);
      const auto* from = static_cast<const uint8_t*>(t->data);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c)
          std::memcpy(bytes.data() + (c * rows + r) * size, from + (r * cols + c) * size, size);
      }
      file.AddOwned(ldm, t->dtype, {cols, rows}, std::move(bytes));
      continue;
    }
    if (part->rows < 0) {
      file.AddStored(*t, ldm, t->shape);
      continue;
    }
    Merged& m = merged[ldm];
    const uint64_t row_bytes = t->bytes / part->rows;
    if (m.bytes.empty()) {
      m.dtype = t->dtype;
      m.shape = t->shape;
      m.shape[0] = 3 * hidden;
      m.bytes.resize(3 * hidden * row_bytes);
    }
    if (t->dtype != m.dtype) return Errorf("'{}': q, k and v of other dtypes", ldm);
    std::memcpy(m.bytes.data() + part->first_row * row_bytes, t->data, t->bytes);
  }
  for (auto& [name, m] : merged)
    file.AddOwned(name, m.dtype, m.shape, std::move(m.bytes));
  return Status::Ok();
}

// A text model of a base pipeline (its folder `part`) and where the original layout holds it.
struct BaseTextModel {
  std::string part;
  std::string prefix;
  bool open_clip = false;
};

// The text models of the base pipeline `base` as the original layout holds them: SD 1.x's CLIP
// ViT-L (quick GELU) under transformers' names; SD 2.x's OpenCLIP ViT-H (GELU) in OpenCLIP's
// layout; SDXL's pair (text_encoder_2/ beside text_encoder/) as CLIP and OpenCLIP under
// conditioner.embedders; SDXL's refiner's one (text_encoder_2/ alone) as OpenCLIP first. Refused
// where the UNet (`sdxl`: one with SDXL's addition embedding; `refiner`: its time ids take an
// aesthetic score) and the base disagree.
Result<std::vector<BaseTextModel>> BaseTextModels(const fs::path& base, bool sdxl, bool refiner) {
  std::error_code ec;
  if (fs::is_directory(base / "text_encoder_2", ec)) {
    if (!sdxl) {
      return Errorf("--pipeline '{}' is SDXL's (text_encoder_2/), the UNet is not", base.string());
    }
    const bool refiner_base = !fs::is_directory(base / "text_encoder", ec);
    if (refiner != refiner_base) {
      return Errorf(
          "--pipeline '{}' is SDXL's {} (text_encoder_2/ {}), and the UNet is SDXL's {} (its time "
          "ids {} an aesthetic score)",
          base.string(), refiner_base ? "refiner" : "base",
          refiner_base ? "alone" : "and text_encoder/", refiner ? "refiner" : "base",
          refiner ? "take" : "take no");
    }
    if (refiner)
      return std::vector<BaseTextModel>{{"text_encoder_2", io::kSgmRefinerOpenClipPrefix, true}};
    return std::vector<BaseTextModel>{{"text_encoder", io::kSgmClipPrefix, false},
                                      {"text_encoder_2", io::kSgmOpenClipPrefix, true}};
  }
  if (sdxl) {
    return Errorf(
        "--pipeline '{}' has no text_encoder_2/: an SDXL UNet's single file takes an SDXL "
        "pipeline's two text encoders",
        base.string());
  }
  std::ifstream text_config(base / "text_encoder" / "config.json");
  const nlohmann::json text = nlohmann::json::parse(text_config, nullptr, false);
  if (text.is_discarded() || !text.contains("hidden_act")) {
    return Errorf("--pipeline '{}': text_encoder/config.json is no CLIP text model's config",
                  base.string());
  }
  const bool open_clip = text["hidden_act"] == "gelu";
  return std::vector<BaseTextModel>{
      {"text_encoder", open_clip ? io::kLdmOpenClipPrefix : io::kLdmClipPrefix, open_clip}};
}

// --format single-file into the file `out`: the UNet under the original names, and with a
// base pipeline its VAE (attention as 1×1 convolutions) and text models (BaseTextModels;
// `refiner`: the UNet is SDXL's refiner's).
Status WriteSingleFile(const ExportOptions& o, const std::vector<std::string>& names,
                       const Model& model, const float* params, bool refiner,
                       const std::string& out) {
  TensorSink file(o.dtype);
  AddModelTensors(model, params, names, file);
  std::deque<io::SafetensorsFile> parts;  // the base's files, mapped until written
  std::vector<std::vector<int64_t>> shapes;
  if (!o.pipeline.empty()) {
    const fs::path base = o.pipeline;
    const bool sdxl = std::any_of(names.begin(), names.end(), [](const std::string& name) {
      return name.starts_with(std::string(io::kLdmUNetPrefix) + "label_emb.");
    });
    DT_ASSIGN_OR_RETURN(const std::vector<BaseTextModel> texts,
                        BaseTextModels(base, sdxl, refiner));
    DT_ASSIGN_OR_RETURN(const std::string vae,
                        PartFile(base / "vae", {"diffusion_pytorch_model.safetensors",
                                                "diffusion_pytorch_model.fp16.safetensors"}));
    DT_ASSIGN_OR_RETURN(io::SafetensorsFile vae_file, io::SafetensorsFile::Map(vae));
    const io::SafetensorsFile& v = parts.emplace_back(std::move(vae_file));
    const std::vector<std::string> vae_names = io::LdmVaeNames(v.Names());
    shapes.reserve(v.Names().size());
    for (size_t i = 0; i < vae_names.size(); ++i) {
      const io::TensorView* t = v.Find(v.Names()[i]);
      shapes.push_back(t->shape);
      // The original's attention is 1×1 convolutions.
      if (vae_names[i].find(".mid.attn_1.") != std::string::npos && t->shape.size() == 2) {
        shapes.back().push_back(1);
        shapes.back().push_back(1);
      }
      file.AddStored(*t, vae_names[i], shapes.back());
    }
    for (const BaseTextModel& text : texts) {
      DT_ASSIGN_OR_RETURN(
          const std::string path,
          PartFile(base / text.part, {"model.safetensors", "model.fp16.safetensors"}));
      DT_ASSIGN_OR_RETURN(io::SafetensorsFile mapped, io::SafetensorsFile::Map(path));
      const io::SafetensorsFile& clip = parts.emplace_back(std::move(mapped));
      if (text.open_clip) {
        const io::TensorView* tokens = clip.Find("text_model.embeddings.token_embedding.weight");
        if (tokens == nullptr || tokens->shape.size() != 2)
          return Errorf("'{}' is no CLIP text model (no token embedding)", path);
        DT_RETURN_IF_ERROR(AddOpenClip(clip, tokens->shape[1], text.prefix, file));
        continue;
      }
      for (const std::string& name : clip.Names())
        file.AddStored(*clip.Find(name), text.prefix + name, clip.Find(name)->shape);
    }
  }
  return file.Write(out);
}

// A LoRA run's adapters (model/train/lora_adapters.h) as the LoRA file diffusers'
// train_text_to_image_lora.py saves and load_lora_weights reads: each adapted module M as
// `unet.M.lora.down.weight` (A) and `unet.M.lora.up.weight` (B), without the `unet.` prefix for
// a family without a diffusers form (which `sample --lora` reads as the model's); alpha / rank
// folded into B, as the file holds no alphas. A DoRA run's in peft's names, which carry its
// magnitudes: `unet.M.lora_A.weight`, `unet.M.lora_B.weight`, `unet.M.lora_magnitude_vector`
// (peft's get_peft_model_state_dict; the older form has no place for them). A text encoder's
// adapters (lora.train_text_encoder) as train_dreambooth_lora.py saves them:
// `text_encoder.M.lora_linear_layer.down.weight` and `….up.weight` (DoRA: peft's names).
Status WriteLora(const ExportOptions& o, const SampleSource& source, bool diffusers_names) {
  const io::SafetensorsFile& shard = *source.file;
  const auto lora = shard.metadata().find("lora");
  Result<LoraConfig> parsed =
      LoraConfig::FromJson(nlohmann::json::parse(lora->second, nullptr, false));
  if (!parsed.ok()) {
    return Errorf("'{}': malformed 'lora' metadata {}: {}", shard.path(), lora->second,
                  parsed.status().message());
  }
  const LoraConfig& adapters = *parsed;
  const std::string down_name = adapters.use_dora ? ".lora_A.weight" : ".lora.down.weight";
  const std::string up_name = adapters.use_dora ? ".lora_B.weight" : ".lora.up.weight";
  const std::string prefix = o.weights == "ema" ? "ema.lora." : "lora.";
  const std::string component = diffusers_names ? "unet." : "";
  TensorSink file(o.dtype);
  std::deque<std::vector<float>> arenas;
  for (const std::string& name : shard.Names()) {
    if (!name.starts_with(prefix) || name.starts_with("lora.base.") ||
        !name.ends_with(".lora_A.weight")) {
      continue;
    }
    const std::string module = name.substr(prefix.size(), name.size() - prefix.size() - 14);
    const std::string up = prefix + module + ".lora_B.weight";
    const io::TensorView* a = shard.Find(name);
    const io::TensorView* b = shard.Find(up);
    if (b == nullptr) return Errorf("'{}': '{}' without '{}'", shard.path(), name, up);
    std::vector<float>& down = arenas.emplace_back(a->bytes / sizeof(float));
    std::vector<float>& upper = arenas.emplace_back(b->bytes / sizeof(float));
    DT_RETURN_IF_ERROR(shard.CopyF32(name, a->shape, down.data()));
    DT_RETURN_IF_ERROR(shard.CopyF32(up, b->shape, upper.data()));
    if (adapters.scale() != 1) {
      for (float& v : upper)
        v = static_cast<float>(v * adapters.scale());
    }
    // The text encoder's modules carry their component's prefix already.
    const bool text = module.starts_with(kLoraTextPrefix);
    const std::string key = (text ? "" : component) + module;
    const bool layer = text && !adapters.use_dora;  // the script's lora_linear_layer form
    file.Add(key + (layer ? ".lora_linear_layer.down.weight" : down_name), a->shape, down.data());
    file.Add(key + (layer ? ".lora_linear_layer.up.weight" : up_name), b->shape, upper.data());
    if (!adapters.use_dora) continue;
    const std::string magnitude = prefix + module + ".lora_magnitude_vector";
    const io::TensorView* m = shard.Find(magnitude);
    if (m == nullptr) return Errorf("'{}': DoRA's '{}' is missing", shard.path(), magnitude);
    std::vector<float>& values = arenas.emplace_back(m->bytes / sizeof(float));
    DT_RETURN_IF_ERROR(shard.CopyF32(magnitude, m->shape, values.data()));
    file.Add(key + ".lora_magnitude_vector", m->shape, values.data());
  }
  if (arenas.empty()) return Errorf("'{}': holds no '{}' adapters", shard.path(), prefix);
  return file.Write(o.out);
}

// A textual inversion's vectors (model/train/textual_inversion.h) as the learned_embeds file
// diffusers' textual_inversion.py saves: one tensor [vectors, D] named by the token, which
// load_textual_inversion and `sample --textual-inversion` read.
Status WriteTextualInversion(const ExportOptions& o, const SampleSource& source) {
  const io::SafetensorsFile& shard = *source.file;
  const auto meta = shard.metadata().find(std::string(kInversionMetadata));
  const nlohmann::json config = nlohmann::json::parse(meta->second, nullptr, false);
  if (!config.is_object() || !config.value("token", nlohmann::json()).is_string()) {
    return Errorf("'{}': malformed '{}' metadata {}", shard.path(), kInversionMetadata,
                  meta->second);
  }
  const std::string name = (o.weights == "ema" ? "ema." : "") + std::string(kInversionVectors);
  const io::TensorView* vectors = shard.Find(name);
  if (vectors == nullptr || vectors->shape.size() != 2)
    return Errorf("'{}': holds no [vectors, D] tensor '{}'", shard.path(), name);
  std::vector<float> values(vectors->shape[0] * vectors->shape[1]);
  DT_RETURN_IF_ERROR(shard.CopyF32(name, vectors->shape, values.data()));
  TensorSink file(o.dtype);
  file.Add(config["token"].get<std::string>(), vectors->shape, values.data());
  return file.Write(o.out);
}

int RunExport(const ExportOptions& o) {
  auto bad = [](const std::string& message) { return ReportBadInput("export", message); };
  if (Status s = SetupLogging(o.log_level); !s.ok()) return bad(s.message());
  if (o.checkpoint.empty() || o.out.empty()) return bad("give --checkpoint DIR and --out PATH");
  Result<SampleSource> source = LoadCheckpointSource(o.checkpoint);
  if (!source.ok()) return bad("--checkpoint: " + source.status().message());
  const ModelFamily& family = FamilyOf(source->model);
  if ((o.format == "state-dict" || o.format == "lora" || o.format == "textual-inversion") &&
      !o.pipeline.empty())
    return bad("--pipeline is for --format diffusers and single-file");
  if (source->text_lora && (o.format == "diffusers" || o.format == "single-file")) {
    // The model's weights hold the UNet's adapters fused, not the text encoder's.
    if (!o.pipeline.empty()) {
      return bad(fmt::format(
          "--pipeline: the checkpoint adapted the text encoder too (lora.train_text_encoder), "
          "and --format {} would carry the pipeline's text encoder without its adapters; export "
          "--format lora (diffusers' load_lora_weights and `sample --lora` take both parts)",
          o.format));
    }
    spdlog::warn(
        "the checkpoint adapted the text encoder too (lora.train_text_encoder): this export is "
        "the UNet alone; --format lora writes both parts' adapters");
  }
  std::error_code ec;
  const fs::path out = o.out;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    return bad(fmt::format("--out '{}' exists: export writes a new file or folder", o.out));
  if (o.format == "textual-inversion") {
    if (!source->file->metadata().contains(std::string(kInversionMetadata))) {
      return bad(
          "--format textual-inversion: the checkpoint trained no textual inversion (the job's "
          "textual_inversion section)");
    }
    if (Status s = WriteTextualInversion(o, *source); !s.ok()) {
      spdlog::error("{}", s.message());
      return kExitJobFailed;
    }
    spdlog::info("wrote {} ({} textual inversion vectors, step {}, in {})", o.out, o.weights,
                 source->step, o.dtype);
    return kExitOk;
  }
  if (o.format == "lora") {
    if (!source->file->metadata().contains("lora")) {
      return bad(
          "--format lora: the checkpoint trained the whole model, not LoRA adapters (the job's "
          "lora section); export it as diffusers, single-file or state-dict");
    }
    // diffusers' LoRA files (load_lora_weights) are the Stable Diffusion pipelines'; DiTPipeline
    // loads none, so a DiT's adapters keep DiT's names.
    const bool diffusers_names =
        family.DiffusersConfig(source->model).ok() && family.diffusers_component() == "unet";
    if (Status s = WriteLora(o, *source, diffusers_names); !s.ok()) {
      spdlog::error("{}", s.message());
      return kExitJobFailed;
    }
    spdlog::info("wrote {} ({} LoRA adapters of {}, step {}, in {})", o.out, o.weights,
                 source->model.name(), source->step, o.dtype);
    return kExitOk;
  }
  Result<std::unique_ptr<Model>> created = family.CreateForInference(source->model);
  if (!created.ok()) return bad("--checkpoint: " + created.status().message());
  Model& model = **created;
  // What the family has of the form asked for.
  std::vector<std::string> single_file_names;
  if (o.format == "diffusers") {
    if (Result<nlohmann::json> c = family.DiffusersConfig(source->model); !c.ok())
      return bad("--format diffusers: " + c.status().message());
  } else if (o.format == "single-file") {
    Result<std::vector<std::string>> names = family.SingleFileNames(ParameterNames(model));
    if (!names.ok()) return bad("--format single-file: " + names.status().message());
    single_file_names = std::move(names).value();
  }
  if (Status s = FillModelWeights(*source, o.weights == "ema", model); !s.ok())
    return bad("--checkpoint: " + s.message());

  Status written;
  if (o.format == "diffusers") {
    // Built beside, then renamed: a failed export leaves no half folder under --out.
    const fs::path partial = out.string() + ".partial";
    fs::remove_all(partial, ec);
    fs::create_directories(partial, ec);
    written = WriteDiffusers(o, *source, model, model.params(), partial);
    if (written.ok()) {
      fs::remove(out, ec);
      fs::rename(partial, out, ec);
      if (ec) written = Errorf("renaming '{}' to '{}': {}", partial.string(), o.out, ec.message());
    }
    if (!written.ok()) fs::remove_all(partial, ec);
  } else if (o.format == "single-file") {
    written = WriteSingleFile(o, single_file_names, model, model.params(),
                              family.Samples(source->model).aesthetic_score, o.out);
  } else {
    TensorSink file(o.dtype);
    AddModelTensors(model, model.params(), ParameterNames(model), file);
    written = file.Write(o.out);
  }
  if (!written.ok()) {
    spdlog::error("{}", written.message());
    return kExitJobFailed;
  }
  spdlog::info("wrote {} ({} weights of {}, step {}, as {} in {})", o.out, o.weights,
               source->model.name(), source->step, o.format, o.dtype);
  return kExitOk;
}

}  // namespace

DIFFTRAIN_COMMAND(
    kExport,
    {"export", "Write a checkpoint's model for diffusers, A1111/ComfyUI or as a state dict",
     [](CLI::App& app) {
       auto o = std::make_shared<ExportOptions>();
       app.add_option("--checkpoint", o->checkpoint,
                      "checkpoint directory (its newest complete step) or one step directory")
           ->required();
       app.add_option("--out", o->out,
                      "the folder (diffusers) or safetensors file (single-file, state-dict) to "
                      "write; it must not exist")
           ->required();
       app.add_option("--format", o->format,
                      "diffusers: a UNet2DConditionModel folder in unet/ (DiT: a "
                      "Transformer2DModel in transformer/) and its DDIMScheduler in scheduler/ "
                      "(a whole pipeline with --pipeline); single-file: an "
                      "original Stable Diffusion checkpoint; state-dict: the model's tensors "
                      "under difftrain's names (any family); lora: a LoRA run's adapters as "
                      "diffusers' LoRA file (load_lora_weights, `sample --lora`); "
                      "textual-inversion: a textual inversion's vectors as diffusers' "
                      "learned_embeds.safetensors (load_textual_inversion, `sample "
                      "--textual-inversion`)")
           ->check(CLI::IsMember(
               {"diffusers", "single-file", "state-dict", "lora", "textual-inversion"}))
           ->capture_default_str();
       app.add_option("--pipeline", o->pipeline,
                      "a pipeline folder whose other parts (text encoder, tokenizer, VAE, "
                      "scheduler) go with the model: a diffusers pipeline (Stable Diffusion's; "
                      "DiTPipeline's for a DiT), or the VAE and CLIP text model of a single file");
       app.add_option("--dtype", o->dtype,
                      "the UNet's (the model's) tensors: fp32, or fp16 or bf16 rounded to "
                      "nearest even (--pipeline's parts keep their own)")
           ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
           ->capture_default_str();
       app.add_option("--weights", o->weights, "ema or model")
           ->check(CLI::IsMember({"ema", "model"}))
           ->capture_default_str();
       app.add_option("--log-level", o->log_level, "trace|debug|info|warn|error|off")
           ->capture_default_str();
       return [o] { return RunExport(*o); };
     }});

}  // namespace difftrain::launch
