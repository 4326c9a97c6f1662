// The files `difftrain sample` reads and writes beside its PNG grid (docs/sampling.md): the
// raw samples, a video model's filmstrip and GIF, x_T given by --initial-noise, and the
// samples decoded through a VAE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/family/family.h"
#include "model/io/safetensors.h"
#include "model/vae/vae.h"

namespace difftrain::launch {

// Black pixels between the images of a grid.
constexpr int kGridPadding = 2;

// The shape of N samples of `m`: [N, C, H, W], a video model's [N, F, C, H, W].
std::vector<int64_t> SamplesShape(int64_t N, const SampleSchema& m);

// --raw's file: `images` (the samples of `model`), `decoded` when not empty (the samples
// through the VAE, shaped as `pictures` says), `labels`, and `how` as its `sampling` metadata.
Status WriteRaw(const std::string& path, const std::vector<float>& images,
                const std::vector<float>& decoded, const SampleSchema& pictures,
                const std::vector<int64_t>& labels, const ModelSpec& model,
                const nlohmann::json& how);

// The tensor `name` of `file`, else its only one; an error naming the file where it has
// neither.
Result<std::string> TensorNamedOrOnly(const io::SafetensorsFile& file, const std::string& name);

// x_T of `total` samples of `m` (--initial-noise): the file's tensor `noise`, else its only
// one, of any float dtype, shaped as the samples are in --raw.
Status ReadInitialNoise(const std::string& path, int total, const SampleSchema& m,
                        std::vector<float>& x);

// A video model's samples: `filmstrip`, a PNG of one row of frames per video, and `gif`, an
// animated GIF whose frame f is the grid (`columns` videos a row) of every video's frame f.
Status WriteVideos(const std::string& filmstrip, const std::string& gif, int delay_cs,
                   const std::vector<float>& videos, int N, int columns, const SampleSchema& m);

// --out-dir: N images of `m` (1 or 3 channels, values in [−1, 1]) as DIR/00000.png … and, where
// `captions` has one per image, DIR/metadata.jsonl of {"file_name", "text"} lines: an image folder
// with its captions, as `difftrain data pack --dataset image_folder` and diffusers'
// train_text_to_image.py read it. The folder is made; files of the same names are replaced.
Status WriteImageFolder(const std::string& dir, const std::vector<float>& images, int N,
                        const SampleSchema& m, const std::vector<std::string>& captions);

// Decodes `total` samples of `m` (a video's frames one by one, as its latents were encoded)
// into `pictures` of the returned schema.
Result<SampleSchema> DecodeSamples(const Vae& vae, const std::vector<float>& samples, int total,
                                   const SampleSchema& m, std::vector<float>& pictures);

}  // namespace difftrain::launch
