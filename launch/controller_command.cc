// `difftrain controller JOB.yaml`: the controller daemon of one job (controller/).
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "controller/controller.h"
#include "launch/command.h"
#include "launch/daemon_options.h"

namespace difftrain::launch {
namespace {

struct ControllerFlags {
  std::string job;
  std::string bind = "tcp://0.0.0.0:29400";
  std::optional<std::string> keys;
  std::optional<int> nodes, devices_per_node, metrics_port;
  std::string log_level = "info";
};

int RunController(const ControllerFlags& f) {
  if (Status s = SetupLogging(f.log_level); !s.ok()) {
    return ReportBadInput("controller", s.message());
  }
  controller::ControllerOptions o;
  Result<TrainConfig> config = LoadJob(f.job, {f.nodes, f.devices_per_node}, &o.job_yaml);
  if (!config.ok()) return ReportBadInput("controller", config.status().message());
  o.config = std::move(*config);
  if (f.metrics_port) o.config.cluster.metrics_port = *f.metrics_port;
  // The whole job is checked before anything else can fail.
  if (Result<controller::JobPlan> plan = controller::MakePlan(o.config); !plan.ok()) {
    return ReportBadInput("controller", plan.status().message());
  }
  const std::string keys_dir = FlagOrEnvString(f.keys, "DIFFTRAIN_KEYS", o.config.cluster.keys_dir);
  if (keys_dir.empty()) {
    return ReportBadInput("controller",
                          "no keys: pass --keys DIR, set DIFFTRAIN_KEYS or security.keys "
                          "(`difftrain keys --out DIR` makes them)");
  }
  Result<CurveKeys> keys = ReadKeys(keys_dir);
  if (!keys.ok()) return ReportBadInput("controller", keys.status().message());
  o.keys = *keys;
  o.bind = f.bind;
  o.job_name = std::filesystem::path(f.job).stem().string();
  o.stop_signal = &InstallStopSignals();
  Result<std::unique_ptr<controller::Controller>> c = controller::Controller::Create(std::move(o));
  if (!c.ok()) return ReportBadInput("controller", c.status().message());
  return (*c)->Run();
}

DIFFTRAIN_COMMAND(
    kController,
    {"controller", "Run the controller of a job: place, start and watch its ranks",
     [](CLI::App& app) {
       auto f = std::make_shared<ControllerFlags>();
       app.add_option("job", f->job, "job YAML (docs/job-spec.md)")->required();
       app.add_option("--bind", f->bind, "ZeroMQ endpoint to listen on")->capture_default_str();
       app.add_option("--keys", f->keys,
                      "the job's keys directory (or DIFFTRAIN_KEYS, or security.keys)");
       app.add_option("--nodes", f->nodes, "override cluster.nodes");
       app.add_option("--devices-per-node", f->devices_per_node,
                      "override cluster.devices_per_node");
       app.add_option("--metrics-port", f->metrics_port,
                      "serve the job's Prometheus /metrics on this port (0: off; overrides "
                      "metrics.port; docs/metrics.md)");
       app.add_option("--log-level", f->log_level, "trace|debug|info|warn|error|off")
           ->capture_default_str();
       return [f] { return RunController(*f); };
     }});

}  // namespace
}  // namespace difftrain::launch
