#include "worker/rank_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/rank_report.h"
#include "model/tensor/host_memory.h"
#include "worker/rank_metrics.h"

extern char** environ;

namespace difftrain::worker {
namespace {

constexpr size_t kMaxProgressLine = 4096;
// How often the machine's OOM-kill count (/proc/vmstat) is read while ranks run, so that a
// rank's SIGKILL is blamed on the OOM killer only when it killed something within one to two
// of these before the rank's death was seen.
constexpr std::chrono::seconds kOomLook{1};

double SecondsOf(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double Number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// Forks and execs; in the child only async-signal-safe calls before execve (the daemon may
// have other threads). The child dies with the thread that forked it (PR_SET_PDEATHSIG), so a
// killed daemon leaves no ranks behind, and it leads its own process group, so a terminal's
// Ctrl-C reaches the daemon, which decides. Returns the pid and the pipe's read end.
Result<std::pair<pid_t, int>> Spawn(const std::vector<std::string>& args,
                                    const std::vector<std::string>& env) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Errorf("pipe: {}", std::strerror(errno));
  std::vector<char*> argv, envp;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Errorf("fork: {}", std::strerror(errno));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);
    if (fds[1] == kProgressFd) {
      ::fcntl(kProgressFd, F_SETFD, 0);
    } else if (::dup2(fds[1], kProgressFd) < 0) {
      ::_exit(127);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return std::pair{pid, fds[0]};
}

}  // namespace

RankSupervisor::RankSupervisor(std::string node, RankMetrics* metrics)
    : node_(std::move(node)), metrics_(metrics) {}

RankSupervisor::~RankSupervisor() {
  KillAll();
}

Status RankSupervisor::Start(int rank, const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& env) {
  if (args.empty() || args.front().empty()) return Errorf("rank {}: no program to start", rank);
  std::map<std::string, std::string> ours = env;
  ours["DIFFTRAIN_PROGRESS_FD"] = std::to_string(kProgressFd);
  std::vector<std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    if (!ours.contains(var.substr(0, var.find('=')))) merged.push_back(var);
  }
  for (const auto& [k, v] : ours)
    merged.push_back(k + "=" + v);
  DT_ASSIGN_OR_RETURN(auto spawned, Spawn(args, merged));
  Process p;
  p.rank = rank;
  p.pid = spawned.first;
  p.progress_fd = spawned.second;
  ranks_.push_back(std::move(p));
  // The OOM window starts with the ranks: a count that rose before they ran blames none.
  LookAtOomKills(Clock::now(), /*start=*/true);
  SetRunning();
  return Status::Ok();
}

std::vector<int> RankSupervisor::ProgressFds() const {
  std::vector<int> fds;
  for (const Process& p : ranks_)
    if (p.progress_fd >= 0) fds.push_back(p.progress_fd);
  return fds;
}

void RankSupervisor::ReadProgress() {
  for (Process& p : ranks_)
    if (p.progress_fd >= 0) ReadProgressOf(p);
}

void RankSupervisor::ReadProgressOf(Process& p) {
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(p.progress_fd, buffer, sizeof buffer);
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        ::close(p.progress_fd);
        p.progress_fd = -1;
      }
      return;
    }
    p.partial.append(buffer, static_cast<size_t>(n));
    for (size_t eol; (eol = p.partial.find('\n')) != std::string::npos;) {
      nlohmann::json line =
          nlohmann::json::parse(p.partial.substr(0, eol), nullptr, /*allow_exceptions=*/false);
      p.partial.erase(0, eol + 1);
      if (!line.is_object()) continue;
      if (metrics_) {
        RankReport report = RankReport::FromJson(line);
        report.rank = p.rank;
        metrics_->Record(report);
      }
      p.progress = std::move(line);
    }
    if (p.partial.size() > kMaxProgressLine) p.partial.clear();
  }
}

// The machine's OOM-kill count is looked at every kOomLook while ranks run (and when they
// start); a rank that died of a SIGKILL this daemon did not send, while the count rose above
// the look before the last (one to two looks ago), was most likely killed for memory.
void RankSupervisor::LookAtOomKills(Clock::time_point now, bool start) {
  const int64_t count = OomKillCount();
  oom_kills_before_ = start ? count : oom_kills_;
  oom_kills_ = count;
  oom_looked_ = now;
}

bool RankSupervisor::OomKilledLately() const {
  return oom_kills_before_ >= 0 && OomKillCount() > oom_kills_before_;
}

void RankSupervisor::ReapLingering() {
  for (pid_t& pid : lingering_)
    if (::waitpid(pid, nullptr, WNOHANG) == pid) pid = -1;
  std::erase(lingering_, -1);
}

std::vector<RankExit> RankSupervisor::Reap() {
  const Clock::time_point now = Clock::now();
  if (!ranks_.empty() && now - oom_looked_ > kOomLook) LookAtOomKills(now, /*start=*/false);
  ReapLingering();
  std::vector<RankExit> exits;
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    int status = 0;
    const bool reaped = ::waitpid(it->pid, &status, WNOHANG) == it->pid;
    const bool stuck = !reaped && it->killed_at && now - *it->killed_at > kReapSeconds;
    if (!reaped && !stuck) {
      ++it;
      continue;
    }
    if (stuck) {
      // SIGKILL is delivered; it dies when its I/O returns, and runs none of its code.
      spdlog::error(
          "worker {}: rank {} (pid {}) not gone {:.0f} s after SIGKILL (stuck in the "
          "kernel?); reporting it killed",
          node_, it->rank, it->pid, SecondsOf(now - *it->killed_at));
      lingering_.push_back(it->pid);
      status = SIGKILL;  // as if killed: WIFSIGNALED, WTERMSIG 9
    }
    if (it->progress_fd >= 0) ReadProgressOf(*it);  // what it wrote before it went
    RankExit e;
    e.rank = it->rank;
    e.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    e.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    e.oom_killed = e.signal == SIGKILL && !it->killed_at && !stuck && OomKilledLately();
    spdlog::log(e.exit_code == 0 && e.signal == 0 ? spdlog::level::info : spdlog::level::warn,
                "worker {}: rank {} (pid {}) {}", node_, it->rank, it->pid,
                e.oom_killed
                    ? fmt::format("killed by signal {} by the kernel's OOM killer (its count "
                                  "rose meanwhile): out of host memory; this node's ranks may "
                                  "use {}",
                                  e.signal, ReadHostMemory().DescribeCapacity())
                : e.signal ? fmt::format("killed by signal {}", e.signal)
                           : fmt::format("exited with code {}", e.exit_code));
    if (it->progress_fd >= 0) ::close(it->progress_fd);
    if (metrics_) metrics_->RankExited(it->rank);
    exits.push_back(e);
    it = ranks_.erase(it);
  }
  if (!exits.empty()) SetRunning();
  return exits;
}

void RankSupervisor::Signal(int signal) const {
  for (const Process& p : ranks_)
    ::kill(p.pid, signal);
}

void RankSupervisor::KillLeft(const std::string& why, spdlog::level::level_enum level) {
  const Clock::time_point now = Clock::now();
  for (Process& p : ranks_) {
    if (p.killed_at) continue;
    spdlog::log(level, "worker {}: rank {} (pid {}) killed with SIGKILL: {}", node_, p.rank, p.pid,
                why);
    ::kill(p.pid, SIGKILL);
    p.killed_at = now;
  }
}

void RankSupervisor::KillAll() {
  for (Process& p : ranks_) {
    ::kill(p.pid, SIGKILL);
    if (p.progress_fd >= 0) ::close(p.progress_fd);
    if (metrics_) metrics_->RankExited(p.rank);
    lingering_.push_back(p.pid);
  }
  ranks_.clear();
  SetRunning();
  const Clock::time_point deadline = Clock::now() + kReapSeconds;
  while (!lingering_.empty() && Clock::now() < deadline) {
    ReapLingering();
    if (!lingering_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (pid_t pid : lingering_) {
    spdlog::error("worker {}: pid {} not gone {} s after SIGKILL (stuck in the kernel?)", node_,
                  pid, kReapSeconds.count());
  }
}

std::string RankSupervisor::List() const {
  std::string s;
  for (const Process& p : ranks_)
    s += (s.empty() ? "" : ",") + std::to_string(p.rank);
  return s;
}

nlohmann::json RankSupervisor::Progress() const {
  nlohmann::json ranks = nlohmann::json::array();
  for (const Process& p : ranks_) {
    if (!p.progress.is_object()) continue;
    auto step = p.progress.find("step");
    if (step == p.progress.end() || !step->is_number_integer()) continue;
    ranks.push_back({{"rank", p.rank},
                     {"pid", p.pid},
                     {"step", std::max<int64_t>(-1, step->get<int64_t>())},
                     {"loss", Number(p.progress, "loss")},
                     {"step_seconds", Number(p.progress, "step_seconds")},
                     {"samples_per_second", Number(p.progress, "samples_per_second")},
                     {"flops_per_second", Number(p.progress, "flops_per_second")},
                     {"compute_seconds", Number(p.progress, "compute_seconds")}});
  }
  return ranks;
}

void RankSupervisor::SetRunning() const {
  if (metrics_) metrics_->SetRanksRunning(size());
}

}  // namespace difftrain::worker
