// Runs tests/reference's Python scripts through one long-lived Python per test program and
// interpreter (tests/reference/fork_server.py), which imports a script's torch, diffusers and
// transformers once and forks a child for each run. A run's exit status and output are those of
// `PYTHON SCRIPT ARGS 2>&1`; what is saved is the imports, 3 to 4 s of each run of a
// diffusers script (docs/benchmarks.md, "The reference scripts' imports"). Anything the server
// cannot do as the shell would, it leaves to the caller: RunPythonScript returns nothing and the
// caller runs the command itself. DIFFTRAIN_TEST_FORK_SERVER=0 turns the server off.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/testing/run_command.h"

extern char** environ;

namespace difftrain::testing {

// True when /bin/sh would only split `args` into words (single quotes, as ShellQuote writes
// them, and backslashes): no expansion, redirection, globbing or second command.
inline bool IsPlainWords(std::string_view args) {
  bool quoted = false, escaped = false;
  for (char c : args) {
    if (quoted) {
      quoted = c != '\'';
    } else if (escaped) {
      escaped = false;
    } else if (c == '\\') {
      escaped = true;
    } else if (c == '\'') {
      quoted = true;
    } else if (std::string_view("$`\"*?[]<>|&;(){}~#!\n").find(c) != std::string_view::npos) {
      return false;
    }
  }
  return !quoted && !escaped;
}

class PythonForkServer {
 public:
  // Starts `python` tests/reference/fork_server.py; ok() is false where it could not start.
  explicit PythonForkServer(const std::string& python) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
    const std::string script = DIFFTRAIN_SOURCE_DIR "/tests/reference/fork_server.py";
    const char* argv[] = {python.c_str(), script.c_str(), nullptr};
    const pid_t pid = ::fork();
    if (pid == 0) {  // only async-signal-safe calls until exec
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(fds[1], 0);
      ::dup2(fds[1], 1);
      if (null >= 0) ::dup2(null, 2);  // import warnings; a run's own output goes to its file
      ::execv(argv[0], const_cast<char* const*>(argv));
      ::_exit(127);
    }
    ::close(fds[1]);
    if (pid < 0) {
      ::close(fds[0]);
      return;
    }
    pid_ = pid;
    socket_ = fds[0];
    // Its first line says it runs (Python and the script found); anything else: not used.
    const std::optional<nlohmann::json> ready = ReadReply(kStartSeconds);
    if (!ready || !ready->contains("ready")) Close();
  }

  ~PythonForkServer() {
    Close();  // the server ends at the end of its input
    if (pid_ <= 0) return;
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  PythonForkServer(const PythonForkServer&) = delete;
  PythonForkServer& operator=(const PythonForkServer&) = delete;

  bool ok() const { return socket_ >= 0; }

  // `script` run with `args` (words for shlex), as from this directory and environment; nothing
  // where the server has ended or refuses (nothing ran; it is not asked again). A server that
  // ends while the script runs is a failed run, exit code -1: running it again could repeat
  // what it had done.
  std::optional<CommandResult> Run(const std::string& script, const std::string& args) {
    if (!ok()) return std::nullopt;
    std::string output =
        (std::filesystem::temp_directory_path() / "difftrain_fork_server_XXXXXX").string();
    const int fd = ::mkstemp(output.data());
    if (fd < 0) return std::nullopt;
    ::close(fd);
    nlohmann::json env = nlohmann::json::object();
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const size_t eq = entry.find('=');
      if (eq != std::string_view::npos)
        env[std::string(entry.substr(0, eq))] = std::string(entry.substr(eq + 1));
    }
    const nlohmann::json request = {{"script", script},
                                    {"args", args},
                                    {"cwd", std::filesystem::current_path().string()},
                                    {"env", env},
                                    {"output", output}};
    std::optional<CommandResult> result;
    if (!Send(request.dump() + "\n")) {
      Close();
    } else if (const std::optional<nlohmann::json> reply = ReadReply(-1);
               reply && reply->contains("refused")) {
      Close();
    } else {
      std::ifstream in(output, std::ios::binary);
      result = CommandResult{-1, std::string(std::istreambuf_iterator<char>(in), {})};
      if (reply && reply->contains("exit") && (*reply)["exit"].is_number_integer()) {
        result->exit_code = (*reply)["exit"].get<int>();
      } else {
        result->output += "\n[the fork server ended without answering for " + script + "]\n";
        Close();
      }
    }
    std::filesystem::remove(output);
    return result;
  }

 private:
  bool Send(const std::string& line) {
    for (size_t sent = 0; sent < line.size();) {
      const ssize_t n = ::send(socket_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += size_t(n);
    }
    return true;
  }

  static constexpr int kStartSeconds = 60;

  void Close() {
    if (socket_ >= 0) ::close(socket_);
    socket_ = -1;
  }

  // The next line the server writes, as JSON, within `seconds` (-1: however long the run
  // takes; the test's own timeout bounds it); nothing at its end or on anything else.
  std::optional<nlohmann::json> ReadReply(int seconds) {
    if (seconds >= 0) {
      pollfd readable{socket_, POLLIN, 0};
      if (::poll(&readable, 1, seconds * 1000) != 1) return std::nullopt;
    }
    std::string line;
    for (char c;;) {
      const ssize_t n = ::read(socket_, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      if (c == '\n') break;
      line += c;
    }
    nlohmann::json reply = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded()) return std::nullopt;
    return reply;
  }

  pid_t pid_ = -1;
  int socket_ = -1;
};

// `python script args 2>&1` through this program's server for `python` (started on first
// use); nothing where the server is off (DIFFTRAIN_TEST_FORK_SERVER=0), cannot start, has
// ended, or `args` needs the shell: the caller then runs the command itself.
inline std::optional<CommandResult> RunPythonScript(const std::string& python,
                                                    const std::string& script,
                                                    const std::string& args) {
  const char* off = std::getenv("DIFFTRAIN_TEST_FORK_SERVER");
  if ((off != nullptr && std::string_view(off) == "0") || !IsPlainWords(args)) return std::nullopt;
  static std::map<std::string, std::unique_ptr<PythonForkServer>> servers;
  std::unique_ptr<PythonForkServer>& server = servers[python];
  if (server == nullptr) server = std::make_unique<PythonForkServer>(python);
  return server->Run(script, args);
}

}  // namespace difftrain::testing
