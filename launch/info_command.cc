// `difftrain info`: parameters, FLOPs and memory of a model; with --all the whole
// DiT-S/B/L/XL × 2/4/8 table; with --devices the GPUs this build can see.
#include <cstdio>

#include "launch/command.h"
#include "launch/model_options.h"
#include "model/device.h"
#include "model/dit/dit.h"

namespace difftrain::launch {
namespace {

struct InfoOptions {
  ModelOptions model;
  int micro_batch = 1;
  bool all = false;
  bool devices = false;
  bool json = false;
};

// fp32 parameters, gradients, two AdamW moments and the EMA: 5 arenas of 4 bytes each.
constexpr int kStateArenas = 5;

nlohmann::json Describe(const DiTConfig& c, int micro_batch) {
  const double params = static_cast<double>(ParameterCount(c));
  const double trainable = static_cast<double>(TrainableParameterCount(c));
  return {{"model", c.name},
          {"input_size", c.input_size},
          {"tokens", c.tokens()},
          {"parameters", ParameterCount(c)},
          {"trainable_parameters", TrainableParameterCount(c)},
          {"forward_gmacs_per_sample", ForwardMacsPerSample(c) / 1e9},
          {"training_gflops_per_sample", TrainingFlopsPerSample(c) / 1e9},
          {"state_bytes",
           static_cast<int64_t>(trainable * kStateArenas * 4 + (params - trainable) * 4)},
          {"activation_bytes", DiT::ActivationBytes(c, micro_batch)},
          {"micro_batch", micro_batch}};
}

// 675129632 → "675,129,632"
std::string WithThousands(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void PrintHuman(const nlohmann::json& d) {
  std::printf(
      "%-10s latents %2dx%-2d tokens %5d  params %13s (trainable %s)  forward %8.2f GMACs"
      "  train %8.1f GFLOP/sample  state %.2f GiB  activations %.2f GiB (micro-batch %d)\n",
      d["model"].get<std::string>().c_str(), d["input_size"].get<int>(), d["input_size"].get<int>(),
      d["tokens"].get<int>(), WithThousands(d["parameters"].get<int64_t>()).c_str(),
      WithThousands(d["trainable_parameters"].get<int64_t>()).c_str(),
      d["forward_gmacs_per_sample"].get<double>(), d["training_gflops_per_sample"].get<double>(),
      d["state_bytes"].get<double>() / (1 << 30), d["activation_bytes"].get<double>() / (1 << 30),
      d["micro_batch"].get<int>());
}

int RunInfo(const InfoOptions& o) {
  if (o.micro_batch < 1) return ReportBadInput("info", "--micro-batch must be positive");
  if (o.devices) {
    const DeviceInventory inv = QueryDeviceInventory();
    nlohmann::json gpus = nlohmann::json::array();
    for (const GpuInfo& g : inv.gpus) {
      gpus.push_back({{"index", g.index},
                      {"name", g.name},
                      {"memory_bytes", g.memory_bytes},
                      {"compute_capability", g.compute_capability}});
    }
    std::printf("%s\n",
                nlohmann::json{{"cuda_built", inv.cuda_built}, {"gpus", gpus}, {"note", inv.note}}
                    .dump(2)
                    .c_str());
    return kExitOk;
  }
  std::vector<DiTConfig> configs;
  if (o.all) {
    Result<DiTConfig> base = o.model.Build();  // for the input size
    if (!base.ok()) return ReportBadInput("info", base.status().message());
    for (const std::string& name : DiTConfigNames())
      configs.push_back(*DiTConfigByName(name, base->input_size));
  } else {
    Result<DiTConfig> c = o.model.Build();
    if (!c.ok()) return ReportBadInput("info", c.status().message());
    configs.push_back(*c);
  }
  nlohmann::json all = nlohmann::json::array();
  for (const DiTConfig& c : configs) {
    nlohmann::json d = Describe(c, o.micro_batch);
    if (o.json) {
      all.push_back(d);
    } else {
      PrintHuman(d);
    }
  }
  if (o.json) std::printf("%s\n", (o.all ? all : all[0]).dump(2).c_str());
  return kExitOk;
}

}  // namespace

DIFFTRAIN_COMMAND(kInfo, {"info", "Parameters, FLOPs and memory of a model; or the GPUs",
                          [](CLI::App& app) {
                            auto o = std::make_shared<InfoOptions>();
                            o->model.AddTo(app);
                            app.add_option("--micro-batch", o->micro_batch,
                                           "micro-batch for the activation estimate")
                                ->capture_default_str();
                            app.add_flag("--all", o->all, "every DiT-S/B/L/XL x 2/4/8 config");
                            app.add_flag("--devices", o->devices, "list the CUDA devices");
                            app.add_flag("--json", o->json, "print JSON");
                            return [o] { return RunInfo(*o); };
                          }});

}  // namespace difftrain::launch
