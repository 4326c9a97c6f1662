#include "model/vae/vae.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "common/check.h"
#include "model/cpu/activation.h"
#include "model/cpu/attention.h"
#include "model/cpu/conv2d.h"
#include "model/cpu/groupnorm.h"
#include "model/cpu/linear.h"
#include "model/cpu/upsample.h"
#include "model/cpu/winograd.h"
#include "model/io/ldm_checkpoint.h"
#include "model/io/safetensors.h"
#include "model/tensor/rng.h"
#include "model/train/initial_weights.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

constexpr float kNormEps = 1e-6f;

// One image's activations, [C, H, W]. While the table is being built, only the shape.
struct Map {
  int C = 0, H = 0, W = 0;
  std::vector<float> v;

  Map() = default;
  Map(int c, int h, int w, bool allocate) : C(c), H(h), W(w) {
    if (allocate) v.assign(size(), 0.0f);
  }
  size_t plane() const { return size_t(H) * W; }
  size_t size() const { return size_t(C) * plane(); }
};

// One pass over the architecture, written once for both uses: building the table of tensors
// (`table` given: each layer records its tensors, computes nothing and returns only the
// output's shape) and running the model on weights laid out by that table.
class Pass {
 public:
  Pass(const VaeConfig& c, TensorTable* table) : c_(c), building_(table) {}
  Pass(const VaeConfig& c, const TensorTable& table, const float* weights)
      : c_(c), table_(&table), weights_(weights) {}

  // The images' encoder and quant_conv: the posterior's moments [2·latent, H/f, W/f].
  Map Encoder(const Map& x) {
    const std::vector<int>& channels = c_.block_out_channels;
    Map h = Conv("encoder.conv_in", x, channels[0], 3, 1, 1);
    for (int i = 0; i < c_.levels(); ++i) {
      for (int j = 0; j < c_.layers_per_block; ++j)
        h = Resnet(fmt::format("encoder.down_blocks.{}.resnets.{}.", i, j), h, channels[i]);
      if (i + 1 < c_.levels()) {
        // diffusers' Downsample2D with padding 0: one zero row and column after the last.
        h = Conv(fmt::format("encoder.down_blocks.{}.downsamplers.0.conv", i), PadBottomRight(h),
                 channels[i], 3, 2, 0);
      }
    }
    h = MidBlock("encoder.mid_block.", h);
    h = Norm("encoder.conv_norm_out", h, /*silu=*/true);
    h = Conv("encoder.conv_out", h, 2 * c_.latent_channels, 3, 1, 1);
    return Conv("quant_conv", h, 2 * c_.latent_channels, 1, 1, 0);
  }

  // post_quant_conv and the decoder: unscaled latents [latent, h, w] to an image.
  Map Decoder(const Map& z) {
    const std::vector<int>& channels = c_.block_out_channels;
    Map h = Conv("post_quant_conv", z, c_.latent_channels, 1, 1, 0);
    h = Conv("decoder.conv_in", h, channels.back(), 3, 1, 1);
    h = MidBlock("decoder.mid_block.", h);
    for (int i = 0; i < c_.levels(); ++i) {
      const int out = channels[c_.levels() - 1 - i];
      for (int j = 0; j <= c_.layers_per_block; ++j)
        h = Resnet(fmt::format("decoder.up_blocks.{}.resnets.{}.", i, j), h, out);
      if (i + 1 < c_.levels())
        h = Conv(fmt::format("decoder.up_blocks.{}.upsamplers.0.conv", i), Upsample(h), out, 3, 1,
                 1);
    }
    h = Norm("decoder.conv_norm_out", h, /*silu=*/true);
    return Conv("decoder.conv_out", h, c_.out_channels, 3, 1, 1);
  }

 private:
  bool building() const { return building_ != nullptr; }

  const float* Param(const std::string& name, std::vector<int64_t> shape) {
    if (building()) {
      building_->Add(name, std::move(shape));
      return nullptr;
    }
    const TensorSpec* t = table_->Find(name);
    DT_CHECK(t != nullptr && t->shape == shape, "VAE tensor {} is not in the table as {}", name,
             ShapeString(shape));
    return weights_ + t->offset;
  }

  Map Conv(const std::string& name, const Map& x, int out, int K, int S, int P) {
    const cpu::Conv2dShape s{1, x.C, x.H, x.W, out, K, S, P};
    const float* w = Param(name + ".weight", {out, x.C, K, K});
    const float* b = Param(name + ".bias", {out});
    Map y(out, s.Ho(), s.Wo(), !building());
    // 3×3 convolutions of stride 1 by Winograd's F(2×2, 3×3): 2.25 times fewer multiplies.
    if (!building() && cpu::WinogradTakes(s)) {
      cpu::Conv2dForwardWinograd(y.v.data(), x.v.data(), w, b, s);
    } else if (!building()) {
      cpu::Conv2dForward(y.v.data(), x.v.data(), w, b, s);
    }
    return y;
  }

  // GroupNorm(norm_num_groups, eps 1e-6), then SiLU when asked.
  Map Norm(const std::string& name, const Map& x, bool silu) {
    const float* w = Param(name + ".weight", {x.C});
    const float* b = Param(name + ".bias", {x.C});
    Map y(x.C, x.H, x.W, !building());
    if (building()) return y;
    const cpu::GroupNormShape s{1, x.C, static_cast<int>(x.plane()), c_.norm_num_groups};
    std::vector<float> xhat(x.size()), mean(s.G), rstd(s.G);
    cpu::GroupNormForward(y.v.data(), xhat.data(), mean.data(), rstd.data(), x.v.data(), w, b, s,
                          kNormEps);
    if (silu) cpu::SiluForward(y.v.data(), y.v.data(), y.size());
    return y;
  }

  // Rows [N, in] → [N, out] through name.weight [out, in] and name.bias.
  std::vector<float> Linear(const std::string& name, const std::vector<float>& x, int N, int in,
                            int out) {
    const float* w = Param(name + ".weight", {out, in});
    const float* b = Param(name + ".bias", {out});
    if (building()) return {};
    std::vector<float> y(size_t(N) * out);
    cpu::LinearForward(y.data(), x.data(), w, b, N, in, out);
    return y;
  }

  // ResnetBlock2D without a time embedding: x + conv2(SiLU(GN(conv1(SiLU(GN(x)))))), x through
  // a 1×1 conv_shortcut when the channels change.
  Map Resnet(const std::string& prefix, const Map& x, int out) {
    Map h = Norm(prefix + "norm1", x, true);
    h = Conv(prefix + "conv1", h, out, 3, 1, 1);
    h = Norm(prefix + "norm2", h, true);
    h = Conv(prefix + "conv2", h, out, 3, 1, 1);
    if (x.C != out) {
      const Map shortcut = Conv(prefix + "conv_shortcut", x, out, 1, 1, 0);
      Add(h, shortcut);
    } else {
      Add(h, x);
    }
    return h;
  }

  // x + to_out(softmax(q kᵀ / √C) v) over the H·W pixels as tokens, one head of all C
  // channels, q, k and v from GroupNorm(x).
  Map Attention(const std::string& prefix, const Map& x) {
    const Map h = Norm(prefix + "group_norm", x, false);
    const int T = static_cast<int>(x.plane());
    std::vector<float> tokens;
    if (!building()) tokens = Transposed(h.v, x.C, T);
    const std::vector<float> q = Linear(prefix + "to_q", tokens, T, x.C, x.C);
    const std::vector<float> k = Linear(prefix + "to_k", tokens, T, x.C, x.C);
    const std::vector<float> v = Linear(prefix + "to_v", tokens, T, x.C, x.C);
    std::vector<float> attended;
    if (!building()) {
      attended.resize(tokens.size());
      std::vector<float> probs(size_t(T) * T);
      cpu::AttentionForward(attended.data(), probs.data(), q.data(), x.C, k.data(), v.data(), x.C,
                            1, T, T, x.C, 1);
    }
    const std::vector<float> out = Linear(prefix + "to_out.0", attended, T, x.C, x.C);
    Map y(x.C, x.H, x.W, false);
    if (building()) return y;
    y.v = Transposed(out, T, x.C);
    Add(y, x);
    return y;
  }

  Map MidBlock(const std::string& prefix, const Map& x) {
    Map h = Resnet(prefix + "resnets.0.", x, x.C);
    if (c_.mid_block_add_attention) h = Attention(prefix + "attentions.0.", h);
    return Resnet(prefix + "resnets.1.", h, x.C);
  }

  Map PadBottomRight(const Map& x) const {
    Map y(x.C, x.H + 1, x.W + 1, !building());
    if (building()) return y;
    for (int c = 0; c < x.C; ++c) {
      for (int i = 0; i < x.H; ++i) {
        const float* src = x.v.data() + c * x.plane() + size_t(i) * x.W;
        std::copy(src, src + x.W, y.v.data() + c * y.plane() + size_t(i) * y.W);
      }
    }
    return y;
  }

  Map Upsample(const Map& x) const {
    Map y(x.C, 2 * x.H, 2 * x.W, !building());
    if (!building()) cpu::Upsample2xForward(y.v.data(), x.v.data(), x.C, x.H, x.W);
    return y;
  }

  void Add(Map& y, const Map& x) const {
    if (building()) return;
    for (size_t i = 0; i < y.size(); ++i)
      y.v[i] += x.v[i];
  }

  // [rows, cols] → [cols, rows].
  static std::vector<float> Transposed(const std::vector<float>& x, int rows, int cols) {
    std::vector<float> y(x.size());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c)
        y[size_t(c) * rows + r] = x[size_t(r) * cols + c];
    }
    return y;
  }

  const VaeConfig& c_;
  TensorTable* building_ = nullptr;
  const TensorTable* table_ = nullptr;
  const float* weights_ = nullptr;
};

// diffusers' older checkpoints name the mid blocks' attention query, key, value and
// proj_attn (diffusers renames them as it loads): the older name of `name`, or "".
std::string DeprecatedName(const std::string& name) {
  static const std::pair<const char*, const char*> kRenamed[] = {
      {"to_q.", "query."}, {"to_k.", "key."}, {"to_v.", "value."}, {"to_out.0.", "proj_attn."}};
  const std::string block = ".attentions.0.";
  const size_t at = name.find(block);
  if (at == std::string::npos) return "";
  const size_t start = at + block.size();
  for (const auto& [now, before] : kRenamed) {
    if (name.compare(start, std::string(now).size(), now) == 0)
      return name.substr(0, start) + before + name.substr(start + std::string(now).size());
  }
  return "";
}

// The weights file and config.json that `path` names (see Vae::Load; an original Stable
// Diffusion checkpoint has no config.json).
Result<std::pair<fs::path, fs::path>> VaeFiles(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    return std::pair(fs::path(path), fs::path(path).parent_path() / "config.json");
  }
  if (!fs::is_directory(path, ec)) return Errorf("VAE '{}': no such file or directory", path);
  for (const char* sub : {"", "vae"}) {
    for (const char* name :
         {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"}) {
      const fs::path file = fs::path(path) / sub / name;
      if (fs::is_regular_file(file, ec)) return std::pair(file, file.parent_path() / "config.json");
    }
  }
  return Errorf(
      "VAE '{}': a directory with no diffusion_pytorch_model.safetensors (or its "
      ".fp16 variant; in it or in vae/)",
      path);
}

// Images of H × W for an encoder (whose levels halve them: multiple f), latents for a decoder
// (multiple 1).
Status CheckSize(int N, int H, int W, int multiple, const char* what) {
  if (N < 0 || H <= 0 || W <= 0 || H % multiple != 0 || W % multiple != 0) {
    return Errorf("VAE: {} of {}×{}: height and width must be positive multiples of {}", what, H, W,
                  multiple);
  }
  return Status::Ok();
}

}  // namespace

Vae::Vae(VaeConfig config, std::vector<float> weights)
    : Vae(Tensors(config), config, std::move(weights)) {}

Vae::Vae(TensorTable table, const VaeConfig& config, std::vector<float> weights)
    : config_(config), table_(std::move(table)), weights_(std::move(weights)) {
  DT_CHECK(weights_.size() == table_.total(), "VAE weights hold {} floats, the model {}",
           weights_.size(), table_.total());
}

TensorTable Vae::Tensors(const VaeConfig& config) {
  TensorTable table;
  Pass pass(config, &table);
  const int f = config.downscale();
  pass.Encoder(Map(config.in_channels, 2 * f, 2 * f, false));
  pass.Decoder(Map(config.latent_channels, 2, 2, false));
  return table;
}

Result<Vae> Vae::Load(const std::string& path) {
  DT_ASSIGN_OR_RETURN(const auto files, VaeFiles(path));
  const auto& [weights_path, config_path] = files;
  DT_ASSIGN_OR_RETURN(const io::SafetensorsFile file, io::SafetensorsFile::Map(weights_path));
  return FromFile(file, path, config_path.string());
}

Result<Vae> Vae::Load(const io::SafetensorsFile& file) {
  return FromFile(file, file.path(), "");
}

Result<Vae> Vae::FromFile(const io::SafetensorsFile& file, const std::string& path,
                          const std::string& config_path) {
  // An original Stable Diffusion checkpoint holds its VAE without a config.json.
  const bool ldm = io::HasLdmVae(file);
  std::string config_from = config_path;
  nlohmann::json json;
  if (ldm) {
    DT_ASSIGN_OR_RETURN(json, io::LdmVaeConfig(file));
    config_from = file.path() + "'s first_stage_model";
  } else if (config_path.empty()) {
    return Errorf("VAE '{}': no first_stage_model of an original Stable Diffusion checkpoint",
                  file.path());
  } else {
    DT_ASSIGN_OR_RETURN(json, ReadModelConfigJson("VAE", path, config_path, "diffusers"));
  }
  Result<VaeConfig> config = VaeConfig::FromJson(json);
  if (!config.ok()) return config.status().WithContext(fmt::format("VAE config '{}'", config_from));

  TensorTable table = Tensors(*config);
  std::vector<std::string> names;
  for (const TensorSpec& t : table.tensors())
    names.push_back(t.name);
  if (ldm) names = io::LdmVaeNames(names);
  // The table under the names (and, for 1×1 convolutions, shapes) the file uses.
  TensorTable spelled;
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorSpec& t = table.tensors()[i];
    const std::string before = DeprecatedName(t.name);
    const bool renamed =
        !ldm && file.Find(t.name) == nullptr && !before.empty() && file.Find(before);
    const std::string& name = renamed ? before : names[i];
    // The original attention's q, k, v and proj_out are 1×1 convolutions: [C, C, 1, 1].
    const io::TensorView* in_file = file.Find(name);
    const bool conv = ldm && in_file && in_file->shape.size() == 4 && t.shape.size() == 2 &&
                      in_file->shape[0] == t.shape[0] && in_file->shape[1] == t.shape[1] &&
                      in_file->shape[2] == 1 && in_file->shape[3] == 1;
    spelled.Add(name, conv ? in_file->shape : t.shape);
  }
  DT_ASSIGN_OR_RETURN(std::vector<float> weights,
                      ReadInferenceWeights(file, spelled, fmt::format("VAE '{}'", path)));
  Vae vae(std::move(table), *config, std::move(weights));
  vae.source_ = file.path();
  return vae;
}

Status Vae::EncodeMoments(const float* images, int N, int H, int W, float* mean,
                          float* logvar) const {
  DT_RETURN_IF_ERROR(CheckSize(N, H, W, config_.downscale(), "images"));
  const size_t image = size_t(config_.in_channels) * H * W;
  for (int n = 0; n < N; ++n) {
    Map x(config_.in_channels, H, W, false);
    x.v.assign(images + n * image, images + (n + 1) * image);
    const Map moments = Pass(config_, table_, weights_.data()).Encoder(x);
    const size_t half = moments.size() / 2;
    std::copy(moments.v.begin(), moments.v.begin() + half, mean + n * half);
    for (size_t i = 0; i < half; ++i)
      logvar[n * half + i] = std::clamp(moments.v[half + i], -30.0f, 20.0f);
  }
  return Status::Ok();
}

Status Vae::Encode(const float* images, int N, int H, int W, VaePosterior posterior, uint64_t seed,
                   uint64_t first_index, float* latents) const {
  DT_RETURN_IF_ERROR(CheckSize(N, H, W, config_.downscale(), "images"));
  const int f = config_.downscale();
  const size_t per = size_t(config_.latent_channels) * (H / f) * (W / f);
  std::vector<float> logvar(N * per);
  DT_RETURN_IF_ERROR(EncodeMoments(images, N, H, W, latents, logvar.data()));
  const float scale = static_cast<float>(config_.scaling_factor);
  for (int n = 0; n < N; ++n) {
    Rng rng(seed, RngStream::kVae, first_index + n);
    for (size_t i = n * per; i < (n + 1) * per; ++i) {
      if (posterior == VaePosterior::kSample)
        latents[i] += std::exp(0.5f * logvar[i]) * static_cast<float>(rng.Normal());
      latents[i] *= scale;
    }
  }
  return Status::Ok();
}

Status Vae::Decode(const float* latents, int N, int h, int w, float* images) const {
  DT_RETURN_IF_ERROR(CheckSize(N, h, w, 1, "latents"));
  const size_t per = size_t(config_.latent_channels) * h * w;
  const float scale = static_cast<float>(config_.scaling_factor);
  for (int n = 0; n < N; ++n) {
    Map z(config_.latent_channels, h, w, false);
    z.v.assign(latents + n * per, latents + (n + 1) * per);
    for (float& v : z.v)
      v /= scale;
    const Map image = Pass(config_, table_, weights_.data()).Decoder(z);
    std::copy(image.v.begin(), image.v.end(), images + n * image.size());
  }
  return Status::Ok();
}

}  // namespace difftrain
