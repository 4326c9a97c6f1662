#include "model/text/encoder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/layernorm.h"
#include "model/cpu/linear.h"
#include "model/io/ldm_checkpoint.h"
#include "model/io/safetensors.h"
#include "model/text/activation.h"
#include "model/text/encoder_names.h"
#include "model/train/initial_weights.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

// The position whose state transformers' CLIPTextTransformer pools: the first
// `eos_token_id`, or (with the legacy id 2) the first of the largest id, as
// input_ids.argmax(-1) takes it. A text without the id pools position 0, as argmax over
// zeros does.
int PooledPosition(const std::vector<int32_t>& ids, int eos_token_id) {
  if (eos_token_id == 2)
    return static_cast<int>(std::max_element(ids.begin(), ids.end()) - ids.begin());
  const auto eos = std::find(ids.begin(), ids.end(), eos_token_id);
  return eos == ids.end() ? 0 : static_cast<int>(eos - ids.begin());
}

// LayerNorm with its affine parameters over rows of C: out may be in.
void AffineLayerNorm(float* out, const float* in, const float* gamma, const float* beta, int N,
                     int C, double eps) {
  std::vector<float> mean(N), rstd(N);
  cpu::LayerNormForward(out, mean.data(), rstd.data(), in, N, C, static_cast<float>(eps));
  for (int n = 0; n < N; ++n) {
    float* row = out + size_t(n) * C;
    for (int c = 0; c < C; ++c)
      row[c] = row[c] * gamma[c] + beta[c];
  }
}

// Multi-head attention of each of N texts of L tokens over its own keys: q, k, v and out are
// [N·L, D]. Query i sees key j where allowed(n, i, j): BERT the real tokens, CLIP j <= i.
template <typename Allowed>
void Attention(float* out, const float* q, const float* k, const float* v, int N, int L, int D,
               int H, Allowed allowed) {
  const int hd = D / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      std::vector<float> p(L);
      for (int i = 0; i < L; ++i) {
        const float* qi = q + (size_t(n) * L + i) * D + h * hd;
        float top = -INFINITY;
        for (int j = 0; j < L; ++j) {
          if (!allowed(n, i, j)) {
            p[j] = -INFINITY;
            continue;
          }
          const float* kj = k + (size_t(n) * L + j) * D + h * hd;
          float s = 0;
          for (int d = 0; d < hd; ++d)
            s += qi[d] * kj[d];
          p[j] = s * scale;
          top = std::max(top, p[j]);
        }
        float sum = 0;
        for (int j = 0; j < L; ++j) {
          p[j] = p[j] == -INFINITY ? 0.0f : std::exp(p[j] - top);
          sum += p[j];
        }
        float* oi = out + (size_t(n) * L + i) * D + h * hd;
        std::fill(oi, oi + hd, 0.0f);
        for (int j = 0; j < L; ++j) {
          if (p[j] == 0) continue;
          const float w = p[j] / sum;
          const float* vj = v + (size_t(n) * L + j) * D + h * hd;
          for (int d = 0; d < hd; ++d)
            oi[d] += w * vj[d];
        }
      }
    }
  }
}

// The weights file and config.json that `path` names (see TextEncoder::Load).
// With `config_only`, a folder's config.json alone will do (the weights come from elsewhere).
Result<std::pair<fs::path, fs::path>> EncoderFiles(const std::string& path, bool config_only) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec))
    return std::pair(fs::path(path), fs::path(path).parent_path() / "config.json");
  if (!fs::is_directory(path, ec))
    return Errorf("text encoder '{}': no such file or directory", path);
  for (const char* sub : {"", "text_encoder"}) {
    for (const char* name : {"model.safetensors", "model.fp16.safetensors"}) {
      const fs::path file = fs::path(path) / sub / name;
      if (fs::is_regular_file(file, ec)) return std::pair(file, file.parent_path() / "config.json");
    }
  }
  for (const char* sub : {"", "text_encoder"}) {
    const fs::path config = fs::path(path) / sub / "config.json";
    if (config_only && fs::is_regular_file(config, ec)) return std::pair(fs::path(), config);
  }
  return Errorf(
      "text encoder '{}': a directory with no model.safetensors (or its .fp16 variant; in it or "
      "in text_encoder/)",
      path);
}

// The weights of `table` (a CLIP text model of hidden size D) from the OpenCLIP text model under
// `prefix` of an original Stable Diffusion checkpoint (io::LdmOpenClipTensor: q, k and v are row
// ranges of each layer's in_proj; the projection transposed). Errors name the file and the tensor
// missing or misshapen.
Result<std::vector<float>> ReadOpenClip(const io::SafetensorsFile& file, const std::string& prefix,
                                        const TensorTable& table, int64_t D) {
  std::vector<float> weights(table.total()), whole;
  std::unordered_set<std::string> used;
  for (const TensorSpec& t : table.tensors()) {
    const std::optional<io::LdmTensorPart> part = io::LdmOpenClipTensor(t.name, D);
    DT_CHECK(part.has_value(), "no OpenCLIP tensor for '{}'", t.name);
    const std::string name = prefix + part->name;
    used.insert(name);
    float* dst = weights.data() + t.offset;
    if (part->transposed) {
      const int64_t rows = t.shape[0], cols = t.shape[1];
      whole.resize(t.numel);
      DT_RETURN_IF_ERROR(file.CopyAsF32(name, {cols, rows}, whole.data()));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c)
          dst[r * cols + c] = whole[c * rows + r];
      }
      continue;
    }
    if (part->rows < 0) {
      DT_RETURN_IF_ERROR(file.CopyAsF32(name, t.shape, dst));
      continue;
    }
    // A third of in_proj: [3D, D] (its rows D × D) or [3D].
    std::vector<int64_t> shape = t.shape;
    shape[0] = 3 * D;
    whole.resize(t.numel * 3);
    DT_RETURN_IF_ERROR(file.CopyAsF32(name, shape, whole.data()));
    const size_t row = t.numel / t.shape[0];
    std::copy_n(whole.begin() + part->first_row * row, t.numel, dst);
  }
  size_t unused = 0;
  for (const std::string& name : file.Names())
    unused += name.starts_with(prefix) && !used.contains(name);
  spdlog::info(
      "text encoder: the OpenCLIP text model {}* of '{}' ({} of its tensors not read: those past "
      "the config's layers, and the text_projection of a model without one)",
      prefix, file.path(), unused);
  return weights;
}

}  // namespace

TextEncoder::TextEncoder(TextEncoderConfig config, std::vector<float> weights)
    : TextEncoder(Tensors(config), config, std::move(weights)) {}

TextEncoder::TextEncoder(TensorTable table, const TextEncoderConfig& config,
                         std::vector<float> weights)
    : config_(config), table_(std::move(table)), weights_(std::move(weights)) {
  DT_CHECK(weights_.size() == table_.total(), "text encoder weights hold {} floats, the model {}",
           weights_.size(), table_.total());
}

TensorTable TextEncoder::Tensors(const TextEncoderConfig& c) {
  TensorTable table;
  const int64_t D = c.hidden_size, F = c.intermediate_size;
  const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    table.Add(name + ".weight", {out, in});
    table.Add(name + ".bias", {out});
  };
  const auto norm = [&](const std::string& name) {
    table.Add(name + ".weight", {D});
    table.Add(name + ".bias", {D});
  };
  const text::EmbeddingNames e = text::EncoderEmbeddings(c);
  table.Add(e.tokens, {c.vocab_size, D});
  table.Add(e.positions, {c.max_positions, D});
  if (c.kind == TextEncoderKind::kBert) {
    table.Add(e.types, {c.type_vocab_size, D});
    norm(e.norm);
  }
  for (int i = 0; i < c.num_layers; ++i) {
    const text::LayerNames l = text::EncoderLayer(c, i);
    if (c.kind == TextEncoderKind::kClip) norm(l.norm1);
    linear(l.q, D, D);
    linear(l.k, D, D);
    linear(l.v, D, D);
    linear(l.out, D, D);
    if (c.kind == TextEncoderKind::kBert) norm(l.norm1);
    if (c.kind == TextEncoderKind::kClip) norm(l.norm2);
    linear(l.fc1, F, D);
    linear(l.fc2, D, F);
    if (c.kind == TextEncoderKind::kBert) norm(l.norm2);
  }
  if (c.kind == TextEncoderKind::kClip) norm(text::kClipFinalNorm);
  if (c.kind == TextEncoderKind::kClip && c.projection_dim > 0)
    table.Add(text::kClipProjection, {c.projection_dim, D});
  return table;
}

const float* TextEncoder::W(const std::string& name) const {
  const TensorSpec* t = table_.Find(name);
  DT_CHECK(t != nullptr, "text encoder: no tensor '{}'", name);
  return weights_.data() + t->offset;
}

namespace {

Result<TextEncoderConfig> ReadEncoderConfig(const std::string& path, const fs::path& config_path) {
  DT_ASSIGN_OR_RETURN(
      const nlohmann::json json,
      ReadModelConfigJson("text encoder", path, config_path.string(), "transformers"));
  Result<TextEncoderConfig> config = TextEncoderConfig::FromJson(json);
  if (!config.ok())
    return config.status().WithContext(
        fmt::format("text encoder config '{}'", config_path.string()));
  return config;
}

}  // namespace

Result<TextEncoderConfig> TextEncoder::ReadConfig(const std::string& path) {
  DT_ASSIGN_OR_RETURN(const auto files, EncoderFiles(path, /*config_only=*/false));
  return ReadEncoderConfig(path, files.second);
}

Result<TextEncoder> TextEncoder::Load(const std::string& path,
                                      const io::SafetensorsFile* weights_from, size_t part) {
  DT_ASSIGN_OR_RETURN(const auto files, EncoderFiles(path, weights_from != nullptr));
  const auto& [weights_path, config_path] = files;
  Result<TextEncoderConfig> config = ReadEncoderConfig(path, config_path);
  if (!config.ok()) return config.status();

  std::optional<io::SafetensorsFile> read;
  if (!weights_from) {
    DT_ASSIGN_OR_RETURN(read, io::SafetensorsFile::Map(weights_path));
  }
  const io::SafetensorsFile& file = weights_from ? *weights_from : *read;
  // An original Stable Diffusion checkpoint's text model `part`.
  std::optional<io::LdmTextModel> ldm;
  if (weights_from != nullptr) {
    const std::vector<io::LdmTextModel> models = io::LdmTextModels(file);
    if (part >= models.size()) {
      return Errorf(
          "text encoder '{}': '{}' holds {} text models (an original checkpoint's "
          "cond_stage_model or SDXL's conditioner.embedders), not a text model {}",
          path, file.path(), models.size(), part + 1);
    }
    ldm = models[part];
  }
  // A CLIP text model with its projection (CLIPTextModelWithProjection, or a whole CLIPModel's
  // text half). An original checkpoint's text model has one where its config says so and it is
  // OpenCLIP's with a text_projection (SDXL's second); SD 2.x's is read without.
  if (ldm) {
    if (!ldm->open_clip || file.Find(ldm->prefix + "text_projection") == nullptr)
      config->projection_dim = 0;
  } else if (const io::TensorView* projection = file.Find(text::kClipProjection);
             config->kind == TextEncoderKind::kClip && config->projection_dim == 0 &&
             projection != nullptr && projection->shape.size() == 2 &&
             projection->shape[1] == config->hidden_size) {
    config->projection_dim = static_cast<int>(projection->shape[0]);
  }
  TensorTable table = Tensors(*config);
  std::vector<float> weights;
  if (ldm && ldm->open_clip) {
    if (config->kind != TextEncoderKind::kClip) {
      return Errorf("text encoder '{}': the OpenCLIP text model of '{}' takes a CLIP config", path,
                    file.path());
    }
    DT_ASSIGN_OR_RETURN(weights, ReadOpenClip(file, ldm->prefix, table, config->hidden_size));
  } else {
    // BERT's task models (BertForMaskedLM …) keep the encoder under "bert.", an original
    // checkpoint its CLIP text model under its prefix.
    std::string prefix = ldm ? ldm->prefix : "";
    if (!ldm && file.Find(table.tensors()[0].name) == nullptr &&
        file.Find("bert." + table.tensors()[0].name) != nullptr)
      prefix = "bert.";
    TensorTable spelled;  // the table under the names the file uses
    for (const TensorSpec& t : table.tensors())
      spelled.Add(prefix + t.name, t.shape);
    DT_ASSIGN_OR_RETURN(
        weights, ReadInferenceWeights(file, spelled, fmt::format("text encoder '{}'", path)));
  }
  TextEncoder encoder(std::move(table), *config, std::move(weights));
  encoder.source_ = file.path();
  encoder.config_source_ = config_path.string();
  return encoder;
}

Status TextEncoder::SetTokenEmbeddings(int vocab_size, const std::vector<int32_t>& ids,
                                       const float* rows) {
  if (config_.kind != TextEncoderKind::kClip)
    return Status::Error("text encoder: new token embeddings are for CLIP text models");
  TextEncoderConfig c = config_;
  c.vocab_size = vocab_size;
  TensorTable table = Tensors(c);
  std::vector<float> weights(table.total(), 0.0f);
  for (const TensorSpec& t : table.tensors()) {
    const TensorSpec* old = table_.Find(t.name);
    std::copy_n(weights_.begin() + old->offset, std::min(old->numel, t.numel),
                weights.begin() + t.offset);
  }
  const size_t D = c.hidden_size;
  float* tokens = weights.data() + table.Find(text::EncoderEmbeddings(c).tokens)->offset;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size)
      return Errorf("text encoder: token id {} is outside [0, {})", ids[i], vocab_size);
    std::copy_n(rows + i * D, D, tokens + ids[i] * D);
  }
  config_ = c;
  table_ = std::move(table);
  weights_ = std::move(weights);
  return Status::Ok();
}

Status TextEncoder::Encode(const std::vector<text::Tokens>& texts, int skip_layers, float* out,
                           bool final_norm, float* pooled) const {
  return Forward(texts, skip_layers, final_norm, out, pooled);
}

Status TextEncoder::Pool(const std::vector<text::Tokens>& texts, float* out) const {
  return Forward(texts, 0, true, nullptr, out);
}

Status TextEncoder::InputEmbeddings(const std::vector<text::Tokens>& texts, float* x) const {
  const TextEncoderConfig& c = config_;
  if (c.kind != TextEncoderKind::kClip)
    return Errorf("text encoder ({}): training through it is for CLIP text models", c.Describe());
  DT_RETURN_IF_ERROR(CheckTexts(texts));
  const text::EmbeddingNames e = text::EncoderEmbeddings(c);
  const float* tokens = W(e.tokens);
  const float* positions = W(e.positions);
  const size_t D = c.hidden_size, L = texts.empty() ? 0 : texts[0].ids.size();
  for (size_t n = 0; n < texts.size(); ++n) {
    for (size_t l = 0; l < L; ++l) {
      float* row = x + (n * L + l) * D;
      const float* token = tokens + size_t(texts[n].ids[l]) * D;
      for (size_t d = 0; d < D; ++d)
        row[d] = token[d] + positions[l * D + d];
    }
  }
  return Status::Ok();
}

float* TextEncoder::token_embeddings() {
  return weights_.data() + table_.Find(text::EncoderEmbeddings(config_).tokens)->offset;
}

Status TextEncoder::CheckTexts(const std::vector<text::Tokens>& texts) const {
  const TextEncoderConfig& c = config_;
  if (texts.empty()) return Status::Ok();
  const int N = static_cast<int>(texts.size());
  const int L = static_cast<int>(texts[0].ids.size());
  if (L < 1 || L > c.max_positions) {
    return Errorf("text encoder: texts of {} tokens; it takes 1 to {} (max_position_embeddings)", L,
                  c.max_positions);
  }
  for (int n = 0; n < N; ++n) {
    const text::Tokens& t = texts[n];
    if (static_cast<int>(t.ids.size()) != L || t.mask.size() != t.ids.size())
      return Errorf("text encoder: text {} has {} tokens and {} mask values, text 0 {}", n,
                    t.ids.size(), t.mask.size(), L);
    for (int l = 0; l < L; ++l) {
      if (t.ids[l] < 0 || t.ids[l] >= c.vocab_size)
        return Errorf("text encoder: token {} of text {} is id {}, outside [0, {})", l, n, t.ids[l],
                      c.vocab_size);
    }
  }
  return Status::Ok();
}

Status TextEncoder::Forward(const std::vector<text::Tokens>& texts, int skip_layers,
                            bool final_norm, float* hidden, float* pooled) const {
  const TextEncoderConfig& c = config_;
  if (pooled != nullptr && c.projection_dim == 0) {
    return Errorf(
        "text encoder '{}' ({}): no text_projection, so no pooled output (SDXL's text_encoder_2, "
        "a CLIPTextModelWithProjection, has one)",
        source_.empty() ? "in memory" : source_, c.Describe());
  }
  if (texts.empty()) return Status::Ok();
  DT_RETURN_IF_ERROR(CheckTexts(texts));
  const int N = static_cast<int>(texts.size());
  const int L = static_cast<int>(texts[0].ids.size());
  if (skip_layers < 0 || skip_layers >= c.num_layers) {
    return Errorf("text encoder: cannot skip {} of its {} layers (0 to {})", skip_layers,
                  c.num_layers, c.num_layers - 1);
  }
  const int D = c.hidden_size, F = c.intermediate_size, rows = N * L;
  const bool bert = c.kind == TextEncoderKind::kBert;
  const text::EmbeddingNames e = text::EncoderEmbeddings(c);
  const float* tokens = W(e.tokens);
  const float* positions = W(e.positions);
  const float* type = bert ? W(e.types) : nullptr;  // BERT's token type 0
  std::vector<float> x(size_t(rows) * D);
  for (int n = 0; n < N; ++n) {
    for (int l = 0; l < L; ++l) {
      float* row = x.data() + (size_t(n) * L + l) * D;
      const float* token = tokens + size_t(texts[n].ids[l]) * D;
      const float* position = positions + size_t(l) * D;
      for (int d = 0; d < D; ++d)
        row[d] = token[d] + position[d];
      if (bert) {
        for (int d = 0; d < D; ++d)
          row[d] += type[d];
      }
    }
  }
  if (bert)
    AffineLayerNorm(x.data(), x.data(), W(e.norm + ".weight"), W(e.norm + ".bias"), rows, D,
                    c.layer_norm_eps);

  std::vector<float> h(size_t(rows) * D), q(h.size()), k(h.size()), v(h.size()), a(h.size());
  std::vector<float> mlp(size_t(rows) * F);
  const auto linear = [&](float* y, const float* in, const std::string& name, int I, int O) {
    cpu::LinearForward(y, in, W(name + ".weight"), W(name + ".bias"), rows, I, O);
  };
  const auto norm = [&](float* y, const float* in, const std::string& name) {
    AffineLayerNorm(y, in, W(name + ".weight"), W(name + ".bias"), rows, D, c.layer_norm_eps);
  };
  // The hidden state asked for, after num_layers − skip_layers layers; the pooled output needs
  // them all.
  const int taken = c.num_layers - skip_layers;
  const auto take_hidden = [&] {
    if (!bert && final_norm) {
      norm(hidden, x.data(), text::kClipFinalNorm);
    } else {
      std::copy(x.begin(), x.end(), hidden);
    }
  };
  for (int i = 0; i < (pooled != nullptr ? c.num_layers : taken); ++i) {
    const text::LayerNames l = text::EncoderLayer(c, i);
    // Attention: BERT over x, then add and normalise; CLIP over norm1(x), then add.
    const float* in = x.data();
    if (!bert) {
      norm(h.data(), x.data(), l.norm1);
      in = h.data();
    }
    linear(q.data(), in, l.q, D, D);
    linear(k.data(), in, l.k, D, D);
    linear(v.data(), in, l.v, D, D);
    if (bert) {
      Attention(a.data(), q.data(), k.data(), v.data(), N, L, D, c.num_heads,
                [&texts](int n, int, int j) { return texts[n].mask[j] != 0; });
    } else {
      Attention(a.data(), q.data(), k.data(), v.data(), N, L, D, c.num_heads,
                [](int, int i, int j) { return j <= i; });
    }
    linear(h.data(), a.data(), l.out, D, D);
    for (size_t j = 0; j < x.size(); ++j)
      x[j] += h[j];
    if (bert) norm(x.data(), x.data(), l.norm1);
    // The MLP: likewise.
    in = x.data();
    if (!bert) {
      norm(h.data(), x.data(), l.norm2);
      in = h.data();
    }
    linear(mlp.data(), in, l.fc1, D, F);
    text::Activate(c.activation, mlp.data(), mlp.size());
    linear(h.data(), mlp.data(), l.fc2, F, D);
    for (size_t j = 0; j < x.size(); ++j)
      x[j] += h[j];
    if (bert) norm(x.data(), x.data(), l.norm2);
    if (i + 1 == taken && hidden != nullptr) take_hidden();
  }
  if (pooled == nullptr) return Status::Ok();

  // The pooled output: each text's end-of-text row of the last hidden state, through the final
  // LayerNorm, then the projection (no bias).
  std::vector<float> ends(size_t(N) * D);
  for (int n = 0; n < N; ++n) {
    const int l = PooledPosition(texts[n].ids, c.eos_token_id);
    std::copy_n(x.data() + (size_t(n) * L + l) * D, D, ends.data() + size_t(n) * D);
  }
  AffineLayerNorm(ends.data(), ends.data(), W(std::string(text::kClipFinalNorm) + ".weight"),
                  W(std::string(text::kClipFinalNorm) + ".bias"), N, D, c.layer_norm_eps);
  cpu::LinearForward(pooled, ends.data(), W(text::kClipProjection),
                     static_cast<const float*>(nullptr), N, D, c.projection_dim);
  return Status::Ok();
}

}  // namespace difftrain
