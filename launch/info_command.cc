// `difftrain info`: parameters, FLOPs and memory of a model of any family, and with
// --tp/--cp/--pp/--dp the bytes per rank of each pipeline stage; with --all every named
// config of the model's family; with --devices the GPUs this build can see.
#include <cstdio>

#include "launch/command.h"
#include "launch/model_options.h"
#include "model/device.h"
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
Result<nlohmann::json> DescribeRanks(const ModelSpec& spec, const InfoOptions& o) {
  const ModelFamily& family = FamilyOf(spec);
  const LayoutShape layout{o.tp, o.cp, o.pp, {}};
  nlohmann::json stages = nlohmann::json::array();
  const int micro_batches = o.micro_batches > 0 ? o.micro_batches : o.pp;
  for (int stage = 0; stage < o.pp; ++stage) {
    DT_ASSIGN_OR_RETURN(const ModelPartition part, family.Partition(spec, layout, 0, 0, stage));
    DT_ASSIGN_OR_RETURN(
        const MemoryBytes m,
        PlanMemory(spec, layout, stage, o.micro_batch, micro_batches, o.zero1, o.dp * o.cp,
                   static_cast<size_t>(o.bucket_mb * (1 << 20) / sizeof(float)), o.recompute));
    // What a rank of the stage other than rank 0 allocates to write a checkpoint.
    DT_ASSIGN_OR_RETURN(const size_t checkpoint,
                        PlanCheckpointMemory(spec, layout, 0, stage, false, o.zero1));
    stages.push_back({{"stage", stage},
                      {"blocks", {part.first_block, part.end_block}},
                      {"parameters", m.parameters},
                      {"gradients", m.gradients},
                      {"optimizer", m.optimizer},
                      {"ema", m.ema},
                      {"activations", m.activations},
                      {"total", m.total()},
                      {"checkpoint", checkpoint}});
  }
  // Rank 0 (tp 0 of stage 0) gathers the whole model to write a checkpoint under tp or pp.
  DT_ASSIGN_OR_RETURN(const size_t rank0, PlanCheckpointMemory(spec, layout, 0, 0, true, o.zero1));
  return nlohmann::json{{"tp", o.tp},
                        {"cp", o.cp},
                        {"dp", o.dp},
                        {"pp", o.pp},
                        {"micro_batch", o.micro_batch},
                        {"micro_batches", micro_batches},
                        {"zero1", o.zero1},
                        {"recompute", o.recompute},
                        {"stages", stages},
                        {"checkpoint_rank0", rank0}};
}

Result<nlohmann::json> Describe(const ModelSpec& spec, const InfoOptions& o) {
  const ModelFamily& family = FamilyOf(spec);
  const ModelCost cost = family.Cost(spec);
  const SampleSchema x = family.Samples(spec);
  const double params = static_cast<double>(cost.parameters);
  const double trainable = static_cast<double>(cost.trainable);
  DT_ASSIGN_OR_RETURN(nlohmann::json per_rank, DescribeRanks(spec, o));
  return nlohmann::json{{"model", spec.name()},
                        {"family", spec.family},
                        {"config", spec.config},
                        {"sample", {x.frames, x.channels, x.height, x.width}},
                        {"parameters", cost.parameters},
                        {"trainable_parameters", cost.trainable},
                        {"fixed_parameters", cost.parameters - cost.trainable},
                        {"forward_gmacs_per_sample", cost.forward_macs_per_sample / 1e9},
                        {"training_gflops_per_sample", cost.training_flops_per_sample() / 1e9},
                        {"state_bytes", static_cast<int64_t>(trainable * kStateArenas * 4 +
                                                             (params - trainable) * 4)},
                        {"activation_bytes", family.ActivationBytes(spec, {}, /*stage=*/0,
                                                                    o.micro_batch, 1, o.recompute)},
                        {"micro_batch", o.micro_batch},
                        {"per_rank", per_rank}};
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
  const nlohmann::json& x = d["sample"];
  const std::string sample =
      (x[0] == 1 ? "" : std::to_string(x[0].get<int>()) + "x") + std::to_string(x[1].get<int>()) +
      "x" + std::to_string(x[2].get<int>()) + "x" + std::to_string(x[3].get<int>());
  std::printf(
      "%-10s sample %-10s params %13s (trainable %s, fixed %s)  forward %8.2f GMACs"
      "  train %8.1f GFLOP/sample  state %.2f GiB  activations %.2f GiB (micro-batch %d%s)\n",
      d["model"].get<std::string>().c_str(), sample.c_str(),
      WithThousands(d["parameters"].get<int64_t>()).c_str(),
      WithThousands(d["trainable_parameters"].get<int64_t>()).c_str(),
      WithThousands(d["fixed_parameters"].get<int64_t>()).c_str(),
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
  Result<std::vector<ModelSpec>> specs = Status::Error("no model");
  if (o.all) {
    specs = o.model.BuildAllNamed();
  } else if (Result<ModelSpec> one = o.model.Build(); one.ok()) {
    specs = std::vector<ModelSpec>{*one};
  } else {
    specs = one.status();
  }
  if (!specs.ok()) return ReportBadInput("info", specs.status().message());
  nlohmann::json all = nlohmann::json::array();
  for (const ModelSpec& spec : *specs) {
    if (Status s = FamilyOf(spec).ValidateLayout(spec, {o.tp, o.cp, o.pp, {}}); !s.ok()) {
      return ReportBadInput("info", s.message());
    }
    Result<nlohmann::json> d = Describe(spec, o);
    if (!d.ok()) return ReportBadInput("info", d.status().message());
    if (o.json) {
      all.push_back(*d);
    } else {
      PrintHuman(*d);
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
       app.add_flag("--all", o->all, "every named config of the model's family");
       app.add_flag("--devices", o->devices, "list the CUDA devices");
       app.add_flag("--json", o->json, "print JSON");
       return [o] { return RunInfo(*o); };
     }});

}  // namespace difftrain::launch
