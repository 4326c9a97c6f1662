// Gradient all-reduce time with the Gloo and the MPI communicators, side by side in one MPI
// launch (bench/mpi_allreduce.sh runs it for DiT-S/4 at dp 2). Each repetition reduces a
// buffer of --floats in buckets of --bucket-mb, all issued at once and then waited for, as
// the gradient buckets are after backward without overlap; the backends alternate, one
// repetition each, after a barrier. Rank 0 prints each backend's times in ms and their median.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "model/parallel/gloo_comm.h"
#include "model/parallel/mpi_world.h"

namespace difftrain::parallel {
namespace {

struct Options {
  size_t floats = 0;
  double bucket_mb = 4;
  int repetitions = 20;
  int warmup = 2;
};

// Seconds to all-reduce `buffer` in buckets of `bucket` floats.
Result<double> ReduceOnce(Comm& comm, std::vector<float>& buffer, size_t bucket) {
  if (Status s = comm.Barrier(); !s.ok()) return s;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<CommWork>> pending;
  for (size_t at = 0; at < buffer.size(); at += bucket) {
    pending.push_back(comm.AllReduceAsync(buffer.data() + at, std::min(bucket, buffer.size() - at),
                                          ReduceOp::kAvg));
  }
  for (std::unique_ptr<CommWork>& work : pending) {
    if (Status s = work->Wait(); !s.ok()) return s;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int Run(const Options& o) {
  Result<std::unique_ptr<MpiWorld>> joined = JoinMpiWorld();
  if (!joined.ok()) {
    std::fprintf(stderr, "%s\n", joined.status().message().c_str());
    return 2;
  }
  MpiWorld& world = **joined;
  std::vector<int> ranks(world.size());
  for (int r = 0; r < world.size(); ++r)
    ranks[r] = r;
  const auto timeout = std::chrono::seconds(120);
  const std::string group = GroupName("dp", ranks);
  Result<std::unique_ptr<Comm>> gloo = CreateGlooComm(world.store(), "bench/gloo/" + group,
                                                      world.rank(), world.size(), ranks, timeout);
  Result<std::unique_ptr<Comm>> mpi =
      world.CreateComm("bench/mpi/" + group, world.rank(), world.size(), ranks, timeout);
  if (!gloo.ok() || !mpi.ok()) {
    std::fprintf(stderr, "%s\n", (gloo.ok() ? mpi.status() : gloo.status()).message().c_str());
    world.Abort(1);
  }
  std::vector<float> buffer(o.floats, 1.0f);
  const auto bucket = static_cast<size_t>(o.bucket_mb * (1 << 20) / sizeof(float));
  std::map<std::string, std::vector<double>> ms;
  for (int i = 0; i < o.warmup + o.repetitions; ++i) {
    for (auto& [name, comm] : {std::pair<std::string, Comm*>{"gloo", gloo->get()},
                               std::pair<std::string, Comm*>{"mpi", mpi->get()}}) {
      Result<double> seconds = ReduceOnce(*comm, buffer, bucket);
      if (!seconds.ok()) {
        std::fprintf(stderr, "%s\n", seconds.status().message().c_str());
        world.Abort(1);
      }
      if (i >= o.warmup) ms[name].push_back(*seconds * 1000);
    }
  }
  if (world.rank() == 0) {
    std::printf("%zu floats (%.1f MiB) in buckets of %.0f MiB, %d ranks, %d repetitions\n",
                o.floats, o.floats * 4.0 / (1 << 20), o.bucket_mb, world.size(), o.repetitions);
    for (auto& [name, times] : ms) {
      std::vector<double> sorted = times;
      std::sort(sorted.begin(), sorted.end());
      std::printf("%-4s median %.1f ms; min %.1f, max %.1f; all: %s\n", name.c_str(),
                  sorted[sorted.size() / 2], sorted.front(), sorted.back(),
                  fmt::format("{:.1f}", fmt::join(times, " ")).c_str());
    }
  }
  gloo->reset();
  mpi->reset();
  if (!world.Finalize(timeout).ok()) world.Abort(1);
  return 0;
}

}  // namespace
}  // namespace difftrain::parallel

int main(int argc, char** argv) {
  difftrain::parallel::Options o;
  CLI::App app{"Gradient all-reduce time with the Gloo and the MPI communicators (under mpirun)"};
  app.add_option("--floats", o.floats, "floats to reduce (the model's parameters)")->required();
  app.add_option("--bucket-mb", o.bucket_mb, "bucket size in MiB")->capture_default_str();
  app.add_option("--repetitions", o.repetitions, "timed repetitions per backend")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return difftrain::parallel::Run(o);
}
