// A directory of precomputed samples, usually VAE latents (ImageNet 256² → 4×32×32 for DiT),
// sharded into safetensors files and described by index.json (docs/data.md):
//
//   DIR/index.json               {"format": "difftrain-latents", "version": 1,
//                                 "channels": C, "height": H, "width": W, "num_classes": K,
//                                 ["frames": F,]
//                                 ["buckets": [{"height": h0, "width": w0}, ...],]
//                                 "shards": [{"file": "shard-00000.safetensors", "count": n0
//                                             [, "bucket": b0]}, ...],
//                                 "total": n0 + n1 + ...}
//   DIR/shard-00000.safetensors  "latents" F32 [n0, C, H, W], "labels" I64 [n0]
//                                (a folder of videos, "frames" F > 1: [n0, F, C, H, W]),
//                                ["text_ids" I64 [n0] with a "text" entry,]
//                                ["geometry" I64 [n0, 6] with "geometry": true: each
//                                 picture's PictureGeometry (dataset.h)]
//                                ["latents_mirrored" F32, as "latents", with "mirrored": true:
//                                 each sample's mirror image (Dataset::GetMirrored)]
//   ...
//
// A folder with "buckets" (aspect-ratio buckets: `data pack --crop buckets`) holds samples of
// several sizes; each shard's are of its bucket's size, [n, C, h_b, w_b], and "height" and
// "width" are the nominal size the buckets' areas keep near.
//
// Samples are numbered across shards in index order. Latents are stored as the model
// consumes them (already multiplied by the VAE's scale factor).
//
// Reading is lazy: Open checks index.json and every shard's header and size, and reads the
// labels (8 bytes a sample); Get reads one sample's latents with pread. The loader shuffles
// over the whole dataset, so a sample can come from any shard at any step: reading whole
// shards would read a shard for every sample, and holding all of ImageNet's latents (21 GB)
// in every rank of a node would cost eight times that. With pread the kernel's page cache
// holds the hot data once per node, shared by all its ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/data/dataset.h"

namespace difftrain {

inline constexpr std::string_view kLatentFolderFormat = "difftrain-latents";
inline constexpr int kLatentFolderVersion = 1;
inline constexpr std::string_view kLatentFolderIndex = "index.json";

// What encoded a folder's samples, index.json's "vae" entry (`data pack --vae`, docs/data.md):
// `difftrain sample` decodes a model trained on the folder with the same VAE by default.
struct LatentFolderVae {
  std::string path;  // the VAE's weights file, absolute, as packing read it
  double scaling_factor = 0;
  std::string posterior;  // "sample" or "mode"
  uint64_t seed = 0;
};

// The "vae" entry of DIR/index.json, reading nothing else; nullopt for a folder without one.
Result<std::optional<LatentFolderVae>> ReadLatentFolderVae(const std::string& dir);

class LatentFolderDataset : public Dataset {
 public:
  // Errors name the file (index.json or the shard) and what is wrong with it.
  static Result<std::unique_ptr<LatentFolderDataset>> Open(const std::string& dir);
  ~LatentFolderDataset() override;
  LatentFolderDataset(const LatentFolderDataset&) = delete;
  LatentFolderDataset& operator=(const LatentFolderDataset&) = delete;

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int channels() const override { return channels_; }
  int height() const override { return height_; }
  int width() const override { return width_; }
  int num_classes() const override { return num_classes_; }
  int frames() const override { return frames_; }
  Status Get(int64_t index, float* image, int32_t* label) const override;
  const TextTable* texts() const override { return texts_.size() > 0 ? &texts_ : nullptr; }
  int64_t TextId(int64_t index) const override { return text_ids_[index]; }
  bool has_geometry() const override { return has_geometry_; }
  Status GetGeometry(int64_t index, PictureGeometry* geometry) const override;
  std::vector<SampleSize> buckets() const override;
  int BucketOf(int64_t index) const override { return ShardOf(index).bucket; }
  bool has_mirrored() const override { return mirrored_; }
  Status GetMirrored(int64_t index, float* image, int32_t* label) const override;

  // Reads every shard whole and checks it as SafetensorsFile::Verify does: the header, the
  // layout and the CRC-32 of the data. Open does not, to start quickly on large folders.
  Status VerifyChecksums() const;
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  const std::optional<LatentFolderVae>& vae() const { return vae_; }

 private:
  struct Shard {
    std::string path;
    int fd = -1;
    int64_t first = 0;  // global index of its first sample
    int64_t count = 0;
    uint64_t latents_offset = 0;   // byte offset of the latents tensor in the file
    int bucket = 0;                // its samples' bucket (0 in a folder of one size)
    uint64_t mirrored_offset = 0;  // of latents_mirrored, in a folder that has them
  };
  // Reads sample `index` from the shard's tensor at byte `offset`.
  Status Read(int64_t index, uint64_t Shard::*offset, float* image, int32_t* label) const;
  LatentFolderDataset() = default;
  const Shard& ShardOf(int64_t index) const;
  Status OpenShard(Shard& shard);
  Status OpenTexts(const std::string& dir, const nlohmann::json& entry,
                   const std::string& index_path);

  int channels_ = 0, height_ = 0, width_ = 0, num_classes_ = 0, frames_ = 1;
  std::vector<SampleSize> buckets_;  // empty: one size, height_ × width_
  std::vector<Shard> shards_;
  std::vector<int32_t> labels_;    // all of them, read at Open
  TextTable texts_;                // empty: a folder without text
  std::vector<int64_t> text_ids_;  // one per sample with texts, read at Open
  bool has_geometry_ = false;
  std::vector<PictureGeometry> geometry_;  // one per sample where the folder has it
  bool mirrored_ = false;                  // the shards hold latents_mirrored
  std::optional<LatentFolderVae> vae_;
};

// Writes every sample of `source` (which must be bounded) to `dir` as a latent folder of
// shards of `samples_per_shard` samples (the last one may hold fewer), with its text table and
// text ids when it has texts, creating `dir` if needed. A bucketed source's samples go into the
// folder grouped by bucket (in bucket order, the source's order within each), each shard of one
// bucket; the index lists the buckets and each shard's. Each shard and then index.json are written
// atomically; index.json is removed first, so a pack that fails midway leaves a folder that does
// not open rather than an index over a mix of old and new shards. `vae`: what encoded the
// samples, written into the index. A source with mirror images (has_mirrored) writes them too.
Status WriteLatentFolder(const Dataset& source, const std::string& dir, int64_t samples_per_shard,
                         const std::optional<LatentFolderVae>& vae = std::nullopt);

}  // namespace difftrain
