#include "controller/plan.h"

#include <algorithm>
#include <filesystem>

#include <fmt/ranges.h>

#include "model/family/family.h"
#include "model/train/trainer.h"

namespace difftrain::controller {

namespace {

// The run's length: its steps, and where the file gives train.epochs, what they came from.
std::string DescribeSteps(const TrainConfig& config) {
  if (config.epochs < 1) return fmt::format("{} steps", config.steps);
  if (config.steps < 1) {
    return fmt::format(
        "train.epochs {}: the data is not readable here, so each rank resolves the steps from "
        "it",
        config.epochs);
  }
  return fmt::format("{} steps (train.epochs {}: {} samples an epoch, {} of the data a step)",
                     config.steps, config.epochs, config.epoch_samples,
                     config.data.has_prior() ? config.global_batch / 2 : config.global_batch);
}

// Whether each rank assembles its shard's whole moments to checkpoint them (ZeRO-1 on the CPU,
// of a whole model's training).
bool CheckpointsZero1(const TrainConfig& config) {
  return config.parallel.zero1 && config.device == "cpu" && !config.lora.enabled() &&
         !config.textual_inversion.enabled();
}

// What the checkpoint buffers of PlanCheckpointMemory hold, for `validate`.
std::string CheckpointBuffers(const TrainConfig& config, const JobPlan& p) {
  std::vector<std::string> parts;
  if (config.lora.enabled()) {
    parts.push_back("rank 0 fuses the EMA's adapters into a copy of the adapted weights");
  } else if (p.tp > 1 || p.pp > 1) {
    parts.push_back(
        "rank 0 gathers the whole model's parameters, EMA and AdamW moments one at a time");
  }
  if (CheckpointsZero1(config)) parts.push_back("each rank its shard's whole AdamW moments");
  return fmt::format("{}; freed once it is written", fmt::join(parts, "; "));
}

}  // namespace

Result<JobPlan> MakePlan(const TrainConfig& config) {
  const ClusterConfig& c = config.cluster;
  JobPlan p;
  p.nodes = c.nodes;
  p.devices_per_node = c.devices_per_node;
  p.world = c.world_size();
  const ParallelConfig& pc = config.parallel;
  p.tp = pc.tp;
  p.cp = pc.cp;
  p.pp = pc.pp;
  const int model_parallel = p.tp * p.cp * p.pp;
  if (Result<int> dp = config.DataParallelSize(p.world); dp.ok()) {
    p.dp = *dp;
  } else {
    return Errorf(
        "{}: cluster.devices_per_node: expected nodes x devices_per_node = tp x cp x dp x pp "
        "= {} x {} x {} x {}, found {} x {} = {} ranks",
        c.Where("cluster.devices_per_node"), p.tp, p.cp, pc.dp > 0 ? std::to_string(pc.dp) : "dp",
        p.pp, p.nodes, p.devices_per_node, p.world);
  }
  if (p.devices_per_node % p.tp != 0) {
    return Errorf(
        "{}: cluster.devices_per_node: expected a multiple of parallel.tp = {} (tensor-parallel "
        "groups stay inside a node), found {}",
        c.Where("cluster.devices_per_node"), p.tp, p.devices_per_node);
  }
  const ModelFamily& family = FamilyOf(config.model);
  const LayoutShape layout{p.tp, p.cp, p.pp, pc.stage_blocks};
  if (Status s = family.ValidateLayout(config.model, layout); !s.ok()) {
    // A message about a model field ("model.num_heads: …") points at it in the file.
    const std::string& m = s.message();
    const size_t colon = m.find(':');
    if (m.starts_with("model.") && colon != std::string::npos &&
        c.where.contains(m.substr(0, colon))) {
      return Errorf("{}: {}", c.Where(m.substr(0, colon)), m);
    }
    return s.WithContext("parallel");
  }
  p.cp_inside_node = p.devices_per_node % (p.tp * p.cp) == 0;
  if (Status s = config.Validate(p.dp); !s.ok()) {
    return s.WithContext(fmt::format("with data-parallel size {} (world {} / tp·cp·pp {})", p.dp,
                                     p.world, model_parallel));
  }
  p.accumulation = config.AccumulationSteps(p.dp);
  for (int node = 0; node < p.nodes; ++node) {
    std::vector<int> ranks(p.devices_per_node);
    for (int j = 0; j < p.devices_per_node; ++j)
      ranks[j] = node * p.devices_per_node + j;
    p.node_ranks.push_back(std::move(ranks));
  }
  // fp32 parameters, gradients and EMA split over tp·pp; the two AdamW moments also over
  // dp with ZeRO-1. Activations: one micro-batch on the first pipeline stage.
  const ModelCost cost = family.Cost(config.model);
  p.parameters = cost.parameters;
  const double trainable = static_cast<double>(cost.trainable);
  const double moments = 2 * trainable / (config.parallel.zero1 ? p.dp : 1);
  p.state_bytes_per_rank = static_cast<int64_t>(
      4 * ((3 * trainable + (p.parameters - trainable) + moments) / (p.tp * p.pp)));
  if (config.lora.enabled()) {
    // The model's parameters; its gradients of the adapted weights and of its vectors (the
    // rest of its gradient arena is never touched); the adapters' parameters, gradients,
    // moments and EMA; the frozen copy of the adapted weights (tp = pp = 1).
    DT_ASSIGN_OR_RETURN(const ModelPartition whole, family.Partition(config.model, {}, 0, 0, 0));
    DT_ASSIGN_OR_RETURN(const LoraElements e,
                        CountLoraElements(config.lora, whole.parameters.table));
    p.state_bytes_per_rank = static_cast<int64_t>(
        4 * (p.parameters + 2 * double(e.frozen) + double(e.vectors) + 5 * double(e.adapters)));
  }
  if (config.textual_inversion.enabled()) {
    // The frozen model and its vectors' gradients; the trained vectors' parameters, gradients,
    // moments and EMA (the trainer's own arenas: PlanMemory; tp = pp = 1). The text encoder's
    // weights are not counted.
    DT_ASSIGN_OR_RETURN(const MemoryBytes m,
                        PlanMemory(config.model, layout, 0, config.micro_batch, p.accumulation,
                                   false, p.dp, config.parallel.bucket_elements(), config.recompute,
                                   {}, config.textual_inversion));
    p.state_bytes_per_rank = static_cast<int64_t>(m.parameters + m.gradients + m.optimizer + m.ema);
  }
  p.activation_bytes_per_rank = static_cast<int64_t>(family.ActivationBytes(
      config.model, layout, /*stage=*/0, config.micro_batch, 1, config.recompute));
  if (config.textual_inversion.enabled() ||
      (config.lora.enabled() && config.lora.train_text_encoder)) {
    const std::optional<TrainedEncoder> encoder =
        Trainer::TrainedTextEncoder(config, &p.text_encoder_not_counted);
    if (encoder) {
      DT_ASSIGN_OR_RETURN(
          const MemoryBytes m,
          PlanMemory(config.model, layout, 0, config.micro_batch, p.accumulation, false, p.dp,
                     config.parallel.bucket_elements(), config.recompute, config.lora,
                     config.textual_inversion, &*encoder));
      p.text_encoder_bytes_per_rank = static_cast<int64_t>(m.text_encoder);
      p.text_encoder = encoder->path;
    }
  }
  if (!config.checkpoint.dir.empty()) {
    const bool zero1 = CheckpointsZero1(config);
    DT_ASSIGN_OR_RETURN(const size_t rank0,
                        PlanCheckpointMemory(config.model, layout, 0, 0, /*writer=*/true, zero1,
                                             config.lora, config.textual_inversion));
    p.checkpoint_bytes_rank0 = static_cast<int64_t>(rank0);
    // Every other rank: its stage's and tp rank's share (the same for every cp and dp rank).
    for (int stage = 0; p.world > 1 && stage < p.pp; ++stage) {
      for (int tp = 0; tp < p.tp; ++tp) {
        DT_ASSIGN_OR_RETURN(const size_t other,
                            PlanCheckpointMemory(config.model, layout, tp, stage, false, zero1,
                                                 config.lora, config.textual_inversion));
        p.checkpoint_bytes_per_rank =
            std::max(p.checkpoint_bytes_per_rank, static_cast<int64_t>(other));
      }
    }
  }
  return p;
}

Status CheckNodeHostMemory(const TrainConfig& config, const JobPlan& plan, int slot,
                           const std::string& node, int64_t memory_bytes,
                           const std::string& limit) {
  if (config.device != "cpu" || memory_bytes <= 0) return Status::Ok();
  const ParallelConfig& pc = config.parallel;
  DT_ASSIGN_OR_RETURN(const Topology topology,
                      Topology::Create(plan.tp, plan.cp, plan.dp, plan.pp));
  const LayoutShape layout{plan.tp, plan.cp, plan.pp, pc.stage_blocks};
  const std::vector<int>& ranks = plan.node_ranks.at(slot);
  double need = 0, largest = 0;
  for (int rank : ranks) {
    DT_ASSIGN_OR_RETURN(
        const MemoryBytes m,
        PlanMemory(config.model, layout, topology.CoordinatesOf(rank).pp, config.micro_batch,
                   plan.accumulation, pc.zero1, plan.dp * plan.cp, pc.bucket_elements(),
                   config.recompute, config.lora, config.textual_inversion));
    // The text encoder a run trains through, where it was readable to the plan; what a
    // checkpoint allocates while it is written.
    size_t checkpoint = 0;
    if (!config.checkpoint.dir.empty()) {
      const ParallelCoordinates at = topology.CoordinatesOf(rank);
      DT_ASSIGN_OR_RETURN(checkpoint, PlanCheckpointMemory(config.model, layout, at.tp, at.pp,
                                                           rank == 0, CheckpointsZero1(config),
                                                           config.lora, config.textual_inversion));
    }
    const double bytes = double(m.total() + plan.text_encoder_bytes_per_rank + checkpoint);
    need += bytes;
    largest = std::max(largest, bytes);
  }
  if (need <= double(memory_bytes)) return Status::Ok();
  constexpr double kGiB = double(1ull << 30);
  return Errorf(
      "node {} cannot hold its {} rank(s) {}..{}: their parameters, gradients, optimizer state, "
      "EMA, activations and checkpoint buffers need {:.2f} GiB of host memory (up to {:.2f} GiB a "
      "rank at "
      "batch.micro {}), more than the node's {:.2f} GiB{}; lower batch.micro, set "
      "train.recompute: true, split the model over more ranks (tp, cp, pp) or give each node "
      "more memory (`difftrain plan --device cpu --memory-gib` predicts a rank's memory)",
      node, ranks.size(), ranks.front(), ranks.back(), need / kGiB, largest / kGiB,
      config.micro_batch, double(memory_bytes) / kGiB,
      limit.empty() ? std::string()
                    : fmt::format(" (the memory limit of its worker daemon's cgroup {})", limit));
}

nlohmann::json JobPlan::ToJson(const Topology& topology) const {
  nlohmann::json groups = nlohmann::json::object();
  for (std::string_view token : kParallelGroupTokens) {
    groups[std::string(token)] = *topology.GetRanks(token);
  }
  nlohmann::json j = {{"world", world},
                      {"nodes", nodes},
                      {"devices_per_node", devices_per_node},
                      {"tp", tp},
                      {"cp", cp},
                      {"dp", dp},
                      {"pp", pp},
                      {"accumulation_steps", accumulation},
                      {"placement", node_ranks},
                      {"groups", groups},
                      {"state_bytes_per_rank", state_bytes_per_rank},
                      {"activation_bytes_per_rank", activation_bytes_per_rank}};
  if (!text_encoder.empty()) j["text_encoder_bytes_per_rank"] = text_encoder_bytes_per_rank;
  j["checkpoint_bytes_rank0"] = checkpoint_bytes_rank0;
  j["checkpoint_bytes_per_rank"] = checkpoint_bytes_per_rank;
  return j;
}

std::string DescribePlan(const TrainConfig& config, const JobPlan& p) {
  const Topology topology = *Topology::Create(p.tp, p.cp, p.dp, p.pp);
  std::string out =
      fmt::format("world {} = {} node(s) x {} device(s); tp {} cp {} dp {} pp {} (order {})\n",
                  p.world, p.nodes, p.devices_per_node, p.tp, p.cp, p.dp, p.pp, topology.order());
  if (config.parallel.automatic) {
    out += fmt::format("parallel: auto chose tp {} cp {} pp {} dp {}{}{} (docs/bench.md)\n", p.tp,
                       p.cp, p.pp, p.dp, config.parallel.zero1 ? ", ZeRO-1" : "",
                       config.recompute ? ", activation recomputation" : "");
  }
  out += fmt::format("batch: global {} = micro {} x data-parallel {} x accumulation {}\n",
                     config.global_batch, config.micro_batch, p.dp, p.accumulation);
  out += fmt::format("model: {} ({} parameters), {}\n", config.model.name(), p.parameters,
                     DescribeSteps(config));
  if (const std::string& init = config.checkpoint.init_from; !init.empty()) {
    // LoadJob checked it wherever it is readable (job/load_job.cc).
    std::error_code ec;
    out += fmt::format(
        "initial weights: {} ({}; a checkpoint of checkpoint.dir is resumed "
        "instead)\n",
        init,
        std::filesystem::exists(init, ec)
            ? "its tensors match the model"
            : "not readable here: each rank checks it before training");
  }
  out += fmt::format("device: {}{}\n", config.device,
                     config.device_automatic ? " (train.device: auto, for this machine)" : "");
  out += fmt::format(
      "memory per rank (estimate): state {:.1f} MiB (parameters, gradients, EMA, AdamW{}) + "
      "activations {:.1f} MiB (micro-batch {})\n",
      p.state_bytes_per_rank / 1048576.0,
      config.lora.enabled()                ? "; EMA and AdamW of the LoRA adapters"
      : config.textual_inversion.enabled() ? "; EMA and AdamW of the textual inversion's vectors"
      : config.parallel.zero1              ? " sharded by ZeRO-1"
                                           : "",
      p.activation_bytes_per_rank / 1048576.0, config.micro_batch);
  if (!p.text_encoder.empty()) {
    out += fmt::format(
        "  + text encoder {:.1f} MiB ('{}': its weights{}, the activations of its passes)\n",
        p.text_encoder_bytes_per_rank / 1048576.0, p.text_encoder,
        config.textual_inversion.enabled() ? "" : ", its adapters' state");
  } else if (!p.text_encoder_not_counted.empty()) {
    out += fmt::format("  + text encoder: not counted ({})\n", p.text_encoder_not_counted);
  }
  if (p.checkpoint_bytes_rank0 > 0 || p.checkpoint_bytes_per_rank > 0) {
    out += fmt::format("  + while a checkpoint is written: rank 0 {:.1f} MiB{} ({})\n",
                       p.checkpoint_bytes_rank0 / 1048576.0,
                       p.world > 1 ? fmt::format(", any other rank up to {:.1f} MiB",
                                                 p.checkpoint_bytes_per_rank / 1048576.0)
                                   : "",
                       CheckpointBuffers(config, p));
  }
  out += "placement:\n";
  constexpr int kShownNodes = 16;
  for (int node = 0; node < p.nodes && node < kShownNodes; ++node) {
    out += fmt::format("  node {}: ranks {}\n", node, fmt::join(p.node_ranks[node], ","));
  }
  if (p.nodes > kShownNodes) out += fmt::format("  ... {} more nodes\n", p.nodes - kShownNodes);
  if (!p.cp_inside_node) out += "  note: context-parallel groups span nodes\n";
  out += "groups:\n";
  constexpr size_t kShownGroups = 8;
  for (std::string_view token : kParallelGroupTokens) {
    const RankGroups groups = *topology.GetRanks(token);
    std::string shown;
    for (size_t g = 0; g < groups.size() && g < kShownGroups; ++g) {
      shown += fmt::format("{}[{}]", g ? " " : "", fmt::join(groups[g], ","));
    }
    if (groups.size() > kShownGroups) shown += fmt::format(" ... ({} groups)", groups.size());
    out += fmt::format("  {:<6} {}\n", token, shown);
  }
  out += fmt::format(
      "restart: max_restarts {}, heartbeat every {} s, lost after {} misses, rendezvous timeout "
      "{} s\n",
      config.cluster.restart.max_restarts, config.cluster.restart.heartbeat_seconds,
      config.cluster.restart.heartbeat_misses, config.cluster.restart.rendezvous_timeout_seconds);
  return out;
}

}  // namespace difftrain::controller
