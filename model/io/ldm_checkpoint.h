// Stable Diffusion's original single-file checkpoints: the CompVis latent-diffusion layout that
// SD 1.x/2.x releases, A1111 and most fine-tunes ship as one model.safetensors, the UNet under
// model.diffusion_model.*, the VAE under first_stage_model.*, the text encoder under
// cond_stage_model.*. The weights are diffusers' own under other names; this maps diffusers'
// names (the names difftrain's UNet and VAE use) to the file's, as diffusers'
// convert_ldm_unet_checkpoint and convert_ldm_vae_checkpoint map them the other way, and reads
// the models' configs from the tensors' names and shapes, since the file holds none.
//
// UNet (L resnets a down level, L + 1 an up level):
//   conv_in → input_blocks.0.0, time_embedding.linear_1/2 → time_embed.0/2,
//   down_blocks.b.resnets.l → input_blocks.(1 + b(L+1) + l).0, .attentions.l → ….1,
//   down_blocks.b.downsamplers.0.conv → input_blocks.((b+1)(L+1)).0.op,
//   mid_block.resnets.0, attentions.0, resnets.1 → middle_block.0, 1, 2,
//   up_blocks.b.resnets.l → output_blocks.(b(L+1) + l).0, .attentions.l → ….1,
//   up_blocks.b.upsamplers.0.conv → output_blocks.(b(L+1) + L).(2 with attention, else 1).conv,
//   conv_norm_out, conv_out → out.0, out.2; within a resnet norm1, conv1, time_emb_proj, norm2,
//   conv2, conv_shortcut → in_layers.0, in_layers.2, emb_layers.1, out_layers.0, out_layers.3,
//   skip_connection; a transformer's names are the same in both.
// VAE (n levels): encoder.down_blocks.i.resnets.j → encoder.down.i.block.j,
//   downsamplers.0.conv → downsample.conv; decoder.up_blocks.i → decoder.up.(n − 1 − i),
//   upsamplers.0.conv → upsample.conv; mid_block.resnets.0/1 → mid.block_1/2;
//   mid_block.attentions.0.group_norm, to_q, to_k, to_v, to_out.0 → mid.attn_1.norm, q, k, v,
//   proj_out (1×1 convolutions there: [C, C, 1, 1] for diffusers' [C, C]); conv_norm_out →
//   norm_out; conv_shortcut → nin_shortcut.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/io/safetensors.h"

namespace difftrain::io {

inline constexpr char kLdmUNetPrefix[] = "model.diffusion_model.";
inline constexpr char kLdmVaePrefix[] = "first_stage_model.";
// SD 1.x's CLIP text model, under transformers' own names after this prefix; SD 2.x's OpenCLIP
// text model under OpenCLIP's names after the other.
inline constexpr char kLdmClipPrefix[] = "cond_stage_model.transformer.";
inline constexpr char kLdmOpenClipPrefix[] = "cond_stage_model.model.";
// SDXL's original (SGM) layout holds its two: CLIP ViT-L as SD 1.x's, OpenCLIP ViT-bigG with
// its text_projection.
inline constexpr char kSgmClipPrefix[] = "conditioner.embedders.0.transformer.";
inline constexpr char kSgmOpenClipPrefix[] = "conditioner.embedders.1.model.";
// SDXL's refiner holds the OpenCLIP ViT-bigG alone, first.
inline constexpr char kSgmRefinerOpenClipPrefix[] = "conditioner.embedders.0.model.";

// Whether `file` (its header suffices) holds an LDM UNet (model.diffusion_model.*), an LDM VAE
// (first_stage_model.*), and whether it is SDXL's (the UNet's addition embedding as label_emb.0,
// or SDXL's text models).
bool IsLdmCheckpoint(const SafetensorsFile& file);
bool HasLdmVae(const SafetensorsFile& file);
bool IsSdxlCheckpoint(const SafetensorsFile& file);
// Whether it is SDXL's refiner (its one text model, OpenCLIP's, as conditioner.embedders.0).
bool IsSdxlRefinerCheckpoint(const SafetensorsFile& file);

// A text model an original checkpoint holds: its tensors' prefix, and whether they are named as
// OpenCLIP's (else as transformers' CLIPTextModel).
struct LdmTextModel {
  std::string prefix;
  bool open_clip = false;
};
// The file's text models in the order a pipeline takes them: SD 1.x's CLIP, SD 2.x's OpenCLIP,
// SDXL's CLIP and OpenCLIP (text_encoder, text_encoder_2), or the refiner's OpenCLIP (its
// text_encoder_2); none for a file without.
std::vector<LdmTextModel> LdmTextModels(const SafetensorsFile& file);

// Where an OpenCLIP text model (after its prefix) holds the tensor transformers' CLIPTextModel
// names `name` (hidden size `hidden`): token_embedding, positional_embedding, ln_final; per layer
// ln_1, ln_2, attn.out_proj, mlp.c_fc, mlp.c_proj, and q, k, v as rows [0, D), [D, 2D), [2D, 3D)
// of attn.in_proj, as diffusers' create_text_encoder_from_open_clip_checkpoint splits them; a
// CLIPTextModelWithProjection's text_projection.weight [P, D] as text_projection [D, P], its
// transpose (OpenCLIP multiplies by it from the right). nullopt for a name it has no place for.
struct LdmTensorPart {
  std::string name;
  int64_t first_row = 0;
  int64_t rows = -1;  // -1: the whole tensor
  bool transposed = false;
};
std::optional<LdmTensorPart> LdmOpenClipTensor(const std::string& name, int64_t hidden);

// The file's name of each UNet tensor diffusers names `names` (a UNet2DConditionModel's
// parameters: its layers per block and which up blocks attend are read from the names
// themselves), SDXL's addition embedding as its original (SGM) layout's label_emb.0.0 and .0.2.
// Errors name a tensor the layout has no place for (time_cond_proj_dim's cond_proj, class
// embeddings).
Result<std::vector<std::string>> LdmUNetNames(const std::vector<std::string>& names);
// The same without the prefix, nullopt for a name that has no place: what kohya's LoRAs name
// their modules by.
std::vector<std::optional<std::string>> SgmUNetNames(const std::vector<std::string>& names);

// The UNet2DConditionModel config.json of the file's UNet: in and out channels, channels per
// level, resnets per level, which levels attend, the cross-attention width, transformer depth
// (one per level where the levels differ) and linear or convolutional projections from the
// tensors; what the tensors cannot say, as Stable Diffusion's configs have it: 8 heads (SD 1.x,
// convolutional projections) or heads of 64 channels (SD 2.x, SDXL: linear projections),
// GroupNorm of 32, sample_size 64 (512 px; SDXL's 128, 1024 px). SDXL's addition embedding
// (label_emb.0) is its text_time micro-conditioning: projection_class_embeddings_input_dim from
// its tensor, addition_time_embed_dim the rest after the pooled text (the OpenCLIP model's
// text_projection) over 6 time ids, else SDXL's 256; the refiner's over 5, the aesthetic score
// among them (requires_aesthetics_score, difftrain's key). The mid block's transformer depth is
// the last level's, as diffusers builds it: a last level without attention takes the mid
// block's. Errors say what is missing or uneven, and refuse class embeddings by name.
Result<nlohmann::json> LdmUNetConfig(const SafetensorsFile& file);

// The file's name of each VAE tensor diffusers' AutoencoderKL names `names` (its levels read
// from the names).
std::vector<std::string> LdmVaeNames(const std::vector<std::string>& names);

// The AutoencoderKL config.json of the file's VAE: channels per level, resnets per level, image
// and latent channels from the tensors; GroupNorm of 32 and scaling_factor 0.18215, as Stable
// Diffusion 1.x/2.x's (SDXL's 0.13025, as its original config's scale_factor).
Result<nlohmann::json> LdmVaeConfig(const SafetensorsFile& file);

}  // namespace difftrain::io
