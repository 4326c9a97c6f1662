// `difftrain data`: dataset tools (docs/data.md).
//   data pack   writes a dataset as a latent folder (index.json + safetensors shards)
//   data verify checks a latent folder: index, shard headers and every shard's checksum
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "launch/command.h"
#include "model/data/dataset.h"
#include "model/data/latent_folder.h"

namespace difftrain::launch {
namespace {

struct PackOptions {
  DatasetSpec dataset;
  std::string out;
  int64_t per_shard = 8192;
  int64_t limit = 0;  // 0: every sample
};

int RunPack(const PackOptions& o) {
  if (o.per_shard < 1) return ReportBadInput("data pack", "--per-shard must be positive");
  if (o.limit < 0) return ReportBadInput("data pack", "--limit must not be negative");
  Result<std::unique_ptr<Dataset>> source = OpenDataset(o.dataset);
  if (!source.ok()) return ReportBadInput("data pack", source.status().message());
  if ((*source)->unbounded() && o.limit == 0) {
    return ReportBadInput("data pack",
                          fmt::format("dataset '{}' has no end: give --limit", o.dataset.kind));
  }
  const int64_t count = o.limit > 0 ? std::min(o.limit, (*source)->size()) : (*source)->size();
  const PrefixDataset samples(**source, count);
  Status written = WriteLatentFolder(samples, o.out, o.per_shard);
  if (!written.ok()) {
    std::fprintf(stderr, "difftrain data pack: %s\n", written.message().c_str());
    return kExitJobFailed;
  }
  spdlog::info("wrote {} samples of {}{}×{}×{} ({} classes) to {}", count,
               samples.frames() > 1 ? fmt::format("{}×", samples.frames()) : "", samples.channels(),
               samples.height(), samples.width(), samples.num_classes(), o.out);
  return kExitOk;
}

int RunVerify(const std::string& dir) {
  Result<std::unique_ptr<LatentFolderDataset>> folder = LatentFolderDataset::Open(dir);
  if (!folder.ok()) return ReportBadInput("data verify", folder.status().message());
  Status verified = (*folder)->VerifyChecksums();
  if (!verified.ok()) return ReportBadInput("data verify", verified.message());
  std::printf("%s: %lld samples of %d×%d×%d, %d classes, %lld shards, checksums good\n",
              dir.c_str(), static_cast<long long>((*folder)->size()), (*folder)->channels(),
              (*folder)->height(), (*folder)->width(), (*folder)->num_classes(),
              static_cast<long long>((*folder)->num_shards()));
  return kExitOk;
}

std::function<int()> SetupData(CLI::App& app) {
  app.require_subcommand(1);
  auto pack_options = std::make_shared<PackOptions>();
  PackOptions& o = *pack_options;
  CLI::App* pack = app.add_subcommand("pack", "write a dataset as a latent folder");
  pack->add_option("--dataset", o.dataset.kind,
                   "synthetic, fashion_mnist, moving_fashion_mnist or latent_folder")
      ->capture_default_str();
  pack->add_option("--path", o.dataset.path,
                   "fashion_mnist: directory of the IDX files (default Debian's); "
                   "latent_folder: the folder");
  pack->add_option("--split", o.dataset.split, "fashion_mnist: train or test")
      ->capture_default_str();
  pack->add_option("--out", o.out, "the folder to write")->required();
  pack->add_option("--per-shard", o.per_shard, "samples per shard file")->capture_default_str();
  pack->add_option("--limit", o.limit, "pack only the first N samples, 0 all (synthetic needs N)")
      ->capture_default_str();
  pack->add_option("--seed", o.dataset.seed, "synthetic: seed")->capture_default_str();
  pack->add_option("--channels", o.dataset.channels, "synthetic: channels")->capture_default_str();
  pack->add_option("--image-size", o.dataset.image_size,
                   "synthetic, moving_fashion_mnist: height and width")
      ->capture_default_str();
  pack->add_option("--frames", o.dataset.frames,
                   "synthetic, moving_fashion_mnist: frames per video (1: images)")
      ->capture_default_str();
  pack->add_option("--num-classes", o.dataset.num_classes, "synthetic: classes")
      ->capture_default_str();
  pack->footer(
      "Example: difftrain data pack --dataset fashion_mnist --split train --out fmnist-train");

  auto verify_dir = std::make_shared<std::string>();
  CLI::App* verify =
      app.add_subcommand("verify", "check a latent folder's index, shards and checksums");
  verify->add_option("DIR", *verify_dir, "the latent folder")->required();

  return [pack_options, verify_dir, pack] {
    return pack->parsed() ? RunPack(*pack_options) : RunVerify(*verify_dir);
  };
}

DIFFTRAIN_COMMAND(kDataCommand,
                  {"data", "dataset tools: pack a latent folder, verify one", SetupData});

}  // namespace
}  // namespace difftrain::launch
