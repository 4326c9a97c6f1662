// The planner's cost model for the Stable Diffusion UNet (model/train/planner.h): data
// parallelism only (NeMo and MosaicML train it so, and the unet family refuses tp, cp and
// pp), with the micro-batch, ZeRO-1 and activation recomputation as the choices.
//
// Memory: the fp32 state (parameters, gradients, EMA, the AdamW moments divided over dp with
// ZeRO-1) and the activation arena of the family's own model (UNet::ActivationBytes, the
// bytes Reserve allocates), which is affine in the micro-batch: read at 1 and 2, it gives
// every micro-batch without building one.
//
// Time: each layer of the UNet (model/unet/plan.h) at the efficiency of its own GEMMs, whose
// rows are the micro-batch's pixels at the layer's resolution (B·H·W: a convolution as an
// implicit GEMM, the transformer's projections and attention per token), so that the 8×8
// level of SD at 512 px feeds the device 64× fewer rows than the 64×64 one; training FLOPs
// 6 × the forward MACs, and with recomputation 2 × the MACs the layers run again. Plus each
// layer's memory-bound kernels (norms, SiLU, adds, concatenations, upsampling, casts, im2col:
// NodeBytes) at the device's memory bandwidth, their forward again with recomputation. The
// gradients' all-reduce over dp once per step, not overlapped.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "model/train/planner_internal.h"
#include "model/unet/family.h"
#include "model/unet/plan.h"

namespace difftrain::planner {
namespace {

// Activation bytes of one slot of micro-batch B: fixed + per_sample · B.
struct ActivationModel {
  double fixed = 0, per_sample = 0;
  ActivationModel(const ModelSpec& model, bool recompute) {
    const ModelFamily& family = FamilyOf(model);
    const double one = static_cast<double>(family.ActivationBytes(model, {}, 0, 1, 1, recompute));
    const double two = static_cast<double>(family.ActivationBytes(model, {}, 0, 2, 1, recompute));
    per_sample = two - one;
    fixed = one - per_sample;
  }
  double bytes(int B) const { return fixed + per_sample * B; }
};

MemoryEstimate Memory(double parameters, const Layout& l, const ActivationModel& activations) {
  const int shards = l.zero1 ? l.dp : 1;
  MemoryEstimate m;
  m.parameters = kFloat * parameters;
  m.gradients = kFloat * parameters;
  m.optimizer = kFloat * 2 * std::ceil(parameters / shards);
  m.ema = kFloat * parameters;
  m.activations = activations.bytes(l.micro_batch);
  return m;
}

// Seconds of one micro-batch of B's forward and backward (and recomputation) on one device:
// per node, its GEMM time plus the time of its memory-bound kernels' bytes at the device's
// memory bandwidth. A sum, not a max: the GPU step runs its kernels one after another on one
// stream, so a GEMM and the norm or add beside it do not overlap (a max would be right for
// a kernel that fused them). The sum also fits NeMo's figures better on all three devices
// (docs/benchmarks.md).
double MicroBatchSeconds(const DeviceSpec& d, const UNetConfig& c, const UNetPlan& plan, int B,
                         bool recompute) {
  const double E = c.time_embed_dim();
  // The time embedding: one row per sample.
  double seconds = 6.0 * B * (c.block_out_channels[0] * E + E * E) /
                   (d.peak_flops_per_second * Efficiency(d, B));
  for (const UNetNode& n : plan.nodes) {
    const UNetNodeMacs m = NodeMacs(c, plan, n);
    const double rows = double(B) * plan.out(n).H * plan.out(n).W;
    const double flops = 2.0 * B * (3 * m.forward.total() + (recompute ? m.recomputed : 0));
    const double gemm = flops / (d.peak_flops_per_second * Efficiency(d, rows));
    double memory = 0;
    if (d.memory_bytes_per_second > 0) {
      const UNetNodeBytes bytes = NodeBytes(plan, n);
      memory = B * (bytes.total() + (recompute ? bytes.forward : 0)) / d.memory_bytes_per_second;
    }
    seconds += gemm + memory;
  }
  return seconds;
}

}  // namespace

MemoryEstimate PredictUNetMemory(const ModelSpec& model, const Layout& layout) {
  const double parameters = static_cast<double>(FamilyOf(model).Cost(model).trainable);
  return Memory(parameters, layout, ActivationModel(model, layout.recompute));
}

Result<std::vector<PlannedLayout>> EnumerateUNetLayouts(const PlanRequest& r) {
  const UNetConfig c = UNetConfigOf(r.model);
  DT_RETURN_IF_ERROR(c.Validate().WithContext("model"));
  DT_RETURN_IF_ERROR(CheckCommonRequest(r));
  for (auto [axis, size] : {std::pair{"tp", r.tp}, {"cp", r.cp}, {"pp", r.pp}}) {
    if (size && *size != 1) {
      return Errorf("{} {}: the unet family trains data-parallel only (tp, cp and pp must be 1)",
                    axis, *size);
    }
  }
  const int dp = r.nodes * r.devices_per_node;
  if (r.global_batch % dp != 0) {
    return Errorf(
        "global batch {}: expected a multiple of the {} devices (the unet family trains "
        "data-parallel only: every device is a replica)",
        r.global_batch, dp);
  }
  const int per_replica = r.global_batch / dp;
  if (r.micro_batch && per_replica % *r.micro_batch != 0) {
    return Errorf(
        "micro batch {}: expected a divisor of the {} samples per replica (global {} / dp {})",
        *r.micro_batch, per_replica, r.global_batch, dp);
  }
  const UNetPlan plan(c);
  const double parameters = static_cast<double>(plan.table.total());
  const ActivationModel stored(r.model, false), recomputed(r.model, true);
  const double budget = r.usable_memory_fraction * r.device.memory_bytes;
  const DeviceSpec& d = r.device;
  const double bandwidth = InsideNode(1, dp, r.devices_per_node) ? d.intra_node_bytes_per_second
                                                                 : d.inter_node_bytes_per_second;
  std::vector<PlannedLayout> out;
  for (int micro : Choices(r.micro_batch, Divisors(per_replica))) {
    for (bool recompute : {false, true}) {
      if (r.recompute && *r.recompute != recompute) continue;
      const double micro_seconds = MicroBatchSeconds(d, c, plan, micro, recompute);
      for (bool zero1 : {false, true}) {
        if (zero1 && dp == 1) continue;  // nothing to shard
        if (r.zero1 && *r.zero1 != zero1) continue;
        PlannedLayout p;
        p.layout = {1, 1, 1, dp, micro, recompute, zero1};
        p.accumulation = per_replica / micro;
        p.memory = Memory(parameters, p.layout, recompute ? recomputed : stored);
        if (r.gpu_step) {
          if (std::optional<MemoryEstimate> gpu =
                  GpuStepMemory(r.model, micro, parameters, r.fp8)) {
            p.memory = *gpu;
          }
        }
        p.time.compute = p.accumulation * micro_seconds;
        if (dp > 1) {
          p.time.dp = AllReduceBytes(kFloat * parameters, dp) / bandwidth + d.latency_seconds;
        }
        p.fits = p.memory.total() <= budget;
        out.push_back(p);
      }
    }
  }
  return out;
}

}  // namespace difftrain::planner
