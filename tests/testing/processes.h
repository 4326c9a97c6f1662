// Background processes for end-to-end tests: a daemon (`difftrain controller`, a worker, a
// Prometheus server) with its output in a log file, killed when the test lets go of it;
// and the children of a process, to find a worker daemon's ranks.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace difftrain::testing {

inline std::string ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Process {
 public:
  // Runs `argv` (argv[0] a path) with stdout and stderr appended to `log`.
  Process(std::vector<std::string> argv, std::filesystem::path log) : log_(std::move(log)) {
    std::vector<char*> args;
    for (std::string& a : argv)
      args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal) const { ::kill(pid_, signal); }

  // The exit code, or -1 (killed) / -2 (still running after `limit`, then killed).
  int Wait(std::chrono::milliseconds limit = std::chrono::seconds(120)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // The exit code (-1: killed by a signal) once it has ended; nothing while it runs.
  std::optional<int> TryWait() {
    if (pid_ <= 0) return std::nullopt;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string Log() const { return ReadWholeFile(log_); }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

// The children of `parent` whose command line mentions `word`, by pid.
inline std::vector<pid_t> ChildrenOf(pid_t parent, const std::string& word) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream stat(ReadWholeFile(entry.path() / "stat"));
    std::string pid, comm, state;
    pid_t ppid = 0;
    // comm may hold spaces, but ours ("difftrain") does not.
    stat >> pid >> comm >> state >> ppid;
    if (ppid != parent) continue;
    std::string cmdline = ReadWholeFile(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(word) != std::string::npos) found.push_back(std::stoi(name));
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace difftrain::testing
