// The layout planner behind `difftrain plan` and `parallel: auto` (docs/bench.md): predicts
// each rank's memory and the step time of a DiT under a tensor × context × data × pipeline
// layout, and picks the fastest layout that fits the device.
//
// The memory model is written from the model's dimensions alone, term by term, in the
// manner of Megatron's activation formulas (bytes = 4 · elements: every arena is fp32). It
// does not ask the model or the trainer what they allocate; planner_test.cc checks it
// against a real Trainer's arenas and its process's resident memory.
//
// The time model: compute = training FLOPs of the busiest pipeline stage / (peak ·
// efficiency at its GEMM size), times (micro-batches + pp − 1) for the 1F1B schedule (the
// pp − 1 is the bubble); communication = bytes each rank moves in its TP, CP, PP and DP
// groups (ring all-reduce 2(g−1)/g, all-gather and reduce-scatter (g−1)/g of the whole
// buffer) over the intra-node bandwidth when the group lies inside a node, else the
// inter-node bandwidth, plus a latency per operation; none of it assumed to overlap compute.
//
// The Stable Diffusion UNet (model/train/planner_unet.cc) trains data-parallel only: its
// layouts are dp = the world, with micro-batch, ZeRO-1 and recomputation as choices. Its
// memory is the family's model (the arenas UNet::Reserve allocates, exact by construction);
// its compute is priced layer by layer, each layer's conv, linear and attention MACs at the
// efficiency of its own GEMM rows (the micro-batch's pixels at that layer's resolution).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/dit/config.h"
#include "model/family/family.h"

namespace difftrain {

// What the planner knows of a device: its dense peak, its memory, and the bandwidth one
// device has to its peers inside a node and across nodes.
struct DeviceSpec {
  std::string name;                  // "H100", "cpu"
  double peak_flops_per_second = 0;  // dense (BF16 on GPUs, measured sgemm on a CPU)
  double memory_bytes = 0;           // per device (per rank on a CPU)
  // The fraction of the peak a training step reaches when each of a rank's GEMMs does the
  // work of N full-width rows (the micro-batch's tokens on the rank, divided by tp, which
  // narrows the GEMMs): efficiency · N / (N + half_efficiency_rows). Small micro-batches
  // feed the matrix units poorly.
  double efficiency = 0;
  double half_efficiency_rows = 0;
  double intra_node_bytes_per_second = 0;
  double inter_node_bytes_per_second = 0;
  double latency_seconds = 0;  // of every collective or send, whatever its size
  // Device memory (HBM) bandwidth, read and written together; the UNet's memory-bound kernels
  // are priced at it (model/train/planner_unet.cc). 0: not modelled (the cpu preset).
  double memory_bytes_per_second = 0;
  bool fp8 = false;  // FP8 tensor cores (compute capability 8.9 or later): train.precision fp8
};

// H100, H200, H20, A100 (the dense BF16 table of docs/metrics.md, their memory, HBM and
// NVLink / InfiniBand bandwidth), or cpu: this machine's memory shared by `devices_per_node`
// ranks, loopback and 10 GbE bandwidth, and a peak the caller fills in (0 here).
Result<DeviceSpec> DevicePreset(const std::string& name, int devices_per_node);
std::vector<std::string> DevicePresetNames();

// One parallel layout of a job.
struct Layout {
  int tp = 1, cp = 1, pp = 1, dp = 1;
  int micro_batch = 1;
  bool recompute = false;  // activation recomputation (train.recompute)
  bool zero1 = false;      // AdamW moments sharded over the dp-cp group
};

// Bytes one rank holds.
struct MemoryEstimate {
  double parameters = 0;  // trainable parameters and the fixed position embedding
  double gradients = 0;
  double optimizer = 0;  // two AdamW moments, this rank's share
  double ema = 0;
  double activations = 0;  // the micro-batches in flight, the backward scratch
  double total() const { return parameters + gradients + optimizer + ema + activations; }
};

// Seconds of one optimizer step on the busiest rank.
struct TimeEstimate {
  double compute = 0;  // the micro-batches' forward and backward (and recomputation)
  double bubble = 0;   // pipeline fill and drain
  double tp = 0, cp = 0, pp = 0, dp = 0;  // communication of each group
  double optimizer = 0;  // the optimizer's pass over the rank's parameters (DiT and Latte)
  double total() const { return compute + bubble + tp + cp + pp + dp + optimizer; }
};

// Blocks of pipeline stage `stage` when `depth` blocks are balanced over `pp` stages.
int StageBlocks(int depth, int pp, int stage);

// A rank of pipeline stage `stage` with `micro_batches` micro-batches per step and replica.
MemoryEstimate PredictMemory(const DiTConfig& model, const Layout& layout, int stage,
                             int micro_batches);
// The same for a model of any family the planner covers: dit, latte, and unet (whose memory
// is its family's model: the arenas Model::Reserve allocates, model/unet/unet.h).
MemoryEstimate PredictMemory(const ModelSpec& model, const Layout& layout, int stage,
                             int micro_batches);

struct PlanRequest {
  ModelSpec model;  // the planner's cost model covers the dit, latte and unet families
  int global_batch = 256;
  int nodes = 1, devices_per_node = 1;
  DeviceSpec device;
  double usable_memory_fraction = 0.9;  // of device memory a plan may fill
  // Fixed choices (unset: the planner chooses).
  std::optional<int> tp, cp, pp, micro_batch;
  std::optional<bool> recompute, zero1;
  // Plan what train.device cuda trains: data-parallel layouts only (tp, cp and pp of 1, no
  // recomputation or ZeRO-1), each rank's memory as the family's GPU step allocates it
  // (ModelFamily::GpuStepBytes: bf16 activations, flash attention) where the build has one;
  // otherwise, and for every other layout, the CPU model's fp32 memory.
  bool gpu_step = false;
  bool fp8 = false;  // with gpu_step: train.precision fp8's memory (its FP8 layers' workspace)
};

struct PlannedLayout {
  Layout layout;
  int accumulation = 1;   // micro-batches per step and replica
  int worst_stage = 0;    // the stage whose ranks need the most memory
  MemoryEstimate memory;  // of that stage's ranks
  TimeEstimate time;
  bool fits = false;
};

// Every valid layout of the request, fitting or not, in no particular order. Fails when the
// request itself is impossible (a fixed size that cannot divide, a batch no layout splits).
Result<std::vector<PlannedLayout>> EnumerateLayouts(const PlanRequest& request);

// The layouts that fit, fastest first (ties: less memory). Fails, naming what is wrong and
// what the closest layout would need, when none fits.
Result<std::vector<PlannedLayout>> PlanLayouts(const PlanRequest& request);

std::string DescribeLayout(const Layout& layout);

// The CPU peak `parallel: auto` assumes: the layout must not depend on a measurement that
// differs between the machines that resolve the same job (the controller, `validate`).
inline constexpr double kNominalCpuPeakFlops = 100e9;

// The device a job's ranks compute on, as `parallel: auto` plans for it: a GPU (its name picks
// the preset: H200, H100, H20, A100) with its memory, or the CPU (the node's memory shared by
// its ranks, the nominal peak above).
struct PlanDevice {
  std::string gpu;          // the GPU's name as the driver reports it; empty: the CPU
  double memory_bytes = 0;  // of one GPU, or of the node's host memory
  bool operator==(const PlanDevice&) const = default;
};
// This machine's device: its first GPU if it has one, else its CPU.
PlanDevice LocalPlanDevice();
std::string DescribePlanDevice(const PlanDevice& device);

// `parallel: auto`: the fastest layout that fits for a job of `model` and `global_batch`
// (and `micro_batch` when the job fixes it) on `nodes` × `devices_per_node` of `device`.
// With data_parallel_only, what the GPU step trains (PlanRequest::gpu_step): only layouts
// without tp, cp, pp, ZeRO-1 and recompute, with the GPU step's memory (fp8: in FP8).
Result<PlannedLayout> ChooseLayout(const ModelSpec& model, int global_batch,
                                   std::optional<int> micro_batch, int nodes, int devices_per_node,
                                   const PlanDevice& device, bool data_parallel_only = false,
                                   bool fp8 = false);

}  // namespace difftrain
