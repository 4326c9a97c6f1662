// `difftrain info`: parameters, FLOPs and memory of a model, and with --tp/--cp/--pp/--dp
// the bytes per rank of each pipeline stage; with --all the whole DiT-S/B/L/XL × 2/4/8
// table; with --devices the GPUs this build can see.
#include <cstdio>

#include "launch/command.h"
#include "launch/model_options.h"
#include "model/device.h"
#include "model/dit/dit.h"
#include "model/dit/shard.h"
#include "model/train/trainer.h"

namespace difftrain::launch {
namespace {

struct InfoOptions {
  ModelOptions model;
  int micro_batch = 1;
  int tp = 1, cp = 1, pp = 1, dp = 1;
  int micro_batches = 0;  // per step and replica; 0: pp (the pipeline full)
  bool zero1 = false;
  bool recompute = false;
  double bucket_mb = ParallelConfig{}.bucket_mb;
  bool all = false;
  bool devices = false;
  bool json = false;
};

// fp32 parameters, gradients, two AdamW moments and the EMA: 5 arenas of 4 bytes each.
constexpr int kStateArenas = 5;

// Bytes per rank of each pipeline stage (every tp and cp rank of a stage holds the same).
nlohmann::json DescribeRanks(const DiTConfig& c, const InfoOptions& o) {
  nlohmann::json stages = nlohmann::json::array();
  const int micro_batches = o.micro_batches > 0 ? o.micro_batches : o.pp;
  for (int stage = 0; stage < o.pp; ++stage) {
    const DiTShard shard = *DiTShard::Create(c, o.tp, 0, o.cp, 0, o.pp, stage);
    const MemoryBytes m =
        PlanMemory(c, shard, o.micro_batch, micro_batches, o.zero1, o.dp * o.cp,
                   static_cast<size_t>(o.bucket_mb * (1 << 20) / sizeof(float)), o.recompute);
    stages.push_back({{"stage", stage},
                      {"blocks", {shard.first_block, shard.end_block}},
                      {"parameters", m.parameters},
                      {"gradients", m.gradients},
                      {"optimizer", m.optimizer},
                      {"ema", m.ema},
                      {"activations", m.activations},
                      {"total", m.parameters + m.gradients + m.optimizer + m.ema + m.activations}});
  }
  return {{"tp", o.tp},
          {"cp", o.cp},
          {"dp", o.dp},
          {"pp", o.pp},
          {"micro_batch", o.micro_batch},
          {"micro_batches", micro_batches},
          {"zero1", o.zero1},
          {"recompute", o.recompute},
          {"stages", stages}};
}

nlohmann::json Describe(const DiTConfig& c, const InfoOptions& o) {
  const int micro_batch = o.micro_batch;
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
          {"activation_bytes",
           DiT::ActivationBytes(c, DiTShard::Whole(c), micro_batch, 1, o.recompute)},
          {"micro_batch", micro_batch},
          {"per_rank", DescribeRanks(c, o)}};
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
      "  train %8.1f GFLOP/sample  state %.2f GiB  activations %.2f GiB (micro-batch %d%s)\n",
      d["model"].get<std::string>().c_str(), d["input_size"].get<int>(), d["input_size"].get<int>(),
      d["tokens"].get<int>(), WithThousands(d["parameters"].get<int64_t>()).c_str(),
      WithThousands(d["trainable_parameters"].get<int64_t>()).c_str(),
      d["forward_gmacs_per_sample"].get<double>(), d["training_gflops_per_sample"].get<double>(),
      d["state_bytes"].get<double>() / (1 << 30), d["activation_bytes"].get<double>() / (1 << 30),
      d["micro_batch"].get<int>(), d["per_rank"]["recompute"].get<bool>() ? ", recompute" : "");
  const nlohmann::json& r = d["per_rank"];
  if (r["tp"] == 1 && r["cp"] == 1 && r["pp"] == 1 && r["dp"] == 1) return;
  const double GiB = 1 << 30;
  for (const nlohmann::json& s : r["stages"]) {
    std::printf(
        "  tp %d cp %d dp %d pp %d%s%s stage %d (blocks %d-%d), per rank: parameters %.2f GiB  "
        "gradients %.2f GiB  optimizer %.2f GiB  EMA %.2f GiB  activations %.2f GiB  total "
        "%.2f GiB\n",
        r["tp"].get<int>(), r["cp"].get<int>(), r["dp"].get<int>(), r["pp"].get<int>(),
        r["zero1"].get<bool>() ? " ZeRO-1" : "", r["recompute"].get<bool>() ? " recompute" : "",
        s["stage"].get<int>(), s["blocks"][0].get<int>(), s["blocks"][1].get<int>() - 1,
        s["parameters"].get<double>() / GiB, s["gradients"].get<double>() / GiB,
        s["optimizer"].get<double>() / GiB, s["ema"].get<double>() / GiB,
        s["activations"].get<double>() / GiB, s["total"].get<double>() / GiB);
  }
}

int RunInfo(const InfoOptions& o) {
  if (o.micro_batch < 1) return ReportBadInput("info", "--micro-batch must be positive");
  if (o.dp < 1 || o.micro_batches < 0 || !(o.bucket_mb > 0)) {
    return ReportBadInput("info", "--dp, --micro-batches and --bucket-mb must be positive");
  }
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
    if (Status s = ValidateParallelLayout(c, o.tp, o.cp, o.pp, {}); !s.ok()) {
      return ReportBadInput("info", s.message());
    }
    nlohmann::json d = Describe(c, o);
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

DIFFTRAIN_COMMAND(
    kInfo,
    {"info", "Parameters, FLOPs and memory of a model; or the GPUs", [](CLI::App& app) {
       auto o = std::make_shared<InfoOptions>();
       o->model.AddTo(app);
       app.add_option("--micro-batch", o->micro_batch, "micro-batch for the activation estimate")
           ->capture_default_str();
       app.add_option("--tp", o->tp, "tensor-parallel size")->capture_default_str();
       app.add_option("--cp", o->cp, "context-parallel size")->capture_default_str();
       app.add_option("--pp", o->pp, "pipeline stages")->capture_default_str();
       app.add_option("--dp", o->dp, "data-parallel size")->capture_default_str();
       app.add_option("--micro-batches", o->micro_batches,
                      "micro-batches per step and replica (default: pp)");
       app.add_flag("--zero1", o->zero1, "shard AdamW moments over the dp-cp group");
       app.add_flag("--recompute", o->recompute,
                    "activation recomputation: keep only each block's input");
       app.add_option("--bucket-mb", o->bucket_mb, "gradient bucket MiB")->capture_default_str();
       app.add_flag("--all", o->all, "every DiT-S/B/L/XL x 2/4/8 config");
       app.add_flag("--devices", o->devices, "list the CUDA devices");
       app.add_flag("--json", o->json, "print JSON");
       return [o] { return RunInfo(*o); };
     }});

}  // namespace difftrain::launch
