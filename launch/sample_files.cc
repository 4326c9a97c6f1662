#include "launch/sample_files.h"

#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "model/io/gif.h"
#include "model/io/png.h"
#include "model/io/posix_file.h"
#include "model/io/safetensors.h"

namespace difftrain::launch {

std::vector<int64_t> SamplesShape(int64_t N, const SampleSchema& m) {
  if (m.video) return {N, m.frames, m.channels, m.height, m.width};
  return {N, m.channels, m.height, m.width};
}

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

Result<std::string> TensorNamedOrOnly(const io::SafetensorsFile& file, const std::string& name) {
  if (file.Find(name) != nullptr) return name;
  if (file.Names().size() != 1) {
    return Errorf("'{}' holds {} tensors and none is named '{}'", file.path(), file.Names().size(),
                  name);
  }
  return file.Names()[0];
}

Status ReadInitialNoise(const std::string& path, int total, const SampleSchema& m,
                        std::vector<float>& x) {
  DT_ASSIGN_OR_RETURN(const io::SafetensorsFile file, io::SafetensorsFile::Read(path));
  DT_ASSIGN_OR_RETURN(const std::string name, TensorNamedOrOnly(file, "noise"));
  return file.CopyAsF32(name, SamplesShape(total, m), x.data());
}

Status WriteImageFolder(const std::string& dir, const std::vector<float>& images, int N,
                        const SampleSchema& m, const std::vector<std::string>& captions) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Errorf("--out-dir: cannot create '{}': {}", dir, ec.message());
  const size_t n = size_t(m.channels) * m.height * m.width;
  std::string metadata;
  for (int i = 0; i < N; ++i) {
    const std::string name = fmt::format("{:05d}.png", i);
    DT_ASSIGN_OR_RETURN(const io::PngImage png,
                        io::MakeImageGrid(images.data() + i * n, 1, m.channels, m.height, m.width,
                                          1, /*padding=*/0));
    DT_RETURN_IF_ERROR(
        io::WritePng(dir + "/" + name, png.pixels.data(), png.width, png.height, png.channels));
    if (captions.size() == size_t(N)) {
      metadata += nlohmann::json{{"file_name", name}, {"text", captions[i]}}.dump() + "\n";
    }
  }
  if (metadata.empty()) return Status::Ok();
  DT_ASSIGN_OR_RETURN(io::AtomicFileWriter file,
                      io::AtomicFileWriter::Open(dir + "/metadata.jsonl"));
  DT_RETURN_IF_ERROR(file.Append(metadata.data(), metadata.size()));
  return file.Commit();
}

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

}  // namespace difftrain::launch
