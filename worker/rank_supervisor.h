// The rank processes one worker daemon supervises: started without a shell (fork, execve),
// each dying with the daemon's thread that started it, each in its own process group; their
// progress pipes read line by line; their ends reaped and explained (an exit code, a signal,
// the kernel's OOM killer, a rank still in the kernel long after its SIGKILL). The daemon
// (worker.cc) owns the conversation with the controller and reports what Reap returns; this
// knows nothing of it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/common.h>
#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain::worker {

class RankMetrics;

// The rank's end of its progress pipe, exported as DIFFTRAIN_PROGRESS_FD.
inline constexpr int kProgressFd = 3;

// How a rank's process ended.
struct RankExit {
  int rank = 0;
  int exit_code = 0;  // its exit status; 0 when a signal ended it
  int signal = 0;     // the signal that ended it; 0 when it exited
  // Killed with a SIGKILL this daemon did not send while the machine's OOM-kill count rose.
  bool oom_killed = false;
};

class RankSupervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // `node` names this daemon in log lines; `metrics` (may be null) gets each progress line
  // and each rank's end.
  RankSupervisor(std::string node, RankMetrics* metrics);
  // Kills what still runs (KillAll).
  ~RankSupervisor();
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // Starts args[0] (a path: no shell, no PATH lookup) with `args` as global rank `rank`. Its
  // environment is this process's, with the variables in `env` set or replaced, and
  // DIFFTRAIN_PROGRESS_FD naming the write end of its progress pipe. A binary that cannot be
  // executed is a start that ends at once with code 127, reported by Reap.
  Status Start(int rank, const std::vector<std::string>& args,
               const std::map<std::string, std::string>& env);

  // The read ends of the progress pipes still open, for poll().
  std::vector<int> ProgressFds() const;
  // Reads what the ranks wrote: each complete line that is a JSON object is the rank's latest
  // progress (and a metrics record); other lines are skipped, and an unfinished line longer than
  // 4 KiB is dropped.
  void ReadProgress();
  // The ranks whose processes ended since the last call, removed from those running. A rank
  // still not reaped kReapSeconds after its SIGKILL is reported killed by SIGKILL and reaped
  // later, unreported.
  std::vector<RankExit> Reap();

  // Sends `signal` to every rank (SIGUSR1: finish the step, checkpoint, exit 75).
  void Signal(int signal) const;
  // SIGKILL to every rank not yet killed, logging `why` at `level`; Reap reports their ends.
  void KillLeft(const std::string& why, spdlog::level::level_enum level);
  // SIGKILL to every rank, then waits up to kReapSeconds for them to go; their ends are not
  // reported (a new attempt, the end of the job, a lost controller).
  void KillAll();

  bool empty() const { return ranks_.empty(); }
  int size() const { return static_cast<int>(ranks_.size()); }
  // The running ranks, "0,1,2", for log lines.
  std::string List() const;
  // For the daemon's heartbeat: per rank that has reported a step, its rank, pid, step, loss,
  // step_seconds, samples_per_second and compute_seconds.
  nlohmann::json Progress() const;

  // How long a rank killed with SIGKILL may take to be reaped before it is reported gone
  // anyway (a process in uninterruptible I/O dies only when the I/O returns; it runs no more of
  // its own code).
  static constexpr std::chrono::seconds kReapSeconds{10};

 private:
  struct Process {
    int rank = 0;
    pid_t pid = -1;
    std::optional<Clock::time_point> killed_at;  // when it was sent SIGKILL
    int progress_fd = -1;                        // the read end
    std::string partial;                         // an unfinished line
    nlohmann::json progress;                     // the last complete line
  };

  void ReadProgressOf(Process& p);
  void LookAtOomKills(Clock::time_point now, bool start);
  bool OomKilledLately() const;
  void ReapLingering();
  void SetRunning() const;

  std::string node_;
  RankMetrics* metrics_;
  std::vector<Process> ranks_;
  std::vector<pid_t> lingering_;   // killed, not yet reaped
  int64_t oom_kills_ = -1;         // the OOM-kill count at the last look (-1: unknown)
  int64_t oom_kills_before_ = -1;  // at the look before
  Clock::time_point oom_looked_;
};

}  // namespace difftrain::worker
