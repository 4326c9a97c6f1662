// The job: what one training run needs (model, data, diffusion, optimizer, batch arithmetic,
// run length, checkpointing) and where it runs (the cluster sections). Read from the YAML job
// file (docs/job-spec.md); every error names the field, the expected and the found value,
// with line and column.
//
// A job is parsed and resolved once, where it is launched: `parallel: auto` is turned into a
// layout for the cluster (ResolveJob), and the ranks receive the resolved job as a job file
// of their own (ResolvedJobYaml), whose layout is explicit, so no rank chooses one.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cluster_config.h"
#include "common/status.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/family/family.h"
#include "model/optim/adamw.h"
#include "model/train/lora_config.h"
#include "model/train/planner.h"
#include "model/train/textual_inversion_config.h"

namespace difftrain {

struct DataConfig {
  std::string kind = "synthetic";  // synthetic | fashion_mnist | latent_folder (docs/data.md)
  std::string path;                // fashion_mnist: IDX directory ("" = Debian's); latent_folder
  std::string split = "train";     // fashion_mnist: train | test
  bool shuffle = true;             // a new permutation every epoch, from the seed
  bool horizontal_flip = false;    // flip each sample with probability 1/2
  // DreamBooth's prior preservation (Ruiz et al. 2023; diffusers' --with_prior_preservation):
  // a latent folder of the class's own samples (the base model's, of the class prompt) that
  // makes the second half of every micro-batch, the loss the mean over the data's half plus
  // prior_loss_weight times the mean over the prior's. Empty: off.
  std::string prior_path;
  double prior_loss_weight = 1;
  bool has_prior() const { return !prior_path.empty(); }
  // Train on this many of the data's samples, a random subset from the seed (diffusers'
  // --max_train_samples); 0: all of them.
  int64_t max_samples = 0;
};

struct CheckpointConfig {
  std::string dir;    // empty: no checkpoints
  int64_t every = 0;  // steps between checkpoints (0: only at the end)
  int keep = 3;       // newest complete checkpoints kept
  // Weights a run starts from when dir holds no checkpoint of its own: a safetensors file, a
  // diffusers model folder or another run's checkpoint directory
  // (model/train/initial_weights.h). Empty: the seed's initialisation.
  std::string init_from;
};

struct ParallelConfig {
  // The layout: world = tp · cp · dp · pp ranks (docs/parallelism.md).
  int tp = 1;                     // tensor parallel: heads and MLP columns split
  int cp = 1;                     // context parallel: the token sequence split
  int pp = 1;                     // pipeline parallel: blocks split into stages
  int dp = 0;                     // data parallel; 0: the world divided by tp · cp · pp
  std::vector<int> stage_blocks;  // blocks per pipeline stage; empty: balanced
  bool zero1 = false;             // shard AdamW moments over the data-parallel group
  bool overlap = true;            // reduce gradient buckets while backward runs
  double bucket_mb = 4;           // gradient bucket size in MiB
  double timeout_seconds = 120;   // a collective or rendezvous that takes longer fails
  // The CPU communicators: gloo (TCP, every launch) or mpi (only when mpirun or
  // srun --mpi=pmix started the ranks; docs/jobs.md). A GPU job's data-parallel group is NCCL.
  std::string backend = "gloo";
  // `parallel: auto`: tp, cp, pp, dp, zero1 (and train.recompute, and batch.micro when the
  // file leaves it out) are chosen by the planner (model/train/planner.h) in ResolveJob.
  bool automatic = false;

  // A gradient bucket's fp32 elements.
  size_t bucket_elements() const {
    return static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float));
  }
};

struct TrainConfig {
  ModelSpec model;  // the model section, through its family (model/family/family.h)
  DataConfig data;
  DiffusionConfig diffusion;
  // DiT's objective for learn_sigma models: ε-MSE plus the variational bound that trains
  // the variance channels (model/diffusion/vb_loss.h). Off: ε-MSE alone.
  bool learn_sigma_loss = false;
  OptimizerConfig optimizer;
  // lora.rank > 0: the model's target modules train as low-rank adapters, every weight else
  // frozen (model/train/lora_adapters.h); the CPU, data and context parallel layouts.
  LoraConfig lora;
  // textual_inversion.token set: a new token's embedding trains, the model and the text encoder
  // frozen (model/train/textual_inversion.h); the Stable Diffusion 1.x/2.x UNet, on the CPU,
  // data parallel.
  TextualInversionConfig textual_inversion;
  int micro_batch = 8;
  int global_batch = 8;           // = micro_batch × data-parallel size × accumulation steps
  bool micro_batch_given = true;  // batch.micro was in the file (`parallel: auto` keeps it)
  // Optimizer steps of the run. With train.epochs in the file, 0 until ResolveEpochs
  // (model/train/trainer.h) sets it from the data, where the job is launched or, where the data
  // cannot be read there, on each rank.
  int64_t steps = 100;
  // train.epochs: passes over the data (0: train.steps given), and once resolved the samples of
  // one (the data's after data.max_samples; aspect-ratio buckets' whole global batches).
  int64_t epochs = 0;
  int64_t epoch_samples = 0;
  uint64_t seed = 0;
  int log_every = 10;
  std::string metrics_file;  // JSON lines of per-step metrics; "{rank}" becomes the rank
  // TensorBoard event files of rank 0's per-step scalars (worker/rank_reporter.h); "": none.
  std::string tensorboard_dir;
  bool recompute = false;  // keep only each block's input; recompute the rest in backward
  // cpu: the model core on the CPU. cuda: the family's bf16 GPU step (model/*/cuda) on this
  // rank's GPU, gradients averaged over NCCL; data-parallel layouts only (docs/cuda.md).
  // auto (a job file's default): cuda where the ranks' nodes have GPUs and this build has the
  // CUDA backend, else cpu — decided by ResolveJob, so ranks always receive cpu or cuda.
  std::string device = "cpu";
  bool device_automatic = false;  // device was auto: ResolveJob chose it (and may again)
  // bf16: the GPU step in bf16 mixed precision. fp8: its transformer blocks' Linear layers in FP8
  // (model/cuda/fp8.h; the families whose trains_fp8(), on train.device cuda, compute
  // capability 8.9 or later). The CPU trains in fp32 and takes bf16 only.
  std::string precision = "bf16";
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  ClusterConfig cluster;  // nodes, restart policy, metrics, keys: read by the daemons

  // The data-parallel size of a run on `world` ranks: parallel.dp, or derived when 0. Fails
  // when the world is not tp · cp · dp · pp.
  Result<int> DataParallelSize(int world) const;
  // Micro-batches per optimizer step on each of `dp` data-parallel ranks.
  int AccumulationSteps(int dp = 1) const { return global_batch / (micro_batch * dp); }
  // Every field and the batch arithmetic; the message shows the arithmetic when it fails.
  Status Validate(int dp = 1) const;
  nlohmann::json ToJson() const;
  // lora against the layout, the device and the model's modules.
  Status ValidateLora() const;
  // The first of `unsupported` (a setting, whether the job has it) that is set, refused as
  // "FIELD (its place in the file): TRAINS; not with SETTING", with a hint where train.device
  // auto chose the GPU.
  Status RefuseSettings(const std::string& field, const std::string& trains,
                        std::initializer_list<std::pair<const char*, bool>> unsupported) const;
  // textual_inversion against the model, the layout, the device and the other sections.
  Status ValidateTextualInversion() const;
  // data.prior_path and prior_loss_weight (Validate's).
  Status ValidatePrior() const;

  // Reads and checks a job file. A `parallel: auto` job comes back unresolved (automatic set,
  // the layout not chosen): see ResolveJob.
  static Result<TrainConfig> FromYamlFile(const std::string& path);
  // The same for the text of a job file (a resolved job received over MPI, a fuzzer's
  // input); errors name `source` (a path, or what the text came from) with the line and
  // column, as FromYamlFile's name the file.
  static Result<TrainConfig> FromYamlText(const std::string& text, const std::string& source);
};

// The launcher's view of the cluster, which knows the allocation better than the file:
// `difftrain validate/controller/run --nodes N --devices-per-node D`.
struct ClusterOverrides {
  std::optional<int> nodes, devices_per_node;
};

// Reads the job file at `path`, applies the launcher's overrides and resolves `parallel: auto`
// for that cluster; `yaml` receives the file's text. checkpoint.init_from is checked against
// the model where this machine can read it (job/load_job.cc). What `validate` prints and what the
// controller ships are both made from this.
Result<TrainConfig> LoadJob(const std::string& path, const ClusterOverrides& overrides = {},
                            std::string* yaml = nullptr);

// `parallel: auto`: the planner's layout for config.cluster of `device` (every other job
// passes unchanged). Errors name the place of `parallel` in the file.
Status ResolveJob(TrainConfig& config, const PlanDevice& device = LocalPlanDevice());

// The job file a rank receives: `original_yaml` with the resolved cluster size, layout,
// micro-batch and recomputation written in, every other field as the user wrote it.
Result<std::string> ResolvedJobYaml(const std::string& original_yaml, const TrainConfig& config);

}  // namespace difftrain
