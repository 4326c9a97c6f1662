#include "launch/sample_prompts.h"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "model/data/latent_folder.h"
#include "model/io/ldm_checkpoint.h"
#include "model/io/lora.h"
#include "model/text/embedder.h"
#include "model/train/text_encoder_lora.h"
#include "model/train/textual_inversion.h"

namespace difftrain::launch {
namespace {

namespace fs = std::filesystem;

// The text encoder given for the prompts: --text-encoder, else pretrained weights' pipeline
// if it has a text_encoder/ (or, SDXL's refiner, a text_encoder_2/ alone); "" for none (`none`
// included).
std::string GivenTextEncoder(const SampleOptions& o, const SampleSource& ckpt) {
  if (o.text_encoder == "none") return "";
  if (!o.text_encoder.empty()) return o.text_encoder;
  if (!ckpt.trained_text_encoder.empty()) return ckpt.trained_text_encoder;
  std::error_code ec;
  // SDXL's refiner has text_encoder_2/ alone.
  if (!ckpt.pipeline.empty() && (fs::is_directory(fs::path(ckpt.pipeline) / "text_encoder", ec) ||
                                 fs::is_directory(fs::path(ckpt.pipeline) / "text_encoder_2", ec)))
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
  // An original Stable Diffusion checkpoint's own text models, with the configs and tokenizers
  // of the encoder given, which the file lacks.
  const bool own =
      ckpt.single_file && path != table.text_encoder && !io::LdmTextModels(*ckpt.file).empty();
  if (ckpt.single_file && !own && path != table.text_encoder) {
    spdlog::info("{} holds no text model: the prompts are embedded by {} with its own weights",
                 ckpt.path, path);
  }
  Result<TextEmbedder> embedder = TextEmbedder::Load(path, own ? &*ckpt.file : nullptr);
  if (own && embedder.ok()) {
    spdlog::info(
        "the text encoder: {}'s own (cond_stage_model, conditioner.embedders), with the config "
        "and tokenizer of {}",
        ckpt.path, path);
  }
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

}  // namespace

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
  // Every prompt embedded by the encoder: from pretrained weights, from a checkpoint whose
  // training data had no text table (synthetic texts), or from one that trained through the
  // encoder (a textual inversion's, whose table's embeddings were made without its token; a LoRA
  // of the encoder, whose table's were made before it was adapted).
  const bool tableless = ckpt.data_kind != "latent_folder" || ckpt.data_path.empty() ||
                         !ckpt.inversion_token.empty() || ckpt.text_lora.has_value();
  const bool encoder_only = p.table_path.empty() && (ckpt.pretrained || tableless) &&
                            !GivenTextEncoder(o, ckpt).empty() && o.caption_ids.empty();
  if (p.table_path.empty() && !encoder_only) {
    if (ckpt.single_file) {
      return Status::Error(
          "--text-encoder: an original Stable Diffusion checkpoint holds no tokenizer or text "
          "encoder config; give --text-encoder (a CLIP text model's folder or a Stable Diffusion "
          "pipeline's, whose config and tokenizer take the checkpoint's own CLIP weights)");
    }
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
    p.table.pooled_dim = m.pooled_text_dim;
  } else {
    Result<TextTable> table = ReadTextTable(p.table_path);
    if (!table.ok()) return table.status().WithContext("--text-table");
    p.table = std::move(table).value();
  }
  if (p.table.length != m.context_length || p.table.dim != m.context_dim) {
    return Errorf("--text-table: '{}' holds texts of {}x{}, the model takes {}x{}", p.table_path,
                  p.table.length, p.table.dim, m.context_length, m.context_dim);
  }
  // SDXL's UNet takes each text's pooled embedding too.
  if (p.table.pooled_dim != m.pooled_text_dim && m.pooled_text_dim > 0) {
    return Errorf(
        "--text-table: '{}' holds no pooled embeddings of {} features (it has {}), which the "
        "model (SDXL's micro-conditioning) takes with each text; embed its captions with the "
        "model's text encoders (difftrain data embed --encoder PIPELINE)",
        p.table_path, m.pooled_text_dim, p.table.pooled_dim);
  }
  DT_ASSIGN_OR_RETURN(std::optional<TextEmbedder> encoder,
                      PromptEncoder(o, ckpt, p.table, p.table_path));
  if (encoder && encoder->dim() != m.context_dim) {
    return Errorf("--text-encoder: '{}' embeds {} features per token, the model takes {}",
                  encoder->path(), encoder->dim(), m.context_dim);
  }
  if (encoder && m.pooled_text_dim > 0 && encoder->pooled_dim() != m.pooled_text_dim) {
    return Errorf(
        "--text-encoder: '{}' makes {} pooled features per text, the model takes {} (SDXL's "
        "text_encoder_2 with its projection: give the SDXL pipeline's folder)",
        encoder->path(), encoder->pooled_dim(), m.pooled_text_dim);
  }
  // A LoRA's text encoder part, where every prompt is embedded by the encoder (the UNet's part
  // is fused with the model).
  if (encoder && encoder_only && !o.loras.empty()) {
    TextEncoder& e = encoder->encoder();
    // SDXL's second encoder takes the file's lora_te2_ (text_encoder_2.) part.
    std::vector<io::LoraTarget> text_targets = {{io::kLoraTextEncoder, &e.tensors(), e.weights()}};
    if (TextEncoder* e2 = encoder->encoder_2(); e2 != nullptr)
      text_targets.push_back({io::kLoraTextEncoder2, &e2->tensors(), e2->weights()});
    for (size_t i = 0; i < o.loras.size(); ++i) {
      const std::string& lora = o.loras[i];
      Result<io::LoraFused> fused =
          io::FuseLora(lora, o.LoraScale(i), text_targets, {io::kLoraUNet});
      if (!fused.ok()) return fused.status().WithContext("--lora");
      if (fused->modules > 0) {
        spdlog::info("fused the LoRA {} into {} modules of the text encoder (rank up to {})", lora,
                     fused->modules, fused->rank);
      }
    }
    p.lora_text_encoder = true;
  }
  if (ckpt.text_lora) {
    // The checkpoint's own text encoder adapters: every prompt is embedded with them.
    if (!encoder || !encoder_only) {
      return Status::Error(
          "the checkpoint adapted the text encoder too (lora.train_text_encoder), which reaches "
          "the prompts only where the encoder embeds every prompt (without --text-table or "
          "--captions)");
    }
    if (!o.text_encoder.empty()) {
      spdlog::info("the checkpoint's text encoder adapters go into --text-encoder {}",
                   o.text_encoder);
    }
    DT_RETURN_IF_ERROR(FuseCheckpointTextLora(*ckpt.file, *ckpt.text_lora, o.weights == "ema",
                                              encoder->encoder()));
    spdlog::info("the checkpoint's text encoder adapters ({} weights) fused into {}", o.weights,
                 encoder->path());
  }
  if (!ckpt.inversion_token.empty()) {
    // The checkpoint's own token: every prompt is embedded with it.
    if (!encoder || !encoder_only) {
      return Errorf(
          "the checkpoint trained the textual inversion {}, whose vectors reach the prompts "
          "through a text encoder that embeds every prompt (without --text-table or --captions)",
          ckpt.inversion_token);
    }
    const std::string name = (o.weights == "ema" ? "ema." : "") + std::string(kInversionVectors);
    const io::TensorView* view = ckpt.file->Find(name);
    if (view == nullptr || view->shape.size() != 2)
      return Errorf("'{}': holds no [vectors, D] tensor '{}'", ckpt.file->path(), name);
    std::vector<float> rows(view->shape[0] * view->shape[1]);
    DT_RETURN_IF_ERROR(ckpt.file->CopyF32(name, view->shape, rows.data()));
    Result<std::vector<int32_t>> added = encoder->AddTextualInversion(
        ckpt.inversion_token, static_cast<int>(view->shape[0]), {rows});
    if (!added.ok()) return added.status().WithContext(ckpt.file->path());
    spdlog::info("the checkpoint's textual inversion: the token {} ({} {} vector{})",
                 ckpt.inversion_token, view->shape[0], o.weights, view->shape[0] == 1 ? "" : "s");
  }
  if (!o.textual_inversions.empty()) {
    // New tokens: every prompt must be embedded with them.
    if (!encoder || !encoder_only) {
      return Status::Error(
          "--textual-inversion: its tokens reach the prompts through a text encoder that embeds "
          "every prompt (--pretrained PIPELINE or --text-encoder, without --text-table or "
          "--captions)");
    }
    if (!o.inversion_tokens.empty() && o.inversion_tokens.size() != o.textual_inversions.size()) {
      return Errorf("--textual-inversion-token: give one per --textual-inversion ({}), got {}",
                    o.textual_inversions.size(), o.inversion_tokens.size());
    }
    for (size_t i = 0; i < o.textual_inversions.size(); ++i) {
      DT_RETURN_IF_ERROR(encoder->LoadTextualInversion(
          o.textual_inversions[i], o.inversion_tokens.empty() ? "" : o.inversion_tokens[i]));
      const auto& [token, vectors] = encoder->inversions().back();
      spdlog::info("textual inversion {}: the token {} ({} vector{})", o.textual_inversions[i],
                   token, vectors, vectors == 1 ? "" : "s");
    }
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
    Result<TextEmbeddings> embedded = encoder->EmbedWithPooled(missing, m.context_length, skip);
    if (!embedded.ok()) return embedded.status().WithContext("--prompt");
    p.table.embeddings.insert(p.table.embeddings.end(), embedded->hidden.begin(),
                              embedded->hidden.end());
    if (m.pooled_text_dim > 0)
      p.table.pooled.insert(p.table.pooled.end(), embedded->pooled.begin(), embedded->pooled.end());
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
  // SDXL's pipelines guide with zeros (force_zeros_for_empty_prompt) where no negative prompt
  // is given, unless the pipeline says otherwise (the refiner's): then with the empty prompt's
  // embedding and pooled embedding.
  if (o.negative_prompt) {
    const int64_t negative = *p.table.Find(*o.negative_prompt);
    const float* e = p.table.embedding(negative);
    p.null_text.assign(e, e + p.table.text_floats());
    if (m.pooled_text_dim > 0) {
      const float* pooled = p.table.pooled_embedding(negative);
      p.null_pooled.assign(pooled, pooled + m.pooled_text_dim);
    }
  } else if (ckpt.pretrained && encoder && m.pooled_text_dim == 0) {
    Result<std::vector<float>> empty = encoder->Embed({""}, m.context_length, skip);
    if (!empty.ok()) return empty.status().WithContext("the empty prompt");
    p.null_text = std::move(empty).value();
  } else if (ckpt.pretrained && encoder && !ckpt.zeros_for_empty_prompt) {
    Result<TextEmbeddings> empty = encoder->EmbedWithPooled({""}, m.context_length, skip);
    if (!empty.ok()) return empty.status().WithContext("the empty prompt");
    p.null_text = std::move(empty->hidden);
    p.null_pooled = std::move(empty->pooled);
  }
  return p;
}

}  // namespace difftrain::launch
