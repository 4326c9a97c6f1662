#include "launch/daemon_options.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace difftrain::launch {
namespace {
std::atomic<int> g_stop_signal{0};
void OnSignal(int signal) {
  g_stop_signal.store(signal);
}
}  // namespace

std::string FlagOrEnvString(const std::optional<std::string>& flag, const char* env,
                            const std::string& fallback) {
  if (flag && !flag->empty()) return *flag;
  const char* value = std::getenv(env);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

const std::atomic<int>& InstallStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGUSR1, SIGINT})
    ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return g_stop_signal;
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string SelfBinary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("difftrain") : self.string();
}

}  // namespace difftrain::launch
