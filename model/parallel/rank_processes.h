// Test support: one real process per rank, so that communicator tests exercise what a
// job does (separate address spaces, sockets, a rank that dies) and not threads posing as
// ranks. Header-only, for *_test.cc files; nothing in the library includes it.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/status.h"

namespace difftrain::parallel {

// Forks one process per rank in `ranks` (of a group of `size`), each running
// `body(rank)`. The forks happen before the test creates any thread, and the children
// leave with _exit, never returning into the test framework. A child's Status comes
// back through its exit code and, for an error, a file in `dir`.
class RankProcesses {
 public:
  using Body = std::function<Status(int rank)>;

  RankProcesses(std::string dir, int size, const Body& body)
      : RankProcesses(std::move(dir), size, {}, body) {}

  // Starts only `ranks` (all ranks when empty), for tests where a rank never comes.
  RankProcesses(std::string dir, int size, std::vector<int> ranks, const Body& body)
      : dir_(std::move(dir)), pids_(size, -1) {
    if (ranks.empty()) {
      for (int r = 0; r < size; ++r)
        ranks.push_back(r);
    }
    for (int r : ranks) {
      std::fflush(nullptr);  // so buffered output is not written twice
      const pid_t pid = ::fork();
      DT_CHECK(pid >= 0, "fork failed");
      if (pid == 0) RunChild(r, body);
      pids_[r] = pid;
    }
  }

  ~RankProcesses() {
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (pids_[r] > 0) {
        ::kill(pids_[r], SIGKILL);
        ::waitpid(pids_[r], nullptr, 0);
      }
    }
  }

  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  pid_t pid(int rank) const { return pids_[rank]; }

  void Kill(int rank) const { ::kill(pids_[rank], SIGKILL); }

  // Waits for `rank` to exit and returns its Status: its own error, or one saying it did
  // not exit within `limit` (it is then killed) or died by a signal.
  Status Wait(int rank, std::chrono::milliseconds limit) {
    DT_CHECK(pids_[rank] > 0, "rank {} was not started or was already waited for", rank);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int wstatus = 0;
    pid_t done = 0;
    while ((done = ::waitpid(pids_[rank], &wstatus, WNOHANG)) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pids_[rank], SIGKILL);
        ::waitpid(pids_[rank], nullptr, 0);
        pids_[rank] = -1;
        return Errorf("rank {} did not exit within {} ms", rank, limit.count());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pids_[rank] = -1;
    DT_CHECK(done > 0, "waitpid failed");
    if (WIFSIGNALED(wstatus)) return Errorf("rank {} died by signal {}", rank, WTERMSIG(wstatus));
    if (WEXITSTATUS(wstatus) == 0) return Status::Ok();
    std::ifstream file(ErrorFile(rank));
    std::stringstream message;
    message << file.rdbuf();
    return Status::Error(message.str());
  }

  // Waits for every started rank; the first error, prefixed with its rank.
  Status WaitAll(std::chrono::milliseconds limit) {
    Status first;
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (pids_[r] <= 0) continue;
      Status status = Wait(static_cast<int>(r), limit);
      if (first.ok() && !status.ok()) first = status.WithContext(fmt::format("rank {}", r));
    }
    return first;
  }

 private:
  std::string ErrorFile(int rank) const { return fmt::format("{}/rank{}.error", dir_, rank); }

  [[noreturn]] void RunChild(int rank, const Body& body) const {
    const Status status = body(rank);
    if (!status.ok()) {
      std::ofstream(ErrorFile(rank)) << status.message();
    }
    std::fflush(nullptr);
    ::_exit(status.ok() ? 0 : 1);
  }

  std::string dir_;
  std::vector<pid_t> pids_;
};

}  // namespace difftrain::parallel
