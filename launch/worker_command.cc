// `difftrain worker`: the worker daemon of one node (worker/).
#include "common/log.h"
#include "launch/command.h"
#include "launch/daemon_options.h"
#include "worker/worker.h"

namespace difftrain::launch {
namespace {

struct WorkerFlags {
  std::optional<std::string> controller, node, keys;
  int devices = 0;
  int metrics_port = 0;
  std::string log_level = "info";
};

int RunWorkerCommand(const WorkerFlags& f) {
  if (Status s = SetupLogging(f.log_level); !s.ok()) return ReportBadInput("worker", s.message());
  worker::WorkerOptions o;
  o.controller = FlagOrEnvString(f.controller, "DIFFTRAIN_CONTROLLER");
  o.node = FlagOrEnvString(f.node, "DIFFTRAIN_NODE", HostName());
  o.keys_dir = FlagOrEnvString(f.keys, "DIFFTRAIN_KEYS");
  if (o.controller.empty()) {
    return ReportBadInput("worker",
                          "no controller: pass --controller tcp://HOST:PORT or set "
                          "DIFFTRAIN_CONTROLLER");
  }
  if (o.keys_dir.empty()) {
    return ReportBadInput("worker", "no keys: pass --keys DIR or set DIFFTRAIN_KEYS");
  }
  if (f.devices < 0) return ReportBadInput("worker", "--devices must be >= 0");
  if (o.node.empty() || o.node.size() > 255) {
    return ReportBadInput("worker", "--node must have 1 to 255 characters");
  }
  if (f.metrics_port < 0 || f.metrics_port > 65535) {
    return ReportBadInput("worker", "--metrics-port must be in [0, 65535]");
  }
  o.devices = f.devices;
  o.metrics_port = f.metrics_port;
  o.binary = SelfBinary();
  o.stop_signal = &InstallStopSignals();
  return worker::RunWorker(o);
}

DIFFTRAIN_COMMAND(kWorker,
                  {"worker", "Run the worker daemon of this node: start the ranks it is given",
                   [](CLI::App& app) {
                     auto f = std::make_shared<WorkerFlags>();
                     app.add_option("--controller", f->controller,
                                    "controller endpoint, tcp://HOST:29400 (or "
                                    "DIFFTRAIN_CONTROLLER)");
                     app.add_option("--node", f->node,
                                    "node name (or DIFFTRAIN_NODE; default: hostname)");
                     app.add_option("--keys", f->keys,
                                    "the job's keys directory (or "
                                    "DIFFTRAIN_KEYS)");
                     app.add_option("--devices", f->devices,
                                    "ranks this node can run (default: GPUs, else CPU cores)");
                     app.add_option("--metrics-port", f->metrics_port,
                                    "serve the ranks' Prometheus /metrics on this port (0: off; "
                                    "docs/metrics.md)")
                         ->capture_default_str();
                     app.add_option("--log-level", f->log_level, "trace|debug|info|warn|error|off")
                         ->capture_default_str();
                     return [f] { return RunWorkerCommand(*f); };
                   }});

}  // namespace
}  // namespace difftrain::launch
