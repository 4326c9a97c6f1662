// `difftrain run JOB.yaml`: the embedded default. A controller, one worker daemon per
// node of the job (emulated nodes local-0, local-1, ...) and their ranks, all on this
// machine; the daemons are threads of this process, the ranks processes of their own.
#include <filesystem>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/log.h"
#include "controller/controller.h"
#include "launch/command.h"
#include "launch/daemon_options.h"
#include "worker/worker.h"

namespace difftrain::launch {
namespace {

struct RunFlags {
  std::string job;
  std::string log_level = "info";
};

int RunJob(const RunFlags& f) {
  if (Status s = SetupLogging(f.log_level); !s.ok()) return ReportBadInput("run", s.message());
  controller::ControllerOptions o;
  Result<TrainConfig> config = LoadJob(f.job, {}, &o.job_yaml);
  if (!config.ok()) return ReportBadInput("run", config.status().message());
  o.config = std::move(*config);
  // The job's keys when it names them, else keys of this run only.
  std::string keys_dir = o.config.cluster.keys_dir;
  std::filesystem::path ephemeral;
  if (keys_dir.empty()) {
    Result<std::string> made = MakeEphemeralKeys();
    if (!made.ok()) return ReportBadInput("run", made.status().message());
    keys_dir = *made;
    ephemeral = keys_dir;
  }
  auto cleanup = [&] {
    std::error_code ignored;
    if (!ephemeral.empty()) std::filesystem::remove_all(ephemeral, ignored);
  };
  Result<CurveKeys> keys = ReadKeys(keys_dir);
  if (!keys.ok()) {
    cleanup();
    return ReportBadInput("run", keys.status().message());
  }
  o.keys = *keys;
  o.bind = "tcp://127.0.0.1:0";
  o.job_name = std::filesystem::path(f.job).stem().string();
  o.stop_signal = &InstallStopSignals();
  const int nodes = o.config.cluster.nodes;
  const int devices = o.config.cluster.devices_per_node;
  const int metrics_port = o.config.cluster.metrics_port;
  Result<std::unique_ptr<controller::Controller>> c = controller::Controller::Create(std::move(o));
  if (!c.ok()) {
    cleanup();
    return ReportBadInput("run", c.status().message());
  }
  std::vector<std::thread> workers;
  for (int n = 0; n < nodes; ++n) {
    workers.emplace_back([&, n] {
      worker::WorkerOptions w;
      w.controller = (*c)->endpoint();
      w.node = "local-" + std::to_string(n);
      w.keys_dir = keys_dir;
      w.devices = devices;
      w.binary = SelfBinary();
      w.register_timeout_seconds = 60;
      // The controller serves metrics.port; node local-i's worker the i-th port after it.
      if (metrics_port != 0) w.metrics_port = metrics_port + 1 + n;
      worker::RunWorker(w);
    });
  }
  const int code = (*c)->Run();
  for (std::thread& t : workers)
    t.join();
  c->reset();
  cleanup();
  return code;
}

DIFFTRAIN_COMMAND(kRun, {"run", "Run a job on this machine: controller, worker daemon(s), ranks",
                         [](CLI::App& app) {
                           auto f = std::make_shared<RunFlags>();
                           app.add_option("job", f->job, "job YAML (docs/job-spec.md)")->required();
                           app.add_option("--log-level", f->log_level,
                                          "trace|debug|info|warn|error|off")
                               ->capture_default_str();
                           return [f] { return RunJob(*f); };
                         }});

}  // namespace
}  // namespace difftrain::launch
