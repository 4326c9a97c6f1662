#include "model/train/planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "model/device.h"
#include "model/dit/family.h"
#include "model/dit/shard.h"
#include "model/tensor/host_memory.h"
#include "model/train/planner_internal.h"

namespace difftrain {
namespace {

using planner::AllGatherBytes;
using planner::AllReduceBytes;
using planner::Choices;
using planner::Divisors;
using planner::Efficiency;
using planner::InsideNode;
using planner::kFloat;

constexpr double kGiB = 1 << 30;

// The memory this machine's ranks may use: its own, or its cgroup's limit (Slurm's --mem, a
// pod's limits.memory).
double HostMemoryBytes() {
  return static_cast<double>(ReadHostMemory().capacity());
}

// The dimensions the formulas below read, for one rank of `layout` and micro-batch B (of
// videos of Fr frames for Latte, BF frames in all; T tokens per frame, Tl of them here).
struct Shape {
  double B, Fr, BF, T, Tl, N, D, Dl, Hl, M, Ml, F, Fo;
  Shape(const DiTConfig& c, const Layout& l)
      : B(l.micro_batch),
        Fr(c.frames()),
        BF(l.micro_batch * Fr),
        T(c.tokens()),
        Tl(static_cast<double>(c.tokens()) / l.cp),
        N(BF * Tl),
        D(c.hidden_size),
        Dl(static_cast<double>(c.hidden_size) / l.tp),
        Hl(static_cast<double>(c.num_heads) / l.tp),
        M(c.mlp_hidden()),
        Ml(static_cast<double>(c.mlp_hidden()) / l.tp),
        F(c.patch_features()),
        Fo(c.patch_size * c.patch_size * c.out_channels()) {}
};

// Trainable parameters of a rank of `stage`: per block the adaLN (6D² + 6D) and the
// row-parallel biases (2D) replicated over tp, qkv (3D² + 3D), proj (D²), fc1 (DM + M) and
// fc2 (MD) split over tp; the embedders on the first stage, the final layer on the last.
double StageParameters(const DiTConfig& c, const Layout& l, int stage) {
  const Shape s(c, l);
  const double D = s.D, M = s.M;
  const double block =
      6 * D * D + 6 * D + 2 * D + (3 * D * D + 3 * D + D * D + 2 * D * M + M) / l.tp;
  double n = StageBlocks(c.depth, l.pp, stage) * block;
  if (stage == 0) n += s.F * D + D + kFrequencyDim * D + D + D * D + D + c.label_rows() * D;
  if (stage == l.pp - 1) n += 2 * D * D + 2 * D + s.Fo * D + s.Fo;
  return n;
}

// Which blocks a formula counts: spatial (every DiT block, Latte's even ones), temporal
// (Latte's odd ones), or room for either (Latte's recomputation workspace).
enum class Blocks { kSpatial, kTemporal, kEither };

// Elements of one block's activations but its input: adaLN output (6BD); LayerNorm, modulate,
// proj, residual, LayerNorm, modulate and fc2 outputs (7 N·D); four LayerNorm statistics per
// token (4N); q, k, v and the attention output of this rank's heads (4 N·D/tp); fc1 and GELU
// (2 N·M/tp); the attention probabilities (spatial: BF·H/tp·T/cp·T; temporal:
// B·T/cp·H/tp·Fr²); with cp, a spatial block's gathered k and v (3 BF·T·D/tp); a temporal
// block's token-major copy of q, k and v (3 N·D/tp).
double BlockActivations(const Shape& s, int cp, Blocks kind) {
  const double spatial_probs = s.BF * s.Hl * s.Tl * s.T;
  const double temporal_probs = s.B * s.Tl * s.Hl * s.Fr * s.Fr;
  const double spatial_kv = cp > 1 ? 3 * s.BF * s.T * s.Dl : 0, temporal_kv = 3 * s.N * s.Dl;
  const double probs = kind == Blocks::kSpatial    ? spatial_probs
                       : kind == Blocks::kTemporal ? temporal_probs
                                                   : std::max(spatial_probs, temporal_probs);
  const double kv = kind == Blocks::kSpatial    ? spatial_kv
                    : kind == Blocks::kTemporal ? temporal_kv
                                                : std::max(spatial_kv, temporal_kv);
  return 6 * s.B * s.D + 7 * s.N * s.D + 4 * s.N + 4 * s.N * s.Dl + 2 * s.N * s.Ml + probs + kv;
}

// The first block of `stage` when the blocks are balanced (StageBlocks).
int StageFirstBlock(int depth, int pp, int stage) {
  int first = 0;
  for (int i = 0; i < stage; ++i)
    first += StageBlocks(depth, pp, i);
  return first;
}

// How many of a stage's blocks are temporal (Latte's odd blocks).
int StageTemporalBlocks(const DiTConfig& c, const Layout& l, int stage) {
  const int first = StageFirstBlock(c.depth, l.pp, stage);
  int n = 0;
  for (int i = first; i < first + StageBlocks(c.depth, l.pp, stage); ++i)
    n += c.temporal_block(i) ? 1 : 0;
  return n;
}

// Activation elements of a rank of `stage` with `slots` micro-batches in flight.
double StageActivations(const DiTConfig& c, const Layout& l, int stage, int slots) {
  const Shape s(c, l);
  const bool first = stage == 0, last = stage == l.pp - 1, split = l.cp > 1;
  const double B = s.B, BF = s.BF, D = s.D, N = s.N, T = s.T;
  const int blocks = StageBlocks(c.depth, l.pp, stage);
  const int temporal = StageTemporalBlocks(c, l, stage);
  // Per micro-batch in flight: the conditioning c and SiLU(c); on the first stage the
  // patches and the timestep and label embeddings; every block's input, and without
  // recomputation the rest of the block; the last block's output; on the last stage the
  // final layer (adaLN, LayerNorm and its statistics, modulate, linear, gathered tokens
  // with cp, the output).
  double slot = 2 * B * D;
  if (first) slot += N * s.F + B * kFrequencyDim + (c.has_labels() ? 4 : 3) * B * D;
  slot += blocks * N * D;
  if (!l.recompute) {
    slot += (blocks - temporal) * BlockActivations(s, l.cp, Blocks::kSpatial) +
            temporal * BlockActivations(s, l.cp, Blocks::kTemporal);
  }
  slot += N * D;
  if (last)
    slot += 2 * B * D + 2 * N * D + 2 * N + N * s.Fo + (split ? BF * T * s.Fo : 0) + BF * T * s.Fo;
  // Shared by the slots: the backward scratch (three N·D residual and branch gradients, the
  // q/k/v and MLP gradients, the adaLN and conditioning gradients), the whole patches on
  // the first stage, the sequence exchange buffers with cp, and with recomputation one
  // block's workspace.
  double scratch = 3 * N * D + 3 * N * s.Dl + 2 * N * s.Ml + 6 * B * D + 2 * B * D;
  if (first) scratch += BF * T * s.F + 2 * B * D;
  if (last) scratch += N * s.Fo;
  if (split) {
    scratch += 3 * BF * T * s.Dl + (last ? BF * T * s.Fo : 0) +
               BF * T * std::max(3 * s.Dl, last ? s.Fo : 0.0);
  }
  if (c.video) scratch += 4 * N * s.Dl;  // a temporal block's attention output and qkv gradient
  if (l.recompute)
    scratch += BlockActivations(s, l.cp, c.video ? Blocks::kEither : Blocks::kSpatial);
  return slot * slots + scratch;
}

// Forward multiply-accumulates per sample of one rank's blocks of `stage`: their matmuls
// and attention split over tp and cp (over every frame's tokens; a spatial block attends
// within a frame, a temporal one across the Fr frames), their adaLN replicated.
double StageBlockMacs(const DiTConfig& c, const Layout& l, int stage) {
  const Shape s(c, l);
  const double D = s.D, T = s.Fr * s.T;
  const int temporal = StageTemporalBlocks(c, l, stage);
  const int spatial = StageBlocks(c.depth, l.pp, stage) - temporal;
  const double linear = (3 * D * D * T + D * D * T + 2 * s.M * D * T) / (l.tp * l.cp) + 6 * D * D;
  return spatial * (linear + 2 * T * s.T * D / (l.tp * l.cp)) +
         temporal * (linear + 2 * T * s.Fr * D / (l.tp * l.cp));
}

// Forward multiply-accumulates per sample on one rank of `stage`: its blocks, the embedders
// on the first stage (the patch embed split over cp), the final layer on the last.
double StageForwardMacs(const DiTConfig& c, const Layout& l, int stage) {
  const Shape s(c, l);
  const double D = s.D, T = s.Fr * s.T;
  double macs = StageBlockMacs(c, l, stage);
  if (stage == 0) macs += T * s.F * D / l.cp + kFrequencyDim * D + D * D;
  if (stage == l.pp - 1) macs += 2 * D * D + T * D * s.Fo / l.cp;
  return macs;
}

TimeEstimate PredictTime(const PlanRequest& r, const DiTConfig& c, const Layout& l,
                         int micro_batches) {
  const DeviceSpec& d = r.device;
  const Shape s(c, l);
  const int G = r.devices_per_node;
  auto bandwidth = [&](int stride, int size) {
    return InsideNode(stride, size, G) ? d.intra_node_bytes_per_second
                                       : d.inter_node_bytes_per_second;
  };
  // Training = forward + backward (2× forward); recomputation runs the blocks' forward again.
  const double efficiency = Efficiency(d, s.N / l.tp);
  double micro_seconds = 0;
  int busiest = 0;
  for (int stage = 0; stage < l.pp; ++stage) {
    const double recomputed = l.recompute ? StageBlockMacs(c, l, stage) : 0;
    const double flops = 2 * s.B * (3 * StageForwardMacs(c, l, stage) + recomputed);
    const double seconds = flops / (d.peak_flops_per_second * efficiency);
    if (seconds > micro_seconds) {
      micro_seconds = seconds;
      busiest = stage;
    }
  }
  const double m = micro_batches;
  const int blocks = StageBlocks(c.depth, l.pp, busiest);
  TimeEstimate t;
  t.compute = m * micro_seconds;
  t.bubble = (l.pp - 1) * micro_seconds;
  // TP: per block the proj and fc2 all-reduce in forward, their input gradients in
  // backward, and the forward's again when recomputing.
  const int tp_ops = 4 + (l.recompute ? 2 : 0);
  if (l.tp > 1) {
    t.tp = m * blocks * tp_ops *
           (AllReduceBytes(kFloat * s.N * s.D, l.tp) / bandwidth(1, l.tp) + d.latency_seconds);
  }
  // CP: per block k and v (with q) gathered in forward, reduce-scattered in backward (and
  // gathered again when recomputing); the final layer's output gathered once.
  // Latte's temporal blocks exchange nothing: every rank holds every frame of its tokens.
  if (l.cp > 1) {
    const int kv_ops = 2 + (l.recompute ? 1 : 0);
    const int spatial = blocks - StageTemporalBlocks(c, l, busiest);
    const double kv = AllGatherBytes(kFloat * s.BF * s.T * 3 * s.Dl, l.cp);
    const double out = AllGatherBytes(kFloat * s.BF * s.T * s.Fo, l.cp);
    t.cp = m * ((spatial * kv_ops * kv + out) / bandwidth(l.tp, l.cp) +
                (spatial * kv_ops + 1) * d.latency_seconds);
  }
  // PP: each micro-batch's boundary (tokens and conditioning) forward, its gradient back.
  if (l.pp > 1) {
    t.pp = m * 2 *
           (kFloat * (s.N * s.D + s.B * s.D) / bandwidth(l.tp * l.cp * l.dp, l.pp) +
            d.latency_seconds);
  }
  // The optimizer's pass, once per step, memory-bound: per parameter of the rank's share the
  // GPU step moves 46 bytes (AdamW reading the fp32 gradient, master weight and moments and
  // writing them back with the bf16 copy and the EMA, 38; the gradient norm's read, 4; the
  // gradients' zeroing, 4). On an H100 that pass and the norm took 10.9 ms of DiT-XL/2's step
  // (docs/benchmarks.md). Not modelled where the bandwidth is not (the CPU).
  if (d.memory_bytes_per_second > 0) {
    const int shards = l.zero1 ? l.dp * l.cp : 1;
    t.optimizer = 46 * StageParameters(c, l, busiest) / shards / d.memory_bytes_per_second;
  }
  // DP: the gradients averaged over the dp-cp group once per step (ZeRO-1's reduce-scatter
  // and all-gather move the same bytes as the all-reduce).
  const int group = l.dp * l.cp;
  if (group > 1) {
    t.dp = AllReduceBytes(kFloat * StageParameters(c, l, busiest), group) / bandwidth(l.tp, group) +
           d.latency_seconds;
  }
  return t;
}

std::string GiB(double bytes) {
  return fmt::format("{:.2f} GiB", bytes / kGiB);
}

// Checks the fixed sizes and the request's numbers before any enumeration; the message names
// the flag and what it must be.
Status CheckRequest(const PlanRequest& r) {
  if (r.model.family != "dit" && r.model.family != "latte") {
    return Errorf(
        "the planner's cost model covers the dit, latte and unet families, not {} (give "
        "parallel sizes)",
        r.model.family);
  }
  const DiTConfig c = DiTConfigOf(r.model);
  DT_RETURN_IF_ERROR(c.Validate().WithContext("model"));
  DT_RETURN_IF_ERROR(planner::CheckCommonRequest(r));
  const int world = r.nodes * r.devices_per_node;
  if (r.tp) {
    if (*r.tp < 1 || c.num_heads % *r.tp != 0 || r.devices_per_node % *r.tp != 0) {
      return Errorf(
          "tp {}: expected a divisor of the model's {} heads and of the {} devices per node "
          "(tensor-parallel groups stay inside a node)",
          *r.tp, c.num_heads, r.devices_per_node);
    }
  }
  if (r.cp && (*r.cp < 1 || c.tokens() % *r.cp != 0)) {
    return Errorf("cp {}: expected a divisor of the model's {} tokens", *r.cp, c.tokens());
  }
  if (r.pp && (*r.pp < 1 || *r.pp > c.depth)) {
    return Errorf("pp {}: expected 1 to the model's depth {}", *r.pp, c.depth);
  }
  const int model_parallel = r.tp.value_or(1) * r.cp.value_or(1) * r.pp.value_or(1);
  if (world % model_parallel != 0) {
    return Errorf("tp x cp x pp = {} does not divide the {} devices ({} node(s) x {})",
                  model_parallel, world, r.nodes, r.devices_per_node);
  }
  return Status::Ok();
}

}  // namespace

Status planner::CheckCommonRequest(const PlanRequest& r) {
  if (r.nodes < 1 || r.devices_per_node < 1) {
    return Errorf("nodes and devices per node must be positive, got {} and {}", r.nodes,
                  r.devices_per_node);
  }
  if (r.global_batch < 1) return Errorf("global batch must be positive, got {}", r.global_batch);
  const DeviceSpec& d = r.device;
  if (!(d.memory_bytes > 0) || !(d.peak_flops_per_second > 0) ||
      !(d.intra_node_bytes_per_second > 0) || !(d.inter_node_bytes_per_second > 0)) {
    return Errorf("device {}: memory, peak and bandwidths must be positive", d.name);
  }
  if (!(d.memory_bytes_per_second >= 0)) {
    return Errorf("device {}: memory bandwidth must be non-negative (0: not modelled), found {}",
                  d.name, d.memory_bytes_per_second);
  }
  if (!(d.efficiency > 0 && d.efficiency <= 1) || !(d.half_efficiency_rows >= 0) ||
      !(d.latency_seconds >= 0)) {
    return Errorf(
        "device {}: expected an efficiency in (0, 1] and a non-negative half-efficiency rows and "
        "latency, found {}, {} and {}",
        d.name, d.efficiency, d.half_efficiency_rows, d.latency_seconds);
  }
  if (r.micro_batch && (*r.micro_batch < 1 || r.global_batch % *r.micro_batch != 0)) {
    return Errorf("micro batch {}: expected a divisor of the global batch {}", *r.micro_batch,
                  r.global_batch);
  }
  return Status::Ok();
}

Result<DeviceSpec> DevicePreset(const std::string& name, int devices_per_node) {
  // NVLink 4 moves 900 GB/s per GPU both ways together (450 GB/s each way; A100's NVLink 3
  // 600); across nodes one 400 Gb/s NDR InfiniBand port per GPU (200 Gb/s HDR for A100).
  // Efficiency 0.5 with half of it at 2,048 rows: the DiT seeds reach 25% (fast-DiT,
  // A100) to 53% (Megatron, H20) of the peak. NCCL latency ~20 µs per operation. HBM
  // bandwidth: the SXM parts' data sheets (H100 3.35 TB/s, H200 4.8, H20 4.0, A100-80G 2.0).
  DeviceSpec d;
  d.name = name;
  d.efficiency = 0.5;
  d.half_efficiency_rows = 2048;
  d.intra_node_bytes_per_second = 450e9;
  d.inter_node_bytes_per_second = 50e9;
  d.latency_seconds = 20e-6;
  if (name == "H100") {
    d.fp8 = true;
    d.memory_bytes_per_second = 3.35e12;
    d.peak_flops_per_second = 989e12;
    d.memory_bytes = 80 * kGiB;
  } else if (name == "H200") {
    d.fp8 = true;
    d.memory_bytes_per_second = 4.8e12;
    d.peak_flops_per_second = 989e12;
    d.memory_bytes = 141e9;
  } else if (name == "H20") {
    d.fp8 = true;
    d.memory_bytes_per_second = 4.0e12;
    d.peak_flops_per_second = 148e12;
    d.memory_bytes = 96 * kGiB;
  } else if (name == "A100") {
    d.memory_bytes_per_second = 2.0e12;
    d.peak_flops_per_second = 312e12;
    d.memory_bytes = 80 * kGiB;
    d.intra_node_bytes_per_second = 300e9;
    d.inter_node_bytes_per_second = 25e9;
  } else if (name == "cpu") {
    // The ranks of a node share its memory; Gloo over loopback, 10 GbE between nodes. A
    // DiT-S/4 step reached 69% of the sgemm peak with 2,048 rows and 81% with 4,096
    // (docs/benchmarks.md): 0.95 · N / (N + 900) fits both within 6%.
    d.memory_bytes = HostMemoryBytes() / std::max(1, devices_per_node);
    d.efficiency = 0.95;
    d.half_efficiency_rows = 900;
    d.intra_node_bytes_per_second = 2e9;
    d.inter_node_bytes_per_second = 1.25e9;
    d.latency_seconds = 100e-6;
  } else {
    return Errorf("unknown device '{}' (expected one of H100, H200, H20, A100, cpu)", name);
  }
  return d;
}

std::vector<std::string> DevicePresetNames() {
  return {"H100", "H200", "H20", "A100", "cpu"};
}

int StageBlocks(int depth, int pp, int stage) {
  const int extra = depth % pp;
  return depth / pp + (stage >= pp - extra ? 1 : 0);
}

MemoryEstimate PredictMemory(const DiTConfig& c, const Layout& l, int stage, int micro_batches) {
  const double trainable = StageParameters(c, l, stage);
  // The fixed embeddings: pos_embed, and Latte's temp_embed.
  const double pos_embed =
      stage == 0 ? static_cast<double>(c.tokens() + (c.video ? c.num_frames : 0)) * c.hidden_size
                 : 0;
  // ZeRO-1 gives each of the dp·cp ranks an equal share of the moments (rounded up).
  const int shards = l.zero1 ? l.dp * l.cp : 1;
  const int slots = std::min(l.pp - stage, micro_batches);
  MemoryEstimate m;
  m.parameters = kFloat * (trainable + pos_embed);
  m.gradients = kFloat * trainable;
  m.optimizer = kFloat * 2 * std::ceil(trainable / shards);
  m.ema = kFloat * trainable;
  m.activations = kFloat * StageActivations(c, l, stage, slots);
  return m;
}

std::string DescribeLayout(const Layout& l) {
  return fmt::format("tp {} cp {} pp {} dp {} micro {}{}{}", l.tp, l.cp, l.pp, l.dp, l.micro_batch,
                     l.recompute ? " recompute" : "", l.zero1 ? " zero1" : "");
}

MemoryEstimate PredictMemory(const ModelSpec& model, const Layout& layout, int stage,
                             int micro_batches) {
  if (model.family == "unet") return planner::PredictUNetMemory(model, layout);
  return PredictMemory(DiTConfigOf(model), layout, stage, micro_batches);
}

namespace {

// The request with the GPU step's fixed sizes (tp, cp, pp 1; no recomputation or ZeRO-1), or an
// error naming a fixed size the GPU step cannot train.
Result<PlanRequest> WithGpuStepSizes(PlanRequest r) {
  for (const auto& [name, size] : {std::pair{"tp", r.tp}, {"cp", r.cp}, {"pp", r.pp}}) {
    if (size && *size != 1) {
      return Errorf("{} {}: the GPU step (train.device cuda) trains data-parallel layouts only",
                    name, *size);
    }
  }
  if (r.recompute.value_or(false) || r.zero1.value_or(false)) {
    return Errorf("the GPU step (train.device cuda) neither recomputes nor shards the optimizer");
  }
  r.tp = r.cp = r.pp = 1;
  r.recompute = r.zero1 = false;
  return r;
}

}  // namespace

namespace planner {

std::optional<MemoryEstimate> GpuStepMemory(const ModelSpec& model, int micro_batch,
                                            double trainable, bool fp8) {
  const std::optional<ModelFamily::GpuStepMemory> bytes =
      FamilyOf(model).GpuStepBytes(model, micro_batch, fp8);
  if (!bytes) return std::nullopt;
  // The fp32 gradients, moments and EMA of every parameter; the rest of the state is the
  // fp32 master weights, their bf16 copy, the fixed embeddings and the norm's workspace.
  MemoryEstimate m;
  m.gradients = kFloat * trainable;
  m.optimizer = 2 * kFloat * trainable;
  m.ema = kFloat * trainable;
  m.parameters = static_cast<double>(bytes->state) - m.gradients - m.optimizer - m.ema;
  m.activations = static_cast<double>(bytes->activations);
  return m;
}

}  // namespace planner

Result<std::vector<PlannedLayout>> EnumerateLayouts(const PlanRequest& request) {
  PlanRequest r = request;
  if (r.gpu_step) {
    DT_ASSIGN_OR_RETURN(r, WithGpuStepSizes(r));
  }
  if (r.model.family == "unet") return planner::EnumerateUNetLayouts(r);
  DT_RETURN_IF_ERROR(CheckRequest(r));
  const DiTConfig c = DiTConfigOf(r.model);
  const int world = r.nodes * r.devices_per_node;
  const double budget = r.usable_memory_fraction * r.device.memory_bytes;
  std::vector<PlannedLayout> out;
  // pp divides the world (as tp · cp · pp must) and is at most the depth.
  std::vector<int> pps;
  for (int pp : Divisors(world)) {
    if (pp <= c.depth) pps.push_back(pp);
  }
  for (int tp : Choices(r.tp, Divisors(std::gcd(c.num_heads, r.devices_per_node)))) {
    for (int cp : Choices(r.cp, Divisors(c.tokens()))) {
      for (int pp : Choices(r.pp, pps)) {
        if (world % (tp * cp * pp) != 0) continue;
        if (!ValidateParallelLayout(c, tp, cp, pp, {}).ok()) continue;
        const int dp = world / (tp * cp * pp);
        if (r.global_batch % dp != 0) continue;
        for (int micro : Choices(r.micro_batch, Divisors(r.global_batch / dp))) {
          if ((r.global_batch / dp) % micro != 0) continue;
          for (bool recompute : {false, true}) {
            if (r.recompute && *r.recompute != recompute) continue;
            for (bool zero1 : {false, true}) {
              if (zero1 && dp * cp == 1) continue;  // nothing to shard
              if (r.zero1 && *r.zero1 != zero1) continue;
              PlannedLayout p;
              p.layout = {tp, cp, pp, dp, micro, recompute, zero1};
              p.accumulation = r.global_batch / (dp * micro);
              for (int stage = 0; stage < pp; ++stage) {
                const MemoryEstimate m = PredictMemory(c, p.layout, stage, p.accumulation);
                if (stage == 0 || m.total() > p.memory.total()) {
                  p.memory = m;
                  p.worst_stage = stage;
                }
              }
              if (r.gpu_step) {
                if (std::optional<MemoryEstimate> gpu = planner::GpuStepMemory(
                        r.model, micro, StageParameters(c, p.layout, 0), r.fp8)) {
                  p.memory = *gpu;
                }
              }
              p.time = PredictTime(r, c, p.layout, p.accumulation);
              p.fits = p.memory.total() <= budget;
              out.push_back(p);
            }
          }
        }
      }
    }
  }
  if (out.empty()) {
    return Errorf(
        "no layout of {} on {} device(s) splits the global batch {} (dp must divide it; "
        "tp must divide {} heads and {} devices per node; cp the {} tokens)",
        c.name, world, r.global_batch, c.num_heads, r.devices_per_node, c.tokens());
  }
  return out;
}

Result<std::vector<PlannedLayout>> PlanLayouts(const PlanRequest& r) {
  DT_ASSIGN_OR_RETURN(std::vector<PlannedLayout> all, EnumerateLayouts(r));
  std::vector<PlannedLayout> fitting;
  const PlannedLayout* smallest = &all.front();
  for (const PlannedLayout& p : all) {
    if (p.fits) fitting.push_back(p);
    if (p.memory.total() < smallest->memory.total()) smallest = &p;
  }
  if (fitting.empty()) {
    const MemoryEstimate& m = smallest->memory;
    return Errorf(
        "{} does not fit: the smallest layout ({}) needs {} per rank (parameters {}, gradients "
        "{}, optimizer {}, EMA {}, activations {}), but a rank may use {} ({:.0f}% of the {} "
        "of a {} device)",
        r.model.name(), DescribeLayout(smallest->layout), GiB(m.total()), GiB(m.parameters),
        GiB(m.gradients), GiB(m.optimizer), GiB(m.ema), GiB(m.activations),
        GiB(r.usable_memory_fraction * r.device.memory_bytes), 100 * r.usable_memory_fraction,
        GiB(r.device.memory_bytes), r.device.name);
  }
  std::sort(fitting.begin(), fitting.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.time.total() != b.time.total()) return a.time.total() < b.time.total();
    return a.memory.total() < b.memory.total();
  });
  return fitting;
}

PlanDevice LocalPlanDevice() {
  const DeviceInventory inventory = QueryDeviceInventory();
  if (inventory.gpus.empty()) return {"", HostMemoryBytes()};
  return {inventory.gpus.front().name, static_cast<double>(inventory.gpus.front().memory_bytes)};
}

std::string DescribePlanDevice(const PlanDevice& d) {
  return fmt::format("{} with {:.1f} GiB", d.gpu.empty() ? "cpu" : d.gpu, d.memory_bytes / kGiB);
}

Result<PlannedLayout> ChooseLayout(const ModelSpec& model, int global_batch,
                                   std::optional<int> micro_batch, int nodes, int devices_per_node,
                                   const PlanDevice& device, bool data_parallel_only, bool fp8) {
  PlanRequest r;
  r.gpu_step = data_parallel_only;
  r.fp8 = fp8;
  r.model = model;
  r.global_batch = global_batch;
  r.micro_batch = micro_batch;
  r.nodes = nodes;
  r.devices_per_node = devices_per_node;
  std::string preset = "cpu";
  // "H200" before "H20": the longer name first.
  for (const char* name : {"H200", "H100", "H20", "A100"}) {
    if (!device.gpu.empty() && device.gpu.find(name) != std::string::npos) {
      preset = name;
      break;
    }
  }
  DT_ASSIGN_OR_RETURN(r.device, DevicePreset(preset, devices_per_node));
  if (device.gpu.empty()) {
    r.device.peak_flops_per_second = kNominalCpuPeakFlops;
    if (device.memory_bytes > 0) {
      r.device.memory_bytes = device.memory_bytes / std::max(1, devices_per_node);
    }
  } else if (device.memory_bytes > 0) {
    r.device.memory_bytes = device.memory_bytes;
  }
  DT_ASSIGN_OR_RETURN(std::vector<PlannedLayout> plans, PlanLayouts(r));
  return plans.front();
}

}  // namespace difftrain
