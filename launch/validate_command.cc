// `difftrain validate JOB.yaml`: check a job file and print the plan it makes.
#include <cstdio>

#include "common/topology.h"
#include "controller/plan.h"
#include "launch/command.h"

namespace difftrain::launch {
namespace {

struct ValidateOptions {
  std::string job;
  std::optional<int> nodes, devices_per_node;
  bool json = false;
};

int RunValidate(const ValidateOptions& o) {
  Result<TrainConfig> config = LoadJob(o.job, {o.nodes, o.devices_per_node});
  if (!config.ok()) return ReportBadInput("validate", config.status().message());
  Result<controller::JobPlan> plan = controller::MakePlan(*config);
  if (!plan.ok()) return ReportBadInput("validate", plan.status().message());
  if (o.json) {
    const Topology topology = *Topology::Create(plan->tp, plan->cp, plan->dp, plan->pp);
    std::printf("%s\n", plan->ToJson(topology).dump(2).c_str());
  } else {
    std::printf("%s: valid\n%s", o.job.c_str(), controller::DescribePlan(*config, *plan).c_str());
  }
  return kExitOk;
}

DIFFTRAIN_COMMAND(kValidate,
                  {"validate", "Check a job file and print its plan", [](CLI::App& app) {
                     auto o = std::make_shared<ValidateOptions>();
                     app.add_option("job", o->job, "job YAML (docs/job-spec.md)")->required();
                     app.add_option("--nodes", o->nodes, "override cluster.nodes");
                     app.add_option("--devices-per-node", o->devices_per_node,
                                    "override cluster.devices_per_node");
                     app.add_flag("--json", o->json, "print the plan as JSON");
                     return [o] { return RunValidate(*o); };
                   }});

}  // namespace
}  // namespace difftrain::launch
