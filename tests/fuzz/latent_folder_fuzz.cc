// libFuzzer target: opening a latent folder (model/data/latent_folder.h) whose index.json is
// the input, beside shards and a text table that are real: a folder of `difftrain data pack`
// a user copied, edited or cut short. `train` reads it from the job's data section; the index
// must open and every sample read, or be an error naming the file and field, never crash,
// hang, run into undefined behaviour or read a sample from outside its tensor.
//
// The folder (a temporary directory made once) holds four shards of F32 latents whose every
// float is distinct, written here: two of 1×2×2 samples with all the optional tensors
// (geometry, mirror images, text ids), one of a 1×2×4 bucket and one of videos of 2 frames.
// What must hold for an index that opens: each sample reads (Get, GetMirrored, GetGeometry)
// as the shard's own floats for it (the shard and position its global index names), labels in
// [0, max(num_classes, 1)), text ids inside the table, buckets inside the list.
//
// LATENT_FOLDER_FUZZ_SEEDS=DIR writes the seeds (tests/fuzz/latent_folder_fuzz), indexes over
// those shards, and exits.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/data/latent_folder.h"
#include "model/data/text_table.h"
#include "model/io/safetensors.h"
#include "tests/fuzz/mutator.h"

extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

namespace {

using namespace difftrain;
namespace fs = std::filesystem;

// A shard of the fixture: its samples' shape after the count, and the first float's value.
struct ShardSpec {
  const char* file;
  std::vector<int64_t> sample;  // [C, H, W] or [F, C, H, W]
  int64_t count;
  bool extras;  // geometry, mirror images and text ids
};
const std::vector<ShardSpec>& Shards() {
  static const std::vector<ShardSpec> shards = {{"a.safetensors", {1, 2, 2}, 3, true},
                                                {"b.safetensors", {1, 2, 2}, 2, true},
                                                {"wide.safetensors", {1, 2, 4}, 2, true},
                                                {"video.safetensors", {2, 1, 2, 2}, 2, false}};
  return shards;
}
constexpr int kTexts = 3;

// The value of float `i` of sample `s` of shard `k` (its mirror image's negated): each float
// of the folder its own.
float Value(size_t k, int64_t s, int64_t i) {
  return static_cast<float>(1000 * (k + 1) + 100 * s + i);
}

int64_t Floats(const std::vector<int64_t>& sample) {
  int64_t n = 1;
  for (int64_t d : sample)
    n *= d;
  return n;
}

void Write(const fs::path& dir) {
  for (size_t k = 0; k < Shards().size(); ++k) {
    const ShardSpec& spec = Shards()[k];
    const int64_t floats = Floats(spec.sample);
    std::vector<float> latents, mirrored;
    std::vector<int64_t> labels, text_ids, geometry;
    for (int64_t s = 0; s < spec.count; ++s) {
      for (int64_t i = 0; i < floats; ++i) {
        latents.push_back(Value(k, s, i));
        mirrored.push_back(-Value(k, s, i));
      }
      labels.push_back(s % 2);
      text_ids.push_back(s % kTexts);
      const int64_t h = spec.sample[spec.sample.size() - 2], w = spec.sample.back();
      geometry.insert(geometry.end(), {8 * h, 8 * w, s, 0, 8 * h, 8 * w});
    }
    std::vector<int64_t> shape = {spec.count};
    shape.insert(shape.end(), spec.sample.begin(), spec.sample.end());
    io::SafetensorsWriter writer;
    writer.AddF32("latents", shape, latents.data());
    writer.Add("labels", io::DType::kI64, {spec.count}, labels.data());
    if (spec.extras) {
      writer.AddF32("latents_mirrored", shape, mirrored.data());
      writer.Add("text_ids", io::DType::kI64, {spec.count}, text_ids.data());
      writer.Add("geometry", io::DType::kI64, {spec.count, 6}, geometry.data());
    }
    if (!writer.WriteAtomic((dir / spec.file).string()).ok()) std::abort();
  }
  TextTable texts;
  texts.length = 2;
  texts.dim = 3;
  texts.encoder = "fuzz";
  for (int k = 0; k < kTexts; ++k)
    texts.captions.push_back("caption " + std::to_string(k));
  texts.embeddings.assign(size_t{kTexts} * 2 * 3, 0.5f);
  if (!WriteTextTable(texts, (dir / "texts.safetensors").string()).ok()) std::abort();
}

// The fixture's folder, removed when the fuzzer exits.
class Fixture {
 public:
  Fixture() {
    char name[] = "/tmp/latent_folder_fuzz_XXXXXX";
    if (::mkdtemp(name) == nullptr) std::abort();
    dir_ = name;
    Write(dir_);
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

const fs::path& Folder() {
  static const Fixture fixture;
  return fixture.dir();
}

// Indexes over the fixture's shards, as `data pack` writes them.
void WriteSeeds(const std::string& dir) {
  const auto shard = [](const char* file, int64_t count) {
    return nlohmann::json{{"file", file}, {"count", count}};
  };
  const nlohmann::json base = {{"format", "difftrain-latents"},
                               {"version", 1},
                               {"channels", 1},
                               {"height", 2},
                               {"width", 2},
                               {"num_classes", 2}};
  const auto write = [&](const std::string& name, nlohmann::json index) {
    std::ofstream(dir + "/" + name) << index.dump(2) << "\n";
  };
  nlohmann::json plain = base;
  plain["shards"] = {shard("a.safetensors", 3), shard("b.safetensors", 2)};
  plain["total"] = 5;
  write("plain", plain);
  nlohmann::json everything = plain;
  everything["geometry"] = true;
  everything["mirrored"] = true;
  everything["text"] = {{"file", "texts.safetensors"}, {"length", 2}, {"dim", 3}, {"count", 3}};
  everything["vae"] = {{"path", "/models/vae.safetensors"},
                       {"scaling_factor", 0.18215},
                       {"posterior", "sample"},
                       {"seed", 7}};
  write("everything", everything);
  nlohmann::json buckets = base;
  buckets["buckets"] = {{{"height", 2}, {"width", 2}}, {{"height", 2}, {"width", 4}}};
  buckets["geometry"] = true;
  buckets["shards"] = {shard("a.safetensors", 3), shard("wide.safetensors", 2),
                       shard("b.safetensors", 2)};
  buckets["shards"][0]["bucket"] = 0;
  buckets["shards"][1]["bucket"] = 1;
  buckets["shards"][2]["bucket"] = 0;
  buckets["total"] = 7;
  write("buckets", buckets);
  nlohmann::json video = base;
  video["frames"] = 2;
  video["shards"] = nlohmann::json::array({shard("video.safetensors", 2)});
  video["total"] = 2;
  write("video", video);
}

[[noreturn]] void Fail(const char* what, int64_t index) {
  std::fprintf(stderr, "sample %lld: %s\n", static_cast<long long>(index), what);
  std::abort();
}

}  // namespace

// Half the mutations know the index is JSON (libFuzzer's byte-level ones did not find, in
// 180 s, two shard counts near 2^62): a number anywhere set to an extreme, an array's element
// copied, a member dropped.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  nlohmann::json index = nlohmann::json::parse(data, data + size, nullptr, false);
  if (index.is_discarded() || !index.is_object() || rng() % 2 == 0)
    return LLVMFuzzerMutate(data, size, max_size);
  // Every number, array and member of the index, as JSON pointers.
  std::vector<nlohmann::json::json_pointer> numbers, arrays, members;
  const std::function<void(const nlohmann::json&, const nlohmann::json::json_pointer&)> walk =
      [&](const nlohmann::json& j, const nlohmann::json::json_pointer& at) {
        if (j.is_number()) numbers.push_back(at);
        if (j.is_array()) {
          arrays.push_back(at);
          for (size_t i = 0; i < j.size(); ++i)
            walk(j[i], at / i);
        }
        if (j.is_object()) {
          for (const auto& [key, value] : j.items()) {
            members.push_back(at / key);
            walk(value, at / key);
          }
        }
      };
  walk(index, nlohmann::json::json_pointer());
  constexpr int64_t kNumbers[] = {-1,       0, 1, 2, 3, 2147483647, 2147483648, int64_t{1} << 62,
                                  INT64_MAX};
  switch (rng() % 3) {
    case 0:
      if (numbers.empty()) break;
      index[numbers[rng() % numbers.size()]] = kNumbers[rng() % std::size(kNumbers)];
      break;
    case 1:
      if (arrays.empty()) break;
      if (nlohmann::json& a = index[arrays[rng() % arrays.size()]]; !a.empty())
        a.push_back(nlohmann::json(a[rng() % a.size()]));
      break;
    default: {
      if (members.empty()) break;
      const nlohmann::json::json_pointer at = members[rng() % members.size()];
      index[at.parent_pointer()].erase(at.back());
      break;
    }
  }
  return fuzz::Mutated(data, size, max_size, index.dump());
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("LATENT_FOLDER_FUZZ_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  (void)Folder();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = Folder();
  {
    std::ofstream index(dir / "index.json", std::ios::binary | std::ios::trunc);
    index.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  (void)ReadLatentFolderVae(dir.string());
  Result<std::unique_ptr<LatentFolderDataset>> opened = LatentFolderDataset::Open(dir.string());
  if (std::getenv("LATENT_FOLDER_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "%s\n", opened.ok() ? "opened" : opened.status().message().c_str());
  }
  if (!opened.ok()) return 0;
  const LatentFolderDataset& folder = **opened;

  // Where each global sample index lies: the index's shards in order, by file name.
  const nlohmann::json index = nlohmann::json::parse(data, data + size);
  std::vector<std::pair<size_t, int64_t>> where;  // fixture shard, sample in it
  for (const nlohmann::json& entry : index["shards"]) {
    const std::string file = entry["file"];
    size_t k = 0;
    while (k < Shards().size() && file != Shards()[k].file)
      ++k;
    if (k == Shards().size()) Fail("opened from a shard the fixture has not", 0);
    for (int64_t s = 0; s < entry["count"].get<int64_t>(); ++s)
      where.push_back({k, s});
  }
  if (static_cast<int64_t>(where.size()) != folder.size())
    Fail("a count that is not the folder's", 0);
  const std::vector<SampleSize> buckets = folder.buckets();
  for (int64_t i = 0; i < folder.size(); ++i) {
    const auto [k, s] = where[static_cast<size_t>(i)];
    const int64_t floats = Floats(Shards()[k].sample);
    if (folder.SampleFloats(i) != floats) Fail("a size that is not its shard's", i);
    if (folder.BucketOf(i) < 0 || folder.BucketOf(i) >= static_cast<int>(buckets.size()))
      Fail("a bucket outside the list", i);
    std::vector<float> sample(static_cast<size_t>(floats));
    int32_t label = -1;
    if (!folder.Get(i, sample.data(), &label).ok())
      Fail("an opened folder's sample does not read", i);
    for (int64_t f = 0; f < floats; ++f) {
      if (sample[f] != Value(k, s, f)) Fail("floats from outside the sample", i);
    }
    if (label < 0 || label >= std::max(folder.num_classes(), 1)) Fail("a label outside", i);
    if (folder.texts() != nullptr &&
        (folder.TextId(i) < 0 || folder.TextId(i) >= folder.texts()->size()))
      Fail("a text id outside the table", i);
    if (folder.has_mirrored()) {
      if (!folder.GetMirrored(i, sample.data(), &label).ok()) Fail("no mirror image", i);
      for (int64_t f = 0; f < floats; ++f) {
        if (sample[f] != -Value(k, s, f)) Fail("a mirror image from outside the sample", i);
      }
    }
    if (folder.has_geometry()) {
      PictureGeometry g;
      if (!folder.GetGeometry(i, &g).ok() || g.crop_top != s) Fail("another sample's geometry", i);
    }
  }
  return 0;
}
