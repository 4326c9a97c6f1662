// `difftrain data`: dataset tools (docs/data.md).
//   data pack     writes a dataset as a latent folder (index.json + safetensors shards), with
//                 a caption of its class for every sample when given a text table
//   data verify   checks a latent folder: index, shard headers and every shard's checksum
//   data captions writes Fashion-MNIST's captions as a text table without embeddings (JSON)
//   data embed    embeds captions into a text table, with a text encoder or the fixed token table
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include "common/json_read.h"
#include "launch/command.h"

#include "model/data/captions.h"
#include "model/data/dataset.h"
#include "model/data/image_folder.h"
#include "model/data/latent_folder.h"
#include "model/data/text_table.h"
#include "model/io/posix_file.h"
#include "model/text/embedder.h"
#include "model/vae/encoded_dataset.h"
#include "model/vae/vae.h"

namespace difftrain::launch {
namespace {

struct PackOptions {
  DatasetSpec dataset;
  std::string out;
  int64_t per_shard = 8192;
  int64_t limit = 0;       // 0: every sample
  std::string text_table;  // a caption of its class for every sample, from this table
  // An image folder's own captions embedded by this text encoder, at this length.
  std::string text_encoder;
  int text_length = 77;
  int skip_layers = 0;
  std::string caption_column = "text";
  std::string vae;  // encode the samples through this AutoencoderKL
  std::string posterior = "sample";
  bool mirror = false;  // with --vae: each picture's mirror image encoded too
  // image_folder --crop buckets: "auto" (AspectRatioBuckets of --image-size) or "HxW,HxW,...".
  std::string buckets = "auto";
  bool channels_given = false;
  bool image_size_given = false;
  bool buckets_given = false;
};

struct EmbedOptions {
  std::string captions;  // JSON written by `data captions`
  std::string out;
  int length = 16;
  std::optional<int> dim;  // the token table's D (default 64); a text encoder has its own
  std::string encoder;     // a text encoder (model/text/embedder.h); "": the token table
  int skip_layers = 0;
};

// --buckets: "auto" (none given: the automatic list) or "HxW,HxW,..." in pixels, height × width.
Result<std::vector<SampleSize>> ParseBuckets(const std::string& text) {
  std::vector<SampleSize> buckets;
  if (text == "auto") return buckets;
  for (size_t start = 0;;) {
    const size_t end = text.find(',', start);
    const std::string item = text.substr(start, end == std::string::npos ? end : end - start);
    const char* const last = item.data() + item.size();
    SampleSize b;
    auto [x, height_error] = std::from_chars(item.data(), last, b.height);
    bool ok = height_error == std::errc() && x != item.data() && x != last && *x == 'x';
    if (ok) {
      auto [rest, width_error] = std::from_chars(x + 1, last, b.width);
      ok = width_error == std::errc() && rest != x + 1 && rest == last;
    }
    if (!ok || b.height < 1 || b.width < 1) {
      return Errorf(
          "--buckets: '{}' is not HxW (a bucket's height x width in pixels, positive); expected "
          "auto or a list such as 1024x1024,1152x896,896x1152",
          item);
    }
    buckets.push_back(b);
    if (end == std::string::npos) return buckets;
    start = end + 1;
  }
}

// How many of the first `count` samples each of an image folder's buckets holds: one line per
// bucket that holds any.
void LogBuckets(const Dataset& folder, int64_t count) {
  const std::vector<SampleSize> buckets = folder.buckets();
  std::vector<int64_t> held(buckets.size());
  for (int64_t i = 0; i < count; ++i)
    ++held[folder.BucketOf(i)];
  spdlog::info("{} images in {} of {} aspect-ratio buckets (height × width: images):", count,
               buckets.size() - std::count(held.begin(), held.end(), 0), buckets.size());
  for (size_t k = 0; k < buckets.size(); ++k) {
    if (held[k] > 0) spdlog::info("  {}×{}: {}", buckets[k].height, buckets[k].width, held[k]);
  }
}

// The samples through the VAE of --vae (loaded once, shared by the loader's threads), and
// what the folder's index says of it.
Result<std::unique_ptr<Dataset>> EncodeWithVae(std::unique_ptr<Dataset> source,
                                               const PackOptions& o, LatentFolderVae& described) {
  Result<Vae> vae = Vae::Load(o.vae);
  if (!vae.ok()) return vae.status().WithContext("--vae");
  const VaePosterior posterior =
      o.posterior == "mode" ? VaePosterior::kMode : VaePosterior::kSample;
  auto shared = std::make_shared<const Vae>(std::move(vae).value());
  described = {std::filesystem::absolute(shared->source()).lexically_normal().string(),
               shared->config().scaling_factor, o.posterior, o.dataset.seed};
  spdlog::info("encoding through the VAE {} ({} of the posterior, scaled by {})", shared->source(),
               o.posterior == "mode" ? "the mean" : "a draw", shared->config().scaling_factor);
  Result<std::unique_ptr<VaeEncodedDataset>> encoded = VaeEncodedDataset::Create(
      std::move(source), std::move(shared), posterior, o.dataset.seed, o.mirror);
  if (!encoded.ok()) return encoded.status().WithContext("--vae");
  return std::unique_ptr<Dataset>(std::move(encoded).value());
}

// The image folder `source` with its own captions (metadata.jsonl or sidecar files), each
// distinct one embedded once by --text-encoder.
Result<std::unique_ptr<Dataset>> WithOwnCaptions(std::unique_ptr<Dataset> source,
                                                 const PackOptions& o) {
  const auto* folder = dynamic_cast<const ImageFolderDataset*>(source.get());
  if (!folder) {
    return Errorf(
        "--text-encoder embeds an image folder's own captions (--dataset image_folder); "
        "{} takes its captions from --text-table",
        o.dataset.kind);
  }
  if (!o.text_table.empty()) return Status::Error("give --text-table or --text-encoder, not both");
  DT_ASSIGN_OR_RETURN(const std::vector<std::string> captions,
                      ReadImageCaptions(*folder, o.dataset.path, o.caption_column));
  std::vector<std::string> distinct;
  std::map<std::string, int64_t> index;
  std::vector<int64_t> ids;
  for (const std::string& caption : captions) {
    const auto [at, added] = index.emplace(caption, static_cast<int64_t>(distinct.size()));
    if (added) distinct.push_back(caption);
    ids.push_back(at->second);
  }
  Result<TextEmbedder> embedder = TextEmbedder::Load(o.text_encoder);
  if (!embedder.ok()) return embedder.status().WithContext("--text-encoder");
  spdlog::info("embedding {} distinct captions of {} images with {}", distinct.size(),
               captions.size(), o.text_encoder);
  Result<TextTable> table = embedder->EmbedTable(distinct, o.text_length, o.skip_layers);
  if (!table.ok()) return table.status().WithContext("--text-encoder");
  DT_ASSIGN_OR_RETURN(
      std::unique_ptr<CaptionedDataset> captioned,
      CaptionedDataset::WithTexts(std::move(source), std::move(table).value(), std::move(ids)));
  return std::unique_ptr<Dataset>(std::move(captioned));
}

// ", in 3 aspect-ratio buckets (8×8, 6×10, 10×6)" for a bucketed dataset; "" otherwise.
std::string BucketsText(const Dataset& d) {
  if (!d.bucketed()) return "";
  std::vector<std::string> sizes;
  for (const SampleSize& s : d.buckets())
    sizes.push_back(fmt::format("{}×{}", s.height, s.width));
  return fmt::format(" in {} aspect-ratio buckets ({})", sizes.size(), fmt::join(sizes, ", "));
}

int RunPack(PackOptions o) {
  if (o.per_shard < 1) return ReportBadInput("data pack", "--per-shard must be positive");
  if (o.limit < 0) return ReportBadInput("data pack", "--limit must not be negative");
  if (o.dataset.kind == "image_folder") {
    if (!o.image_size_given) {
      return ReportBadInput("data pack",
                            "--image-size is required for image_folder (images are centre-cropped "
                            "and resized to it)");
    }
    if (!o.channels_given) o.dataset.channels = 3;
  }
  const bool bucketed = o.dataset.kind == "image_folder" && o.dataset.crop == "buckets";
  if (o.buckets_given && !bucketed)
    return ReportBadInput("data pack", "--buckets is for --dataset image_folder --crop buckets");
  if (bucketed) {
    Result<std::vector<SampleSize>> buckets = ParseBuckets(o.buckets);
    if (!buckets.ok()) return ReportBadInput("data pack", buckets.status().message());
    o.dataset.buckets = std::move(buckets).value();
  }
  if (o.vae.empty() && o.posterior != "sample")
    return ReportBadInput("data pack", "--vae-posterior is for --vae");
  if (o.vae.empty() && o.mirror) {
    return ReportBadInput("data pack",
                          "--mirror is for --vae: a picture's mirror image is its sample flipped, "
                          "as data.horizontal_flip flips it");
  }
  Result<std::unique_ptr<Dataset>> source = OpenDataset(o.dataset);
  if (!source.ok()) return ReportBadInput("data pack", source.status().message());
  if ((*source)->unbounded() && o.limit == 0) {
    return ReportBadInput("data pack",
                          fmt::format("dataset '{}' has no end: give --limit", o.dataset.kind));
  }
  if (bucketed) {
    LogBuckets(**source, o.limit > 0 ? std::min(o.limit, (*source)->size()) : (*source)->size());
  }
  if (!o.text_table.empty()) {
    Result<TextTable> texts = ReadTextTable(o.text_table);
    if (!texts.ok())
      return ReportBadInput("data pack", "--text-table: " + texts.status().message());
    auto captioned = CaptionedDataset::Create(std::move(source).value(), std::move(texts).value());
    if (!captioned.ok()) {
      return ReportBadInput("data pack", "--text-table: " + captioned.status().message());
    }
    source = std::unique_ptr<Dataset>(std::move(captioned).value());
  }
  if (!o.text_encoder.empty()) {
    Result<std::unique_ptr<Dataset>> captioned = WithOwnCaptions(std::move(source).value(), o);
    if (!captioned.ok()) return ReportBadInput("data pack", captioned.status().message());
    source = std::move(captioned);
  }
  std::optional<LatentFolderVae> encoded_by;
  if (!o.vae.empty()) {
    encoded_by.emplace();
    source = EncodeWithVae(std::move(source).value(), o, *encoded_by);
    if (!source.ok()) return ReportBadInput("data pack", source.status().message());
  }
  const int64_t count = o.limit > 0 ? std::min(o.limit, (*source)->size()) : (*source)->size();
  const PrefixDataset samples(**source, count);
  Status written = WriteLatentFolder(samples, o.out, o.per_shard, encoded_by);
  if (!written.ok()) {
    std::fprintf(stderr, "difftrain data pack: %s\n", written.message().c_str());
    return kExitJobFailed;
  }
  const TextTable* texts = samples.texts();
  spdlog::info(
      "wrote {} samples of {}{}×{}×{}{} ({} classes){} to {}", count,
      samples.frames() > 1 ? fmt::format("{}×", samples.frames()) : "", samples.channels(),
      samples.height(), samples.width(), BucketsText(samples), samples.num_classes(),
      texts ? fmt::format(" with {} captions of {}×{}", texts->size(), texts->length, texts->dim)
            : "",
      o.out);
  return kExitOk;
}

int RunVerify(const std::string& dir) {
  Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(dir);
  if (!folder.ok()) return ReportBadInput("data verify", folder.status().message());
  Status verified = (*folder)->VerifyChecksums();
  if (!verified.ok()) return ReportBadInput("data verify", verified.message());
  const TextTable* texts = (*folder)->texts();
  const std::optional<LatentFolderVae>& vae = (*folder)->vae();
  std::printf("%s: %lld samples of %d×%d×%d%s, %d classes, %lld shards%s%s%s%s, checksums good\n",
              dir.c_str(), static_cast<long long>((*folder)->size()), (*folder)->channels(),
              (*folder)->height(), (*folder)->width(), BucketsText(**folder).c_str(),
              (*folder)->num_classes(), static_cast<long long>((*folder)->num_shards()),
              texts ? fmt::format(", {} texts of {}×{}{}", texts->size(), texts->length, texts->dim,
                                  texts->text_encoder.empty()
                                      ? std::string()
                                      : " embedded by the text encoder " + texts->text_encoder)
                          .c_str()
                    : "",
              vae ? fmt::format(", encoded by the VAE {} ({}, scaled by {})", vae->path,
                                vae->posterior, vae->scaling_factor)
                        .c_str()
                  : "",
              (*folder)->has_geometry() ? ", each picture's size and crop (SDXL's time ids)" : "",
              (*folder)->has_mirrored() ? ", each picture's mirror image" : "");
  return kExitOk;
}

// The captions as JSON: {"captions": [...], "labels": [...], "held_out": [...]}, what the
// text encoders (data embed, scripts/text_encoder.py) read.
int RunCaptions(const std::string& out) {
  const TextTable captions = FashionMnistCaptions();
  const std::string text = nlohmann::ordered_json{{"captions", captions.captions},
                                                  {"labels", captions.labels},
                                                  {"held_out", captions.held_out}}
                               .dump(2) +
                           "\n";
  Result<io::AtomicFileWriter> file = io::AtomicFileWriter::Open(out);
  Status written = file.ok() ? file->Append(text.data(), text.size()) : file.status();
  if (written.ok()) written = file->Commit();
  if (!written.ok()) return ReportBadInput("data captions", written.message());
  spdlog::info("wrote {} captions to {}", captions.size(), out);
  return kExitOk;
}

// Reads the captions JSON of `data captions` (or one written by hand: "captions" is required).
Result<TextTable> ReadCaptions(const std::string& path) {
  DT_ASSIGN_OR_RETURN(std::string text, io::ReadWholeFile(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TextTable t;
  try {
    if (!j.is_object() || !j.contains("captions")) throw std::runtime_error("no 'captions' list");
    t.captions = j.at("captions").get<std::vector<std::string>>();
    if (j.contains("labels")) t.labels = JsonInts(j.at("labels"), "labels");
    if (j.contains("held_out")) t.held_out = j.at("held_out").get<std::vector<bool>>();
  } catch (const std::exception& e) {
    return Errorf("captions '{}': {}", path, e.what());
  }
  return t;
}

int RunEmbed(const EmbedOptions& o) {
  Result<TextTable> captions = ReadCaptions(o.captions);
  if (!captions.ok()) return ReportBadInput("data embed", captions.status().message());
  Result<TextTable> table = [&]() -> Result<TextTable> {
    if (o.encoder.empty()) {
      if (o.skip_layers != 0) return Errorf("--skip-layers is for a text encoder (--encoder)");
      return EmbedWithTokenTable(captions->captions, o.length, o.dim.value_or(64));
    }
    if (o.dim) return Errorf("--dim is the token table's: a text encoder's is its hidden_size");
    DT_ASSIGN_OR_RETURN(const TextEmbedder embedder, TextEmbedder::Load(o.encoder));
    Result<TextTable> t = embedder.EmbedTable(captions->captions, o.length, o.skip_layers);
    if (!t.ok()) return t.status().WithContext("--encoder");
    return t;
  }();
  if (!table.ok()) return ReportBadInput("data embed", table.status().message());
  table->labels = captions->labels;
  table->held_out = captions->held_out;
  Status written = WriteTextTable(*table, o.out);
  if (!written.ok()) return ReportBadInput("data embed", written.message());
  spdlog::info("wrote {} texts of {}×{} ({}) to {}", table->size(), table->length, table->dim,
               table->encoder, o.out);
  return kExitOk;
}

std::function<int()> SetupData(CLI::App& app) {
  app.require_subcommand(1);
  auto pack_options = std::make_shared<PackOptions>();
  PackOptions& o = *pack_options;
  CLI::App* pack = app.add_subcommand("pack", "write a dataset as a latent folder");
  pack->add_option("--dataset", o.dataset.kind,
                   "synthetic, fashion_mnist, moving_fashion_mnist, latent_folder or "
                   "image_folder (PNG/JPEG files in one subfolder per class)")
      ->capture_default_str();
  pack->add_option("--path", o.dataset.path,
                   "fashion_mnist: directory of the IDX files (default Debian's); "
                   "latent_folder, image_folder: the folder");
  pack->add_option("--split", o.dataset.split, "fashion_mnist: train or test")
      ->capture_default_str();
  pack->add_option("--out", o.out, "the folder to write")->required();
  pack->add_option("--per-shard", o.per_shard, "samples per shard file")->capture_default_str();
  pack->add_option("--limit", o.limit, "pack only the first N samples, 0 all (synthetic needs N)")
      ->capture_default_str();
  pack->add_option("--seed", o.dataset.seed,
                   "synthetic: seed; with --vae: the seed of the posterior's draws")
      ->capture_default_str();
  CLI::Option* channels =
      pack->add_option("--channels", o.dataset.channels,
                       "synthetic: channels (default 4); image_folder: 3 (RGB, the default) or 1 "
                       "(grey)");
  CLI::Option* image_size =
      pack->add_option("--image-size", o.dataset.image_size,
                       "synthetic, moving_fashion_mnist: height and width (default 32); "
                       "image_folder (required): the side its images are cropped and resized to");
  pack->add_option("--frames", o.dataset.frames,
                   "synthetic, moving_fashion_mnist: frames per video (1: images)")
      ->capture_default_str();
  pack->add_option("--num-classes", o.dataset.num_classes, "synthetic: classes")
      ->capture_default_str();
  pack->add_option("--text-table", o.text_table,
                   "pair every sample with a training caption of its class from this text table "
                   "(data captions + data embed or scripts/text_encoder.py)");
  pack->add_option("--text-encoder", o.text_encoder,
                   "image_folder: embed each image's own caption (DIR/metadata.jsonl, as "
                   "diffusers' train_text_to_image reads it, else IMAGE.txt or IMAGE.caption "
                   "beside it) with this text encoder: a transformers folder or a Stable "
                   "Diffusion pipeline's");
  pack->add_option("--text-length", o.text_length,
                   "with --text-encoder: tokens per caption (a UNet's text_length)")
      ->capture_default_str();
  pack->add_option("--skip-layers", o.skip_layers,
                   "with --text-encoder: the hidden state this many layers before the last")
      ->capture_default_str();
  pack->add_option("--caption-column", o.caption_column,
                   "with --text-encoder: metadata.jsonl's caption key")
      ->capture_default_str();
  pack->add_option("--crop", o.dataset.crop,
                   "image_folder: dit (DiT's center_crop_arr: BOX halvings, BICUBIC, centre "
                   "crop), square (the centred square, then BOX) or buckets (SDXL's aspect-ratio "
                   "buckets: each image resized with BILINEAR to cover the bucket nearest its "
                   "aspect ratio, then centre-cropped to it)")
      ->check(CLI::IsMember({"dit", "square", "buckets"}))
      ->capture_default_str();
  CLI::Option* buckets =
      pack->add_option("--buckets", o.buckets,
                       "with --crop buckets: auto (SDXL's buckets for --image-size, a multiple of "
                       "64: sides multiples of 64, areas up to its square) or a list HxW,HxW,... "
                       "of heights x widths in pixels")
          ->capture_default_str();
  pack->add_option("--vae", o.vae,
                   "encode the samples (a video's frames one by one) through this diffusers "
                   "AutoencoderKL (its folder, a pipeline's, or its safetensors file) into "
                   "latents × its scaling_factor");
  pack->add_flag("--mirror", o.mirror,
                 "with --vae: also encode each picture flipped left-right, which training's "
                 "data.horizontal_flip then takes for a flipped sample instead of the latents "
                 "flipped (diffusers' --random_flip flips the picture before the VAE)");
  pack->add_option("--vae-posterior", o.posterior,
                   "with --vae: sample (a draw of the posterior, as DiT's feature extraction) "
                   "or mode (its mean)")
      ->check(CLI::IsMember({"sample", "mode"}))
      ->capture_default_str();
  pack->footer(
      "Examples: difftrain data pack --dataset fashion_mnist --split train --out fmnist-train\n"
      "          difftrain data pack --dataset image_folder --path imagenet/train --image-size "
      "256 --vae sd-vae-ft-ema --out imagenet-latents");

  auto captions_out = std::make_shared<std::string>();
  CLI::App* captions =
      app.add_subcommand("captions", "write Fashion-MNIST's captions (JSON) for a text encoder");
  captions->add_option("--out", *captions_out, "the JSON file to write")->required();

  auto embed_options = std::make_shared<EmbedOptions>();
  CLI::App* embed = app.add_subcommand(
      "embed",
      "embed captions into a text table with a text encoder (--encoder) or the fixed token table "
      "(docs/data.md, docs/text-encoders.md)");
  embed->add_option("--captions", embed_options->captions, "captions JSON (data captions)")
      ->required();
  embed->add_option("--out", embed_options->out, "the text table to write (.safetensors)")
      ->required();
  embed->add_option("--length", embed_options->length, "tokens per text (L)")
      ->capture_default_str();
  embed->add_option("--dim", embed_options->dim,
                    "the token table's features per token (D, even; default 64)");
  embed->add_option("--encoder", embed_options->encoder,
                    "a text encoder: a transformers BERT or CLIP text model folder with its "
                    "tokenizer (all-MiniLM-L6-v2's), or a Stable Diffusion pipeline's folder or "
                    "its text_encoder/; default: the token table");
  embed
      ->add_option("--skip-layers", embed_options->skip_layers,
                   "with --encoder: take the hidden state this many layers before the last "
                   "(CLIP's clip skip)")
      ->capture_default_str();

  auto verify_dir = std::make_shared<std::string>();
  CLI::App* verify =
      app.add_subcommand("verify", "check a latent folder's index, shards and checksums");
  verify->add_option("DIR", *verify_dir, "the latent folder")->required();

  return [=] {
    if (pack->parsed()) {
      PackOptions given = *pack_options;
      given.channels_given = channels->count() > 0;
      given.image_size_given = image_size->count() > 0;
      given.buckets_given = buckets->count() > 0;
      return RunPack(given);
    }
    if (captions->parsed()) return RunCaptions(*captions_out);
    if (embed->parsed()) return RunEmbed(*embed_options);
    return RunVerify(*verify_dir);
  };
}

DIFFTRAIN_COMMAND(kDataCommand,
                  {"data", "dataset tools: pack a latent folder, verify one, make captions",
                   SetupData});

}  // namespace
}  // namespace difftrain::launch
