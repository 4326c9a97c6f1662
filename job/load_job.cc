// LoadJob (job/job_spec.h): reading the job file where it is launched, with the launcher's
// overrides, resolved, and its initial weights checked. Apart from the parser (job_spec.cc),
// which the fuzzer builds alone, since it reads files beside the job's.
#include <filesystem>

#include "common/yaml_fields.h"
#include "job/job_spec.h"
#include "model/data/fashion_mnist.h"
#include "model/train/initial_weights.h"
#include "model/train/trainer.h"

namespace difftrain {

namespace {

// Whether this machine can read the job's data, so that train.epochs can be resolved where the
// job is launched; otherwise (data on the compute nodes only) each rank resolves them.
bool DataReadableHere(const DataConfig& d) {
  std::string path = d.path;
  if (path.empty() && d.kind.find("fashion_mnist") != std::string::npos) {
    path = kFashionMnistDefaultDir;
  }
  std::error_code ec;
  for (const std::string& p : {path, d.prior_path}) {
    if (!p.empty() && !std::filesystem::exists(p, ec)) return false;
  }
  return true;
}

}  // namespace

Result<TrainConfig> LoadJob(const std::string& path, const ClusterOverrides& overrides,
                            std::string* yaml) {
  // One read: the text checked is the text handed on.
  DT_ASSIGN_OR_RETURN(std::string text, YamlFields::ReadFile(path));
  DT_ASSIGN_OR_RETURN(TrainConfig config, TrainConfig::FromYamlText(text, path));
  ClusterConfig& c = config.cluster;
  if (overrides.nodes) {
    if (*overrides.nodes < 1) return Errorf("--nodes: expected >= 1, found {}", *overrides.nodes);
    c.nodes = *overrides.nodes;
    c.where["cluster.nodes"] = "--nodes";
  }
  if (overrides.devices_per_node) {
    if (*overrides.devices_per_node < 1) {
      return Errorf("--devices-per-node: expected >= 1, found {}", *overrides.devices_per_node);
    }
    c.devices_per_node = *overrides.devices_per_node;
    c.where["cluster.devices_per_node"] = "--devices-per-node";
  }
  DT_RETURN_IF_ERROR(ResolveJob(config));
  // Where the launcher can read them, the initial weights are checked against the model
  // before any rank starts (header only); elsewhere each rank checks them (exit 2).
  const std::string& init = config.checkpoint.init_from;
  std::error_code ec;
  if (!init.empty() && std::filesystem::exists(init, ec)) {
    if (Status s = CheckInitialWeightsForModel(config.model, init); !s.ok()) {
      return Errorf("{}: checkpoint.init_from: {}", c.Where("checkpoint.init_from"), s.message());
    }
  }
  if (DataReadableHere(config.data)) DT_RETURN_IF_ERROR(Trainer::ResolveEpochs(config));
  if (yaml != nullptr) *yaml = std::move(text);
  return config;
}

}  // namespace difftrain
