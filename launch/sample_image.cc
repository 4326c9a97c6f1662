#include "launch/sample_image.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "launch/sample_files.h"
#include "model/data/image_folder.h"
#include "model/data/latent_folder.h"
#include "model/io/image.h"
#include "model/io/ldm_checkpoint.h"
#include "model/io/safetensors.h"

namespace difftrain::launch {
namespace {

namespace fs = std::filesystem;

// The x0's of a safetensors file, appended to `x0`: its tensor `name`; for "images", else its
// only one.
Status ReadImagesTensor(const std::string& path, const SampleSchema& m, const std::string& name,
                        std::vector<float>& x0) {
  DT_ASSIGN_OR_RETURN(const io::SafetensorsFile file, io::SafetensorsFile::Read(path));
  std::string found = name;
  if (name == "images") {
    DT_ASSIGN_OR_RETURN(found, TensorNamedOrOnly(file, "images"));
  } else if (!file.Find(name)) {
    return Errorf("'{}' has no tensor '{}'", path, name);
  }
  std::vector<int64_t> shape = file.Find(found)->shape;
  const std::vector<int64_t> one = {m.channels, m.height, m.width};
  if (shape.size() == 3) shape.insert(shape.begin(), 1);
  if (shape.size() != 4 || !std::equal(one.begin(), one.end(), shape.begin() + 1)) {
    return Errorf(
        "'{}': tensor '{}' is [{}], and this model's samples are [K, {}, {}, {}] (or one of "
        "them, [{}, {}, {}])",
        path, found, fmt::join(file.Find(found)->shape, ", "), m.channels, m.height, m.width,
        m.channels, m.height, m.width);
  }
  const size_t n = m.elements(), first = x0.size();
  x0.resize(first + shape[0] * n);
  return file.CopyAsF32(found, file.Find(found)->shape, x0.data() + first);
}

// K items of n floats (`what`) for rows × per_class samples: one for all (K = 1), one per row
// (K = rows) or one per sample (K = rows × per_class); sample k's in order.
Result<std::vector<float>> PerSample(const std::vector<float>& items, size_t n, int rows,
                                     int per_class, const char* what) {
  const int64_t K = static_cast<int64_t>(items.size() / n), total = int64_t(rows) * per_class;
  if (K != 1 && K != rows && K != total) {
    return Errorf(
        "{} {} for {} rows of {} samples: give one for all, one per row ({}) or one per "
        "sample ({})",
        K, what, rows, per_class, rows, total);
  }
  std::vector<float> out(total * n);
  for (int64_t k = 0; k < total; ++k) {
    const int64_t from = K == 1 ? 0 : K == total ? k : k / per_class;
    std::copy_n(items.begin() + from * n, n, out.begin() + k * n);
  }
  return out;
}

// A picture of `path` as VaeImageProcessor prepares it (PrepareStretched), appended to `pixels`.
Status ReadPicture(const std::string& path, int width, int height, int channels,
                   std::vector<float>& pixels) {
  DT_ASSIGN_OR_RETURN(const io::PngImage image, io::ReadImage(path));
  if (image.width < 1 || image.height < 1) return Errorf("'{}' is empty", path);
  if (image.width != width || image.height != height) {
    spdlog::info("--image: {} is {}x{}: stretched to the samples' {}x{}", path, image.width,
                 image.height, width, height);
  }
  const size_t first = pixels.size();
  pixels.resize(first + size_t(channels) * height * width);
  PrepareStretched(image, width, height, channels, pixels.data() + first);
  return Status::Ok();
}

}  // namespace

Result<std::optional<Vae>> LoadSampleVae(const SampleOptions& o, const SampleSource& ckpt,
                                         const SampleSchema& m) {
  // Pictures to write or to encode.
  const bool pictures = !o.out.empty() || !o.out_dir.empty() || !o.gif.empty() ||
                        std::any_of(o.images.begin(), o.images.end(),
                                    [](const std::string& p) { return !IsSafetensorsPath(p); });
  std::string path = o.vae;
  if (path == "none") return std::optional<Vae>();
  std::error_code ec;
  if (path.empty() && ckpt.single_file_vae && pictures) {
    path = ckpt.path;
    spdlog::info("decoding with the checkpoint's own VAE: {}", path);
  }
  if (path.empty() && !ckpt.pipeline.empty() && pictures &&
      fs::is_directory(fs::path(ckpt.pipeline) / "vae", ec)) {
    path = ckpt.pipeline;
    spdlog::info("decoding with the pipeline's VAE: {}/vae", path);
  }
  if (path.empty()) {
    if (ckpt.data_kind != "latent_folder" || ckpt.data_path.empty() || !pictures) {
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
  // The checkpoint's own VAE from the file already read.
  Result<Vae> vae =
      ckpt.single_file_vae && path == ckpt.path ? Vae::Load(*ckpt.file) : Vae::Load(path);
  if (!vae.ok()) return vae.status().WithContext("--vae");
  const VaeConfig& c = vae->config();
  if (c.latent_channels != m.channels) {
    return Errorf("--vae: '{}' decodes latents of {} channels and this model makes {}",
                  vae->source(), c.latent_channels, m.channels);
  }
  if ((!o.out.empty() || !o.out_dir.empty() || !o.gif.empty()) && c.out_channels != 1 &&
      c.out_channels != 3) {
    return Errorf("--vae: a PNG needs 1 or 3 channels and '{}' decodes {}", vae->source(),
                  c.out_channels);
  }
  return std::optional<Vae>(std::move(vae).value());
}

// StableDiffusionXLImg2ImgPipeline's aesthetic_score and negative_aesthetic_score.
constexpr double kAestheticScore = 6.0, kNegativeAestheticScore = 2.5;

Status ChooseTimeIds(const SampleOptions& o, const SampleSource& ckpt, const Vae* vae,
                     SampleSchema& m, std::vector<float>& negative) {
  // The refiner's five time ids end in an aesthetic score where the base's end in a size.
  const bool refiner = m.aesthetic_score;
  for (const auto& [flag, given] : {std::pair{"--aesthetic-score", &o.aesthetic_score},
                                    {"--negative-aesthetic-score", &o.negative_aesthetic_score}}) {
    if (given->has_value() && !refiner) {
      return Errorf(
          "{}: for SDXL's refiner (a pipeline with requires_aesthetics_score); this model's time "
          "ids have no aesthetic score",
          flag);
    }
  }
  if (refiner && !o.target_size.empty())
    return Errorf("--target-size: SDXL's refiner has an aesthetic score in its place");
  const std::pair<const char*, const std::vector<int>*> flags[] = {
      {"--original-size", &o.original_size},
      {"--crop-top-left", &o.crop_top_left},
      {"--target-size", &o.target_size}};
  for (const auto& [flag, values] : flags) {
    if (values->empty()) continue;
    if (m.time_ids.empty()) {
      return Errorf(
          "{}: for SDXL's micro-conditioning (addition_embed_type text_time); this model has none",
          flag);
    }
    if (values->size() != 2 || (*values)[0] < 0 || (*values)[1] < 0) {
      return Errorf("{}: two non-negative numbers in pixels (H,W or TOP,LEFT), got {}", flag,
                    fmt::join(*values, ","));
    }
  }
  if (m.time_ids.empty()) return Status::Ok();
  int f = 8;  // Stable Diffusion's VAEs'
  std::error_code ec;
  const fs::path pipeline_vae = fs::path(ckpt.pipeline) / "vae" / "config.json";
  if (vae != nullptr) {
    f = vae->config().downscale();
  } else {
    // Not decoding: the pipeline's VAE, or an original checkpoint's own, still says how large
    // its pictures are.
    std::optional<std::pair<nlohmann::json, std::string>> config;
    if (!ckpt.pipeline.empty() && fs::exists(pipeline_vae, ec)) {
      std::ifstream file(pipeline_vae);
      config.emplace(nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false),
                     pipeline_vae.string());
    } else if (ckpt.single_file_vae) {
      DT_ASSIGN_OR_RETURN(nlohmann::json j, io::LdmVaeConfig(*ckpt.file));
      config.emplace(std::move(j), ckpt.path);
    }
    if (config) {
      Result<VaeConfig> c = VaeConfig::FromJson(config->first);
      if (!c.ok()) return c.status().WithContext(config->second);
      f = c->downscale();
    }
  }
  const std::vector<int> size = {m.height * f, m.width * f}, none = {0, 0};
  m.time_ids.clear();
  for (const auto& [given, fallback] :
       {std::pair{&o.original_size, &size}, {&o.crop_top_left, &none}, {&o.target_size, &size}}) {
    if (refiner && given == &o.target_size) break;
    const std::vector<int>& v = given->empty() ? *fallback : *given;
    m.time_ids.push_back(static_cast<float>(v[0]));
    m.time_ids.push_back(static_cast<float>(v[1]));
  }
  negative = m.time_ids;
  if (refiner) {
    m.time_ids.push_back(static_cast<float>(o.aesthetic_score.value_or(kAestheticScore)));
    negative.push_back(
        static_cast<float>(o.negative_aesthetic_score.value_or(kNegativeAestheticScore)));
  }
  return Status::Ok();
}

Result<std::optional<ModelSpec>> ResizedForSampling(const SampleOptions& o, const ModelSpec& spec,
                                                    const SampleSchema& m, const Vae* vae) {
  const ModelFamily& family = FamilyOf(spec);
  const int f = vae ? vae->config().downscale() : 1;
  if (o.height || o.width) {
    if (!vae && m.channels != 1 && m.channels != 3) {
      return Status::Error(
          "--height/--width are pixels, and this model samples latents without a VAE to say "
          "their scale: give --vae");
    }
    const int height = o.height.value_or(m.height * f), width = o.width.value_or(m.width * f);
    if (height < 1 || width < 1 || height % f != 0 || width % f != 0) {
      return Errorf(
          "--height/--width: {}x{} pixels, and the samples' sides must be positive multiples of "
          "the VAE's downscale {}",
          height, width, f);
    }
    Result<ModelSpec> resized = family.Resized(spec, height / f, width / f);
    if (!resized.ok()) return resized.status().WithContext("--height/--width");
    spdlog::info("sampling {}x{} pixels ({}x{} latents)", width, height, width / f, height / f);
    return std::optional<ModelSpec>(std::move(resized).value());
  }
  if (o.images.empty() || IsSafetensorsPath(o.images[0]) || m.video)
    return std::optional<ModelSpec>();
  if (!vae && m.channels != 1 && m.channels != 3)
    return std::optional<ModelSpec>();  // refused when read
  // The first picture's size, in latents rounded down to one the family samples.
  Result<io::PngImage> picture = io::ReadImage(o.images[0]);
  if (!picture.ok()) return picture.status().WithContext("--image");
  int height = picture->height / f, width = picture->width / f;
  if (height == m.height && width == m.width) return std::optional<ModelSpec>();
  if (!family.Resized(spec, m.height, m.width).ok())
    return std::optional<ModelSpec>();  // not resizable
  // Each side rounded down on its own to one the family takes (a UNet's sides halve a bounded
  // number of times: at most 2^(levels − 1) − 1 steps down).
  const auto largest = [&](int side, bool rows) {
    for (int s = side; s > 0 && s > side - 1024; --s) {
      if (family.Resized(spec, rows ? s : m.height, rows ? m.width : s).ok()) return s;
    }
    return 0;
  };
  height = largest(height, true);
  width = largest(width, false);
  if (height == 0 || width == 0 || (height == m.height && width == m.width))
    return std::optional<ModelSpec>();
  DT_ASSIGN_OR_RETURN(ModelSpec resized, family.Resized(spec, height, width));
  spdlog::info("sampling at {}'s size: {}x{} pixels ({}x{} latents; --height/--width to choose)",
               o.images[0], width * f, height * f, width, height);
  return std::optional<ModelSpec>(std::move(resized));
}

bool IsSafetensorsPath(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".safetensors";
}

Result<std::vector<float>> ReadStartImages(const std::vector<std::string>& paths,
                                           const SampleSchema& m, const Vae* vae, int rows,
                                           int per_class, uint64_t seed) {
  const size_t n = m.elements();
  const int f = vae ? vae->config().downscale() : 1;
  const int channels = vae ? vae->config().in_channels : m.channels;
  const int height = m.height * f, width = m.width * f;
  std::vector<float> x0;  // every file's images, in order
  uint64_t pictures = 0;
  for (const std::string& path : paths) {
    if (IsSafetensorsPath(path)) {
      DT_RETURN_IF_ERROR(ReadImagesTensor(path, m, "images", x0));
      continue;
    }
    if (!vae && m.channels != 1 && m.channels != 3) {
      return Errorf(
          "'{}' is a picture and this model samples latents of {} channels: give --vae (a "
          "diffusers AutoencoderKL) to encode it, or its latents as a safetensors file",
          path, m.channels);
    }
    std::vector<float> pixels;
    DT_RETURN_IF_ERROR(ReadPicture(path, width, height, channels, pixels));
    const size_t first = x0.size();
    x0.resize(first + n);
    if (vae) {
      DT_RETURN_IF_ERROR(vae->Encode(pixels.data(), 1, height, width, VaePosterior::kSample, seed,
                                     pictures, x0.data() + first)
                             .WithContext(fmt::format("encoding '{}'", path)));
    } else {
      std::copy(pixels.begin(), pixels.end(), x0.begin() + first);
    }
    ++pictures;
  }
  return PerSample(x0, n, rows, per_class, "images");
}

Result<InpaintInputs> ReadInpaintInputs(const std::vector<std::string>& masks,
                                        const std::vector<std::string>& images,
                                        const SampleSchema& m, const Vae* vae, int rows,
                                        int per_class, uint64_t seed) {
  const int f = vae ? vae->config().downscale() : 1;
  const int height = m.height * f, width = m.width * f;
  const size_t pixel_plane = size_t(height) * width, plane = size_t(m.height) * m.width;
  std::vector<float> files;  // each mask's pixels
  for (const std::string& path : masks) {
    if (IsSafetensorsPath(path))
      return Errorf("--mask '{}': a mask is a picture (PNG or JPEG), white where painted", path);
    Result<io::PngImage> image = io::ReadImage(path);
    if (!image.ok()) return image.status().WithContext("--mask");
    if (image->width < 1 || image->height < 1) return Errorf("--mask '{}' is empty", path);
    if (image->width != width || image->height != height) {
      spdlog::info("--mask: {} is {}x{}: stretched to the samples' {}x{}", path, image->width,
                   image->height, width, height);
    }
    files.resize(files.size() + pixel_plane);
    PrepareMask(*image, width, height, files.data() + files.size() - pixel_plane);
  }
  Result<std::vector<float>> pixel_masks = PerSample(files, pixel_plane, rows, per_class, "masks");
  if (!pixel_masks.ok()) return pixel_masks.status().WithContext("--mask");
  const int64_t total = int64_t(rows) * per_class;
  InpaintInputs in;
  in.mask.resize(total * plane);
  for (int64_t k = 0; k < total; ++k) {
    for (int y = 0; y < m.height; ++y) {
      for (int x = 0; x < m.width; ++x) {
        in.mask[k * plane + y * m.width + x] =
            (*pixel_masks)[k * pixel_plane + size_t(y) * f * width + size_t(x) * f];
      }
    }
  }
  if (m.conditioning_channels == 0) return in;
  if (m.conditioning_channels != 1 + m.channels) {
    return Errorf(
        "--mask: the model takes {} conditioning channels, and an inpainting model 1 + {} (the "
        "mask and the masked image's latents)",
        m.conditioning_channels, m.channels);
  }
  // The masked image: from the --image files' tensors, or encoded from their pictures.
  const auto tensor = [](const std::string& path) { return IsSafetensorsPath(path); };
  const size_t n = m.elements();
  std::vector<float> masked;
  if (std::all_of(images.begin(), images.end(), tensor)) {
    for (const std::string& path : images)
      DT_RETURN_IF_ERROR(ReadImagesTensor(path, m, "masked_image_latents", masked)
                             .WithContext("--image (an inpainting model's masked image)"));
    DT_ASSIGN_OR_RETURN(in.masked, PerSample(masked, n, rows, per_class, "masked images"));
    return in;
  }
  if (std::any_of(images.begin(), images.end(), tensor)) {
    return Status::Error(
        "--image: an inpainting model's images are all pictures (the masked image is made of "
        "each) or all safetensors files (each with its masked_image_latents), not a mix");
  }
  const int channels = vae ? vae->config().in_channels : m.channels;
  std::vector<float> pictures;
  for (const std::string& path : images)
    DT_RETURN_IF_ERROR(ReadPicture(path, width, height, channels, pictures));
  DT_ASSIGN_OR_RETURN(std::vector<float> pixels,
                      PerSample(pictures, channels * pixel_plane, rows, per_class, "images"));
  for (int64_t k = 0; k < total; ++k) {
    for (size_t c = 0; c < size_t(channels); ++c) {
      for (size_t i = 0; i < pixel_plane; ++i) {
        if ((*pixel_masks)[k * pixel_plane + i] >= 0.5f) {
          pixels[(k * channels + c) * pixel_plane + i] = 0.0f;
        }
      }
    }
  }
  if (!vae) {
    in.masked = std::move(pixels);
    return in;
  }
  in.masked.resize(total * n);
  DT_RETURN_IF_ERROR(vae->Encode(pixels.data(), static_cast<int>(total), height, width,
                                 VaePosterior::kSample, seed, uint64_t{1} << 32, in.masked.data())
                         .WithContext("encoding the masked images"));
  return in;
}

}  // namespace difftrain::launch
