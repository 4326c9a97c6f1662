// difftrain: one binary, subcommands registered by launch/*_command.cc.
#include <cstdio>
#include <map>
#include <memory>
#include <new>
#include <vector>

#include "common/exit_codes.h"
#include "launch/command.h"
#include "model/tensor/host_memory.h"

namespace difftrain::launch {
namespace {
std::vector<CommandSpec>& Registry() {
  static std::vector<CommandSpec> commands;
  return commands;
}
}  // namespace

bool RegisterCommand(CommandSpec spec) {
  Registry().push_back(std::move(spec));
  return true;
}

}  // namespace difftrain::launch

int main(int argc, char** argv) {
  using namespace difftrain::launch;
  using difftrain::kExitBadInput;
  using difftrain::kExitOk;
  CLI::App app{"difftrain: train diffusion models on CPUs and GPU clusters"};
  app.set_version_flag("--version", "difftrain " DIFFTRAIN_VERSION);
  app.require_subcommand(1);
  std::map<CLI::App*, std::function<int()>> runners;
  for (const CommandSpec& spec : Registry()) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    runners[sub] = spec.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  for (auto& [sub, run] : runners) {
    if (!sub->parsed()) continue;
    // A command that asks for more host memory than this process may take (the machine's, or
    // its cgroup's limit: model/tensor/host_memory.h) stops with that, not an abort. The
    // trainer names the job's sizes itself; this is for every other command (sample, eval).
    try {
      return run();
    } catch (const std::bad_alloc&) {
      return difftrain::ReportBadInput(sub->get_name(),
                                       "out of host memory: an allocation needs more than " +
                                           difftrain::ReadHostMemory().Describe());
    }
  }
  return kExitBadInput;
}
