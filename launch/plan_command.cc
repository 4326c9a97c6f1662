// `difftrain plan`: the parallel layout (tp, cp, pp, dp, micro-batch, recomputation,
// ZeRO-1) a model should train with on a number of nodes of a device, from the planner's
// memory and step-time model (model/train/planner.h); prints the best candidates and what
// their time and memory are made of (docs/bench.md).
#include <cmath>
#include <cstdio>

#include "launch/command.h"
#include "launch/model_options.h"
#include "model/train/peak_flops.h"
#include "model/train/planner.h"

namespace difftrain::launch {
namespace {

struct PlanOptions {
  ModelOptions model;
  std::optional<int> tokens;
  std::string device = "cpu";
  std::optional<double> memory_gib, memory_tbps, peak_tflops, efficiency, half_rows, intra_gbs,
      inter_gbs;
  int nodes = 1, devices_per_node = 1;
  int global_batch = 256;
  double usable_fraction = 0.9;
  std::optional<int> tp, cp, pp, micro_batch;
  std::optional<bool> recompute;
  bool gpu_step = false;
  bool fp8 = false;
  int top = 5;
  bool json = false;
};

constexpr double kGiB = 1 << 30;

// The model of the flags; --tokens sets the latent side to √tokens patches (of a model
// with a patch_size).
Result<ModelSpec> BuildModel(const PlanOptions& o) {
  DT_ASSIGN_OR_RETURN(ModelSpec spec, o.model.Build());
  if (!o.tokens) return spec;
  const int grid = static_cast<int>(std::lround(std::sqrt(static_cast<double>(*o.tokens))));
  if (*o.tokens < 1 || grid * grid != *o.tokens) {
    return Errorf("--tokens: expected a square number of patches (a grid side squared), got {}",
                  *o.tokens);
  }
  if (!spec.config.contains("patch_size") || !spec.config["patch_size"].is_number_integer()) {
    return Errorf("--tokens: a {} model has no patch_size; give --input-size", spec.family);
  }
  nlohmann::json config = spec.config;
  config["input_size"] = grid * config["patch_size"].get<int>();
  Result<ModelSpec> resized = FamilyOf(spec).FromJson(config);
  if (!resized.ok()) return resized.status().WithContext("--tokens");
  return resized;
}

Result<PlanRequest> BuildRequest(const PlanOptions& o) {
  PlanRequest r;
  DT_ASSIGN_OR_RETURN(r.model, BuildModel(o));
  if (o.nodes < 1 || o.devices_per_node < 1) {
    return Errorf("--nodes and --devices-per-node: expected >= 1, found {} and {}", o.nodes,
                  o.devices_per_node);
  }
  if (!(o.usable_fraction > 0 && o.usable_fraction <= 1)) {
    return Errorf("--usable-fraction: expected a fraction in (0, 1], found {}", o.usable_fraction);
  }
  r.nodes = o.nodes;
  r.devices_per_node = o.devices_per_node;
  r.global_batch = o.global_batch;
  r.usable_memory_fraction = o.usable_fraction;
  r.tp = o.tp;
  r.cp = o.cp;
  r.pp = o.pp;
  r.micro_batch = o.micro_batch;
  r.recompute = o.recompute;
  // FP8 layers exist only in the GPU step: --fp8 plans it.
  r.gpu_step = o.gpu_step || o.fp8;
  r.fp8 = o.fp8;
  if (r.gpu_step && o.device == "cpu") {
    return Errorf("{} plans train.device cuda: give a GPU --device ({})",
                  o.fp8 ? "--fp8" : "--gpu-step",
                  o.fp8 ? "H100, H200, H20" : "H100, H200, H20, A100");
  }
  if (o.fp8 && !FamilyOf(r.model).trains_fp8()) {
    return Errorf("--fp8: the {} family has no FP8 layers (DiT and Latte do)", r.model.family);
  }
  Result<DeviceSpec> device = DevicePreset(o.device, o.devices_per_node);
  if (!device.ok()) return device.status().WithContext("--device");
  r.device = *device;
  if (o.fp8 && !r.device.fp8) {
    return Errorf(
        "--fp8: the {} has no FP8 tensor cores (FP8 needs compute capability 8.9 or later)",
        r.device.name);
  }
  if (o.device == "cpu" && !o.peak_tflops) {
    DT_ASSIGN_OR_RETURN(const PeakFlops peak, CpuPeakFlops());
    r.device.peak_flops_per_second = peak.flops_per_second;
  }
  if (o.memory_gib) r.device.memory_bytes = *o.memory_gib * kGiB;
  if (o.memory_tbps) r.device.memory_bytes_per_second = *o.memory_tbps * 1e12;
  if (o.peak_tflops) r.device.peak_flops_per_second = *o.peak_tflops * 1e12;
  if (o.efficiency) r.device.efficiency = *o.efficiency;
  if (o.half_rows) r.device.half_efficiency_rows = *o.half_rows;
  if (o.intra_gbs) r.device.intra_node_bytes_per_second = *o.intra_gbs * 1e9;
  if (o.inter_gbs) r.device.inter_node_bytes_per_second = *o.inter_gbs * 1e9;
  return r;
}

nlohmann::json ToJson(const PlanRequest& r, const PlannedLayout& p) {
  const Layout& l = p.layout;
  const double samples_per_second = r.global_batch / p.time.total();
  const MemoryEstimate& m = p.memory;
  const TimeEstimate& t = p.time;
  return {{"tp", l.tp},
          {"cp", l.cp},
          {"pp", l.pp},
          {"dp", l.dp},
          {"micro_batch", l.micro_batch},
          {"accumulation", p.accumulation},
          {"recompute", l.recompute},
          {"zero1", l.zero1},
          {"worst_stage", p.worst_stage},
          {"memory_bytes",
           {{"parameters", m.parameters},
            {"gradients", m.gradients},
            {"optimizer", m.optimizer},
            {"ema", m.ema},
            {"activations", m.activations},
            {"total", m.total()}}},
          {"step_seconds",
           {{"compute", t.compute},
            {"bubble", t.bubble},
            {"tp", t.tp},
            {"cp", t.cp},
            {"pp", t.pp},
            {"dp", t.dp},
            {"optimizer", t.optimizer},
            {"total", t.total()}}},
          {"samples_per_second", samples_per_second},
          {"samples_per_second_per_device", samples_per_second / (r.nodes * r.devices_per_node)}};
}

// What dominates a candidate's predicted step, for the "why" column.
std::string Why(const PlannedLayout& p) {
  const TimeEstimate& t = p.time;
  const std::pair<const char*, double> parts[] = {
      {"compute", t.compute}, {"bubble", t.bubble}, {"tp comm", t.tp},         {"cp comm", t.cp},
      {"pp comm", t.pp},      {"dp comm", t.dp},    {"optimizer", t.optimizer}};
  std::string out;
  for (const auto& [name, seconds] : parts) {
    const double share = seconds / t.total();
    if (share >= 0.05)
      out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", name, 100 * share);
  }
  return out;
}

void PrintHuman(const PlanRequest& r, const std::vector<PlannedLayout>& plans, size_t considered,
                int top) {
  const SampleSchema x = FamilyOf(r.model).Samples(r.model);
  const DeviceSpec& d = r.device;
  std::printf(
      "%s, %dx%d latents%s, global batch %d on %d node(s) x %d %s "
      "(%.1f TFLOP/s peak at %.0f%% x R/(R+%.0f) for GEMMs of R rows, %.2f GiB, %.0f%% usable; "
      "%.1f GB/s in a node, %.1f GB/s between nodes)\n",
      r.model.name().c_str(), x.height, x.width,
      r.fp8        ? ", train.precision fp8 (its memory; the step time as bf16's)"
      : r.gpu_step ? ", the GPU step in bf16"
                   : "",
      r.global_batch, r.nodes, r.devices_per_node, d.name.c_str(), d.peak_flops_per_second / 1e12,
      100 * d.efficiency, d.half_efficiency_rows, d.memory_bytes / kGiB,
      100 * r.usable_memory_fraction, d.intra_node_bytes_per_second / 1e9,
      d.inter_node_bytes_per_second / 1e9);
  std::printf("%zu layouts considered, %zu fit; the fastest predicted:\n\n", considered,
              plans.size());
  std::printf(
      "| # | layout | accum | GiB/rank | params | grads | optim | EMA | acts | step s | "
      "samples/s | why (share of the step) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < plans.size() && i < static_cast<size_t>(top); ++i) {
    const PlannedLayout& p = plans[i];
    const MemoryEstimate& m = p.memory;
    std::printf("| %zu | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.4g | %.4g | %s |\n",
                i + 1, DescribeLayout(p.layout).c_str(), p.accumulation, m.total() / kGiB,
                m.parameters / kGiB, m.gradients / kGiB, m.optimizer / kGiB, m.ema / kGiB,
                m.activations / kGiB, p.time.total(), r.global_batch / p.time.total(),
                Why(p).c_str());
  }
  const Layout& best = plans.front().layout;
  std::printf(
      "\nchosen: %s (job file: parallel: {tp: %d, cp: %d, pp: %d, dp: %d, zero1: %s}, "
      "batch.micro: %d, train.recompute: %s%s)\n",
      DescribeLayout(best).c_str(), best.tp, best.cp, best.pp, best.dp,
      best.zero1 ? "true" : "false", best.micro_batch, best.recompute ? "true" : "false",
      r.fp8        ? ", train.device: cuda, train.precision: fp8"
      : r.gpu_step ? ", train.device: cuda"
                   : "");
}

int RunPlan(const PlanOptions& o) {
  Result<PlanRequest> request = BuildRequest(o);
  if (!request.ok()) return ReportBadInput("plan", request.status().message());
  Result<std::vector<PlannedLayout>> all = EnumerateLayouts(*request);
  if (!all.ok()) return ReportBadInput("plan", all.status().message());
  Result<std::vector<PlannedLayout>> plans = PlanLayouts(*request);
  if (!plans.ok()) return ReportBadInput("plan", plans.status().message());
  if (o.json) {
    nlohmann::json shown = nlohmann::json::array();
    for (size_t i = 0; i < plans->size() && i < static_cast<size_t>(o.top); ++i)
      shown.push_back(ToJson(*request, (*plans)[i]));
    const DeviceSpec& d = request->device;
    std::printf("%s\n",
                nlohmann::json{{"model", request->model.config},
                               {"family", request->model.family},
                               {"gpu_step", request->gpu_step},
                               {"precision", request->fp8        ? "fp8"
                                             : request->gpu_step ? "bf16"
                                                                 : "fp32"},
                               {"global_batch", request->global_batch},
                               {"nodes", request->nodes},
                               {"devices_per_node", request->devices_per_node},
                               {"device",
                                {{"name", d.name},
                                 {"peak_flops_per_second", d.peak_flops_per_second},
                                 {"memory_bytes", d.memory_bytes},
                                 {"memory_bytes_per_second", d.memory_bytes_per_second},
                                 {"efficiency", d.efficiency},
                                 {"half_efficiency_rows", d.half_efficiency_rows},
                                 {"latency_seconds", d.latency_seconds},
                                 {"usable_memory_fraction", request->usable_memory_fraction},
                                 {"intra_node_bytes_per_second", d.intra_node_bytes_per_second},
                                 {"inter_node_bytes_per_second", d.inter_node_bytes_per_second}}},
                               {"considered", all->size()},
                               {"fitting", plans->size()},
                               {"layouts", shown}}
                    .dump(2)
                    .c_str());
  } else {
    PrintHuman(*request, *plans, all->size(), o.top);
  }
  return kExitOk;
}

}  // namespace

DIFFTRAIN_COMMAND(
    kPlan,
    {"plan", "Choose a parallel layout: predicted memory per rank and step time",
     [](CLI::App& app) {
       auto o = std::make_shared<PlanOptions>();
       o->model.AddTo(app);
       app.add_option("--tokens", o->tokens, "tokens per sample (instead of the size)");
       app.add_option("--device", o->device, "H100|H200|H20|A100|cpu")->capture_default_str();
       app.add_option("--memory-gib", o->memory_gib, "device memory (default: the preset's)");
       app.add_option("--memory-tbps", o->memory_tbps,
                      "memory bandwidth in TB/s (default: the preset's; cpu: not modelled)");
       app.add_option("--peak-tflops", o->peak_tflops,
                      "dense peak (default: the preset's; cpu: measured sgemm)");
       app.add_option("--efficiency", o->efficiency,
                      "fraction of the peak a step reaches with large GEMMs");
       app.add_option("--half-efficiency-rows", o->half_rows,
                      "GEMM rows (micro-batch tokens per rank) at half that efficiency");
       app.add_option("--intra-gbs", o->intra_gbs, "GB/s per device inside a node");
       app.add_option("--inter-gbs", o->inter_gbs, "GB/s per device between nodes");
       app.add_option("--nodes", o->nodes, "nodes")->capture_default_str();
       app.add_option("--devices-per-node", o->devices_per_node, "devices per node")
           ->capture_default_str();
       app.add_option("--global-batch", o->global_batch, "samples per optimizer step")
           ->capture_default_str();
       app.add_option("--usable-fraction", o->usable_fraction,
                      "fraction of device memory a plan may fill")
           ->capture_default_str();
       app.add_option("--tp", o->tp, "fix the tensor-parallel size");
       app.add_option("--cp", o->cp, "fix the context-parallel size");
       app.add_option("--pp", o->pp, "fix the pipeline stages");
       app.add_option("--micro-batch", o->micro_batch, "fix the micro-batch");
       app.add_option("--recompute", o->recompute, "fix activation recomputation (true|false)");
       app.add_flag("--gpu-step", o->gpu_step,
                    "plan what train.device cuda trains: data-parallel layouts, with the GPU "
                    "step's memory (bf16 activations, flash attention)");
       app.add_flag("--fp8", o->fp8,
                    "plan train.precision fp8 (implies --gpu-step): the FP8 layers' memory "
                    "besides; the step time is predicted as bf16's");
       app.add_option("--top", o->top, "candidates shown")->capture_default_str();
       app.add_flag("--json", o->json, "print JSON");
       return [o] { return RunPlan(*o); };
     }});

}  // namespace difftrain::launch
