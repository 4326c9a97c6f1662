// `difftrain sample --watch` (launch/sample_watch.h).
#include "launch/sample_watch.h"

#include <array>
#include <chrono>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "common/log.h"
#include "model/io/checkpoint.h"
#include "model/io/png.h"
#include "model/io/posix_file.h"
#include "model/io/safetensors.h"
#include "model/io/tensorboard.h"

namespace difftrain::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Between two listings of the run's directory.
constexpr auto kPollInterval = std::chrono::milliseconds(500);

// The outputs `s` asks for (each empty where not), and whether each is a folder.
std::array<std::pair<std::string*, bool>, 4> Outputs(SampleOptions& s) {
  return {{{&s.out, false}, {&s.out_dir, true}, {&s.gif, false}, {&s.raw, false}}};
}

// o with its outputs moved to step `step`'s paths and its checkpoint the step's directory.
SampleOptions ForStep(const SampleOptions& o, const io::CheckpointStore& store, int64_t step) {
  SampleOptions s = o;
  s.watch = false;
  s.tensorboard.clear();
  s.checkpoint = store.StepDir(step);
  for (auto [path, folder] : Outputs(s)) {
    if (!path->empty()) *path = StepOutput(*path, step, folder);
  }
  return s;
}

// Whether every output of `s` exists: a step an earlier watcher sampled.
bool Sampled(SampleOptions s) {
  std::error_code ec;
  for (auto [path, folder] : Outputs(s)) {
    if (!path->empty() && !fs::exists(*path, ec)) return false;
  }
  return true;
}

// The run's last step: train.steps in the metadata of step `step`'s first shard.
Result<int64_t> LastStepOfRun(const io::CheckpointStore& store, int64_t step) {
  DT_ASSIGN_OR_RETURN(int world, store.World(step));
  const std::string path = store.ShardPath(step, 0, world);
  DT_ASSIGN_OR_RETURN(io::SafetensorsFile header, io::SafetensorsFile::ReadHeader(path));
  auto it = header.metadata().find("train");
  if (it == header.metadata().end()) return Errorf("'{}': metadata has no 'train'", path);
  const nlohmann::json train = nlohmann::json::parse(it->second, nullptr, false);
  if (!train.is_object() || !train.contains("train") || !train["train"].contains("steps") ||
      !train["train"]["steps"].is_number_integer()) {
    return Errorf("'{}': metadata 'train' has no train.steps", path);
  }
  return train["train"]["steps"].get<int64_t>();
}

// The grid PNG at `path` as the TensorBoard image `samples` of step `step`.
Status LogGrid(io::TensorBoardWriter& tensorboard, const std::string& path, int64_t step) {
  DT_ASSIGN_OR_RETURN(io::PngImage grid, io::ReadPng(path));
  DT_ASSIGN_OR_RETURN(std::string png, io::ReadWholeFile(path));
  return tensorboard.Image(step, "samples", png, grid.height, grid.width, grid.channels);
}

}  // namespace

std::string StepOutput(const std::string& path, int64_t step, bool folder) {
  const std::string name = fmt::format("step-{:08d}", step);
  const fs::path p(path);
  if (folder) return (p / name).string();
  return (p.parent_path() / (p.stem().string() + "-" + name + p.extension().string())).string();
}

int WatchCheckpoints(const SampleOptions& o,
                     const std::function<int(const SampleOptions&)>& sample) {
  auto bad = [](const std::string& message) { return ReportBadInput("sample", message); };
  if (Status s = SetupLogging(o.log_level); !s.ok()) return bad(s.message());
  if (o.checkpoint.empty()) return bad("--watch watches a run's --checkpoint directory");
  std::error_code ec;
  if (fs::exists(fs::path(o.checkpoint) / "manifest.json", ec)) {
    return bad(fmt::format(
        "--watch takes a run's checkpoint directory, and '{}' is one of its steps", o.checkpoint));
  }
  if (!(o.watch_timeout > 0)) {
    return bad(fmt::format("--watch-timeout must be positive, got {}", o.watch_timeout));
  }
  std::optional<io::TensorBoardWriter> tensorboard;
  if (!o.tensorboard.empty()) {
    if (o.out.empty()) return bad("--tensorboard logs the grid: give --out too");
    // A run of its own: a training attempt's SessionLog START drops the events of its later
    // steps that TensorBoard read before it, which in the same run could be these.
    Result<io::TensorBoardWriter> opened =
        io::TensorBoardWriter::Open((fs::path(o.tensorboard) / "samples").string());
    if (!opened.ok()) return bad("--tensorboard: " + opened.status().message());
    tensorboard.emplace(std::move(opened).value());
  }
  const io::CheckpointStore store(o.checkpoint, 0);
  const auto timeout = std::chrono::duration<double>(o.watch_timeout);
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  std::set<int64_t> done;  // sampled, found sampled, or gone before it could be
  std::optional<int64_t> last_step;
  spdlog::info("sample --watch: watching {} for checkpoints (at most {} s between them)",
               o.checkpoint, o.watch_timeout);
  while (true) {
    Result<std::vector<int64_t>> published = store.PublishedSteps();
    if (!published.ok()) {
      spdlog::error("sample --watch: {}", published.status().message());
      return kExitJobFailed;
    }
    if (!last_step && !published->empty()) {
      Result<int64_t> last = LastStepOfRun(store, published->front());
      if (last.ok()) {
        last_step = *last;
      } else if (fs::exists(store.StepDir(published->front()), ec)) {
        spdlog::error("sample --watch: {}", last.status().message());
        return kExitJobFailed;
      }  // else pruned since the listing: the next round reads another step
    }
    std::optional<int64_t> next;
    for (int64_t step : *published) {
      if (done.count(step)) continue;
      if (Sampled(ForStep(o, store, step))) {
        spdlog::info("sample --watch: step {} was sampled before; skipped", step);
        done.insert(step);
        continue;
      }
      next = step;
      break;
    }
    if (!next) {
      if (last_step && done.count(*last_step)) {
        spdlog::info("sample --watch: the run's last step {} is sampled", *last_step);
        return kExitOk;
      }
      if (Clock::now() > deadline) {
        spdlog::error(
            "sample --watch: no new checkpoint in {} for {} s (--watch-timeout){}; stopping",
            o.checkpoint, o.watch_timeout,
            last_step ? fmt::format(", and the run's last step {} is not among them", *last_step)
                      : "");
        return kExitJobFailed;
      }
      std::this_thread::sleep_for(kPollInterval);
      continue;
    }
    const int64_t step = *next;
    SampleOptions options = ForStep(o, store, step);
    // The outputs' folders, made as the first step needs them (on a volume that starts empty).
    for (auto [path, folder] : Outputs(options)) {
      const fs::path parent = fs::path(*path).parent_path();
      if (path->empty() || parent.empty()) continue;
      if (fs::create_directories(parent, ec); ec) {
        spdlog::error("sample --watch: cannot create '{}': {}", parent.string(), ec.message());
        return kExitJobFailed;
      }
    }
    spdlog::info("sample --watch: sampling step {}", step);
    const int rc = sample(options);
    done.insert(step);
    if (rc != kExitOk) {
      if (!fs::exists(store.StepDir(step), ec)) {
        spdlog::warn("sample --watch: step {} was pruned (checkpoint.keep) before it was read",
                     step);
        continue;
      }
      return rc;
    }
    if (tensorboard) {
      if (Status s = LogGrid(*tensorboard, options.out, step); !s.ok()) {
        spdlog::error("sample --watch: --tensorboard: {}", s.message());
        return kExitJobFailed;
      }
    }
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  }
}

}  // namespace difftrain::launch
