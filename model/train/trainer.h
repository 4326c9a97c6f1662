// One training process's model, optimizer and data position: the diffusion training step of
// a model of any family (model/family/family.h), alone or as one rank of a tensor × context ×
// data × pipeline parallel layout.
//
// With job.lora the trained parameters are the LoRA adapters of the model's target modules
// (model/train/lora_adapters.h), the rest of the model frozen: the optimizer, the gradient norm
// and clipping, the EMA and the gradient average work on the adapters' arena (the "trained
// arena"), the model computing with W0 + s·B·A after every update. With job.textual_inversion
// the trained arena is a new token's embedding (model/train/textual_inversion.h); with
// lora.train_text_encoder the adapters of the text encoder's modules follow the model's in the
// LoRA arena (model/train/text_encoder_lora.h). Either way each micro-batch's texts are encoded
// by the text encoder before the model's forward, and the gradient of the model's context flows
// back through the encoder after its backward (model/train/text_training.h).
//
// Every random draw is addressed by the global index n of the training sample: sample n's
// image comes from the data loader (a permutation per epoch, from the seed), and its
// timestep, label dropout, text dropout and noise from Rng(seed, kNoise, n); a text-conditional
// model's text embedding from the data (after dropout), or where the data carry no texts a
// synthetic one from Rng(seed, kText, n). Step s consumes samples
// [s·G, (s+1)·G) for global batch G; data-parallel rank r takes the r-th contiguous slice
// of them. So the whole training state is the arenas plus (step, samples seen), resuming
// continues bit for bit, and the ranks together compute what one process would.
//
// A step runs the micro-batches of this rank's share through the 1F1B pipeline schedule
// (one stage: forward, backward, forward, …). Every tp, cp and pp rank of one data-parallel
// replica builds the same micro-batches; the last stage computes the loss over the whole
// sequence. Gradients are averaged over the dp-cp group (each cp rank's are partial sums
// over its tokens, so its loss gradient is scaled by cp); tensor-parallel ranks compute
// identical gradients for the replicated weights (model/dit/shard.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/topology.h"
#include "job/job_spec.h"
#include "model/data/dataset.h"
#include "model/data/loader.h"
#include "model/diffusion/gaussian_diffusion.h"
#include "model/family/family.h"
#include "model/io/safetensors.h"
#include "model/parallel/grad_sync.h"
#include "model/parallel/pipeline.h"
#include "model/tensor/buffer.h"
#include "model/train/batch_ahead.h"
#include "model/train/gpu_step.h"
#include "model/train/lora_adapters.h"
#include "model/train/text_encoder_lora.h"
#include "model/train/text_training.h"
#include "model/train/textual_inversion.h"

namespace difftrain {

// The inputs of a micro-batch as the model sees them.
struct MicroBatch {
  int size = 0;
  // Each sample's size, height × width (of a latent); a bucketed dataset's batches differ.
  SampleSize sample_size;
  std::vector<float> x0, noise, x_t;  // [B, ...the family's sample shape]
  // diffusion.input_perturbation's term: x_t is q_sample of noise + perturbation, the target
  // the noise's. [B, …] like noise; empty without it.
  std::vector<float> perturbation;
  std::vector<int64_t> t;      // timesteps
  std::vector<float> t_float;  // the same, as the model's input
  std::vector<int32_t> y;      // labels after dropout (num_classes = null class)
  std::vector<float> context;  // text embeddings [B, L, D] after dropout; text models
  // Textual inversion, a LoRA of the text encoder: each sample's text as tokens, which the
  // trainer encodes into context (unless the sample's text is dropped: text_dropped[b], its
  // context zero).
  std::vector<text::Tokens> texts;
  std::vector<uint8_t> text_dropped;
  // SDXL's micro-conditioning (SampleSchema::pooled_text_dim > 0): the texts' pooled
  // embeddings [B, P] after dropout and the time ids [B, 6]; empty otherwise.
  std::vector<float> pooled_text, time_ids;
  // Each sample's weight in the loss besides the diffusion's (data.prior_path: 2 for the data's
  // half, 2 · prior_loss_weight for the prior's, so that the loss is the data's mean plus
  // prior_loss_weight times the prior's); empty: 1 each.
  std::vector<double> sample_weights;

  ModelInputs inputs() const {
    ModelInputs in{x_t.data(), t_float.data(), y.data(),
                   context.empty() ? nullptr : context.data()};
    if (!pooled_text.empty()) {
      in.pooled_text = pooled_text.data();
      in.time_ids = time_ids.data();
    }
    return in;
  }
};

// Bytes of the arenas this rank allocates.
struct MemoryBytes {
  size_t parameters = 0;  // trainable parameters and the fixed position embedding
  size_t gradients = 0;
  size_t optimizer = 0;  // the AdamW moments this rank owns
  size_t ema = 0;
  size_t activations = 0;  // every activation slot and the backward scratch
  // The text encoder a run trains through (textual inversion, lora.train_text_encoder): its
  // weights, its adapters' state and activations (TextEncoderMemory).
  size_t text_encoder = 0;
  size_t total() const {
    return parameters + gradients + optimizer + ema + activations + text_encoder;
  }
};

// The text encoder a run trains through, as a plan counts it (Trainer::TrainedTextEncoder).
struct TrainedEncoder {
  std::string path;
  TextEncoderConfig config;
  int skip_layers = 0;  // the data's text table's clip skip (0 where the data are not readable)
};

// The arenas a rank of pipeline stage `stage` (tp and cp rank 0) of `layout` allocates:
// micro-batches of `micro_batch`, `micro_batches` of them per step and replica (the pipeline
// keeps min(pp − stage, that) in flight), AdamW moments sharded over a dp-cp group of `dp_cp`
// ranks with ZeRO-1 (rank 0's share, the largest), gradient buckets of `bucket_elements`,
// activations recomputed or not.
// With `lora`, a LoRA run's: the adapters' moments and EMA instead of the model's, the adapters
// and the frozen copy of their weights beside the model's parameters and gradients. With
// `inversion`, a textual inversion's: the vectors' gradients, moments and EMA instead of the
// model's. With `encoder`, the text encoder either trains through (MemoryBytes::text_encoder;
// without it, not counted).
Result<MemoryBytes> PlanMemory(const ModelSpec& model, const LayoutShape& layout, int stage,
                               int micro_batch, int micro_batches, bool zero1, int dp_cp,
                               size_t bucket_elements, bool recompute, const LoraConfig& lora = {},
                               const TextualInversionConfig& inversion = {},
                               const TrainedEncoder* encoder = nullptr);

// What a rank allocates beside its arenas while it writes a checkpoint, until it is written
// (Trainer::AddToCheckpoint, ReleaseCheckpoint): with ZeRO-1 (`zero1`: on the CPU) the whole
// moments of its shard, which it assembles; rank 0 (`writer`) under tp or pp one whole-model
// arena, which it gathers the parameters, EMA and two moments into in turn, and the largest
// peer's shard, which it receives them through; a LoRA's rank 0 its adapted weights with the EMA's
// adapters fused. A textual inversion writes from its arenas. The rank is (`tp`, `stage`) of
// `layout`.
Result<size_t> PlanCheckpointMemory(const ModelSpec& model, const LayoutShape& layout, int tp,
                                    int stage, bool writer, bool zero1, const LoraConfig& lora = {},
                                    const TextualInversionConfig& inversion = {});

// The model a checkpoint's shard 0 (or a debug dump) holds: its family (metadata "family";
// checkpoints written before model families existed hold a DiT) and its config.
Result<ModelSpec> CheckpointModel(const io::SafetensorsFile& shard0);
// The whole model's parameters (`ema`: the EMA, `ema.`-prefixed) from shard 0 into an arena
// laid out by `global` (the reference names).
Status ReadModelArena(const io::SafetensorsFile& shard0, const TensorTable& global, bool ema,
                      float* out);
// This rank's share of the same: every fragment (a shard's piece of the whole-model arena,
// model/family/model.h) copied from its tensor in the file, whose every tensor is checked.
Status ReadModelFragments(const io::SafetensorsFile& shard0, const TensorTable& global,
                          const std::vector<Fragment>& fragments, bool ema, float* local);

struct StepStats {
  int64_t step = 0;  // optimizer steps done after this one
  double loss = 0;   // mean over the global batch
  double grad_norm = 0;
  double lr = 0;
  double comm_wait_seconds = 0;  // waiting for gradient reduction after backward
  // Waiting for input: on the CPU for the data loader's reads; on a GPU for the micro-batches
  // (made ahead while the GPU computes, so only what making one takes beyond computing one).
  double data_wait_seconds = 0;
  // Training FLOPs of one of the step's samples: the model's, or with aspect-ratio buckets those
  // of the step's size, `sample_size` (0 × 0 where the data have one size).
  double flops_per_sample = 0;
  SampleSize sample_size;
  // Passes over the data after this step: the data's samples trained on (half the step's with
  // data.prior_path) over the samples of an epoch; 0 for data without epochs (synthetic data
  // without data.max_samples).
  double epoch = 0;
};

// A rank's place in the parallel layout and its communicators; a null communicator is a
// group of one. Without a topology the trainer is one process.
struct ParallelOptions {
  std::optional<Topology> topology;
  int rank = 0;                     // global rank
  parallel::Comm* tp = nullptr;     // tensor parallel: the weight shards of each block
  parallel::Comm* cp = nullptr;     // context parallel: the token shards
  parallel::Comm* pp = nullptr;     // pipeline: the stages
  parallel::Comm* dp_cp = nullptr;  // gradient averaging and ZeRO-1 sharding
  parallel::Comm* world = nullptr;  // loss, gradient norm and checkpoint gathering
  std::vector<int> stage_blocks;    // blocks per pipeline stage (empty: balanced)
  bool zero1 = false;
  bool overlap = true;  // start a bucket's reduction as soon as its gradients are final
  size_t bucket_elements = size_t{1} << 20;
  // The layout's shape (tp, cp, pp, stage_blocks); one process without a topology.
  LayoutShape layout() const;
};

// What a rank's host arenas take by PlanMemory (what the trainer allocates; the text encoder a
// run trains through where its files can be read), as the trainer's out-of-memory error names
// it: "1.23 GiB of host memory (parameters 0.01, … activations 1.16 GiB)".
std::string DescribeHostArenas(const TrainConfig& config, const ParallelOptions& parallel);

// With train.device cuda the model computes on a GPU (`gpu`, model/train/gpu_step.h): the
// micro-batches are made here as on the CPU, each while the GPU computes the one before it (on a
// helper thread, model/train/batch_ahead.h), the gradients are averaged over dp_cp (an NCCL
// communicator the GpuStep joined), and the host arenas are the checkpoint's copy of the
// device's, refreshed when a checkpoint is written and uploaded after a restore. Only the
// data-parallel layout runs there (TrainConfig::Validate).
// Whether the samples of `data` (of the kind `kind`, for the messages) fit the model of schema
// `m`: their shape and classes, their texts' length and width, and SDXL's pooled embeddings.
Status CheckDataFitsModel(const Dataset& data, const SampleSchema& m, const std::string& kind);
// A bucketed dataset (aspect-ratio buckets, docs/data.md) trains on the CPU a model that takes
// each bucket's size (ModelFamily::Resized), and one of its buckets must fill a global batch.
Status CheckBucketsFitTraining(const Dataset& data, const TrainConfig& config,
                               const std::string& kind, bool announce = true);

class Trainer : private parallel::PipelineStage {
 public:
  // Checks the layout against the model and opens the dataset of config.data, checking that
  // its samples fit the model. With train.device cuda and no `gpu`, takes GPU 0.
  static Result<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                 const ParallelOptions& parallel = {},
                                                 std::unique_ptr<GpuStep> gpu = nullptr);
  // Initialises the model as the reference does, from config.seed; `data` must fit the model;
  // `gpu` is given exactly when config.device is cuda; `prior` exactly when
  // config.data.prior_path is set (the samples of the folder it names, which Create opens and
  // checks: they must fit the model as `data` does, and neither be bucketed).
  // With job.textual_inversion or lora.train_text_encoder, `texts` is the text encoder it trains
  // through (OpenTextTraining's); null: made here.
  Trainer(const TrainConfig& config, std::unique_ptr<Dataset> data,
          const ParallelOptions& parallel = {}, std::unique_ptr<GpuStep> gpu = nullptr,
          std::unique_ptr<Dataset> prior = nullptr, std::unique_ptr<TextTraining> texts = nullptr);
  ~Trainer() override;

  // Builds the micro-batch of global samples [first, first + B). With a prior (data.prior_path)
  // B and first are even: samples [first/2, first/2 + B/2) of the data, then the same of the
  // prior's, each drawn by its own loader.
  Status MakeMicroBatch(int64_t first, int B, MicroBatch& batch);
  // One process on the CPU: forward, loss and backward of one micro-batch; gradients
  // accumulate, scaled by grad_scale. Returns the (unscaled) loss.
  double ForwardBackward(const MicroBatch& batch, float grad_scale);
  // One optimizer step over this rank's share of the next global batch.
  Result<StepStats> Step();
  // One optimizer step on exactly this batch, in one process on the CPU (no accumulation, no
  // data parallelism), e.g. to overfit it.
  StepStats StepOn(const MicroBatch& batch);

  // This rank's checkpoint shard; every rank calls it (it gathers). Rank 0 writes the whole
  // model (reference names, pos_embed included), the EMA (`ema.` prefix) and the AdamW
  // moments of the whole arena (`optim.exp_avg`, `optim.exp_avg_sq`, their ranges of the
  // whole-model arena in the metadata), assembled from the shards of every tp rank and
  // pipeline stage (and every ZeRO-1 piece); the other ranks write metadata only. So a
  // checkpoint of one layout loads into any other. Pointers stay valid while the Trainer
  // lives and does not step, until ReleaseCheckpoint. Under tp or pp, rank 0's shard gathers
  // each arena as it is written (SafetensorsWriter::AddFill): write it once, before
  // ReleaseCheckpoint, while the other ranks are in AddToCheckpoint sending theirs.
  Status AddToCheckpoint(io::SafetensorsWriter& shard);
  // Frees what AddToCheckpoint gathered or made for the shard (rank 0's whole-model buffer under
  // tp or pp, a ZeRO-1 rank's whole moments, a LoRA's fused EMA weights), once it is written:
  // a rank holds them only while it checkpoints.
  void ReleaseCheckpoint();
  // The bytes AddToCheckpoint made and ReleaseCheckpoint frees (0 between checkpoints).
  size_t checkpoint_bytes() const;
  // The most checkpoint_bytes() has been when ReleaseCheckpoint freed them (0 before the first
  // checkpoint): what writing a checkpoint takes beside the arenas (PlanCheckpointMemory).
  size_t checkpoint_peak_bytes() const { return checkpoint_peak_bytes_; }
  // Restores this rank's shard of model and EMA, counters and the data position from
  // shard 0 of a checkpoint.
  Status RestoreModel(const io::SafetensorsFile& shard0);
  // Copies the moments of every owned element that `shard` holds (ranges of the whole-model
  // arena); returns the elements copied.
  Result<size_t> RestoreOptimizer(const io::SafetensorsFile& shard);
  // Starts the run from the weights of `file` instead of the seed's (checkpoint.init_from,
  // model/train/initial_weights.h): this rank's shard of them and of the EMA; the step, the
  // data position and the moments stay at their start. Returns the file's tensors the model
  // did not take, for a warning.
  Result<std::vector<std::string>> InitializeFrom(const io::SafetensorsFile& file);
  // Elements of AdamW moments this rank holds (its owned ranges).
  size_t optimizer_elements() const { return owned_elements_; }
  // Draws every parameter at random (Model::InitializeRandom), a LoRA's B as well
  // (LoraAdapters::InitializeRandom): a debug dump's weights, whose gradients vanish nowhere.
  void InitializeRandom(uint64_t seed);
  // The LoRA adapters the run trains; null when it trains the whole model.
  const LoraAdapters* lora() const { return lora_.get(); }
  LoraAdapters* lora() { return lora_.get(); }
  // The token textual inversion trains; null otherwise.
  const TextualInversion* textual_inversion() const { return inversion_; }
  // The text encoder a LoRA run adapts too (lora.train_text_encoder); null otherwise.
  const TextEncoderLora* text_encoder_lora() const { return text_lora_; }
  // The text encoder the run trains through: job.textual_inversion's token and encoder, or
  // lora.train_text_encoder's encoder; null for neither. The encoder is the job's setting's, else
  // the one the data's text table records, checked against the model and the data (a textual
  // inversion's captions must name the token, unless templates make the texts).
  // The text encoder `config` trains through (textual_inversion.text_encoder,
  // lora.text_encoder, else the one the data's text table records) with its config, where it is
  // readable here; nullopt with `why` (when given) saying why not: the run trains through none,
  // or its files are not readable here.
  static std::optional<TrainedEncoder> TrainedTextEncoder(const TrainConfig& config,
                                                          std::string* why = nullptr);
  static Result<std::unique_ptr<TextTraining>> OpenTextTraining(const TrainConfig& config,
                                                                const Dataset& data);

  // The GPU the model computes on; null on the CPU.
  const GpuStep* gpu() const { return gpu_.get(); }
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  const SampleSchema& schema() const { return schema_; }
  // The EMA of the trained arena: the model's parameters, or with LoRA the adapters'.
  const float* ema() const { return ema_.data(); }
  const float* last_output() const { return last_output_; }
  const TrainConfig& config() const { return config_; }
  int dp_rank() const { return coords_.dp; }
  int dp_size() const { return parallel_.topology ? parallel_.topology->dp() : 1; }
  MemoryBytes memory() const;
  // train.epochs: sets config.steps to ceil(epochs × S / G), S the samples of an epoch of
  // config.data (its size after data.max_samples; of aspect-ratio buckets, the whole global
  // batches they fill) and G the data's samples a step (batch.global, half of it with
  // data.prior_path), and config.epoch_samples to S. Opens and checks the data as Create does, and
  // fails as it would. A no-op where the job gives train.steps or its epochs are resolved.
  static Status ResolveEpochs(TrainConfig& config);

  int64_t step() const { return step_; }
  int64_t samples_seen() const { return samples_seen_; }
  // StepStats::epoch after the steps done.
  double epochs_seen() const;
  // On a GPU: the micro-batches that were made ahead, while the GPU computed the one before.
  int64_t micro_batches_made_ahead() const { return ahead_ ? ahead_->taken_ahead() : 0; }

 private:
  // MakeMicroBatch without the bookkeeping: adds the seconds spent reading data to
  // *loader_seconds. Changes nothing of the trainer's, so a helper thread may call it while a
  // GPU step runs.
  Status FillMicroBatch(int64_t first, int B, MicroBatch& batch, double* loader_seconds);
  // config.data, cut by data.max_samples, and data.prior_path's folder (null without one),
  // each checked against the model of schema `m` (model/train/trainer_data.cc).
  // `announce`: log what was opened (how much of the data, the prior, the buckets).
  static Result<std::pair<std::unique_ptr<Dataset>, std::unique_ptr<Dataset>>> OpenData(
      const TrainConfig& config, const SampleSchema& m, bool announce = true);
  // The data loader's options for this rank; the prior's, which draws its own permutations
  // (a seed of its own, from the job's).
  static DataLoaderOptions LoaderOptions(const TrainConfig& config, int dp_rank, int dp_size);
  static DataLoaderOptions PriorLoaderOptions(const TrainConfig& config, int dp_rank, int dp_size);
  // Zeroes the model's gradients before a step: the ranges `zeroed_` (and a textual inversion's).
  void ZeroModelGradients();
  // Training through the text encoder (texts_): micro-batch `slot`'s texts encoded into
  // batch.context before the model's forward; after its backward, the context's gradient through
  // the encoder. No-ops otherwise.
  Status EncodeTexts(int slot, MicroBatch& batch);
  Status BackwardWithTexts(int slot, const float* output_grad, float* input_grad,
                           const Model::GradientsReady& ready);
  // Clips, updates the owned parameters with AdamW, gathers them (ZeRO-1), updates the
  // EMA and advances the counters.
  Result<StepStats> ApplyUpdate(double loss, int64_t samples);
  // Step on the GPU: the micro-batches one after the other, the gradient all-reduce, the
  // update.
  Result<StepStats> StepOnGpu();
  const std::vector<parallel::Range>& owned() const;
  // Training FLOPs of a sample of height × width (the model at that size), computed once a size.
  double FlopsPerSample(SampleSize size);
  // Starts reading the micro-batches of samples [first, first + count) in the background.
  void Prefetch(int64_t first, int count);
  // Floats of one sample of `batch`, and of the model's output for one.
  size_t SampleElements(const MicroBatch& batch) const;
  size_t OutputElements(const MicroBatch& batch) const;
  // Sizes the model's activations for `batch` (its sample size and micro-batch).
  void ReserveFor(const MicroBatch& batch);
  // The regression target of `batch`: its noise, or v (diffusion.prediction).
  const float* Target(const MicroBatch& batch) const;
  // The loss of `output` for `batch` and its gradient (scaled) into dout.
  double Loss(const float* output, const MicroBatch& batch, float grad_scale, float* dout) const;
  // The pipeline stage of a step: micro-batch i of this rank's share, in slot i % slots.
  size_t boundary_elements() const override { return model_->boundary_elements(); }
  Status Forward(int micro, const float* input, float* output) override;
  Status Backward(int micro, const float* output_grad, float* input_grad) override;
  // Rank 0: one whole-model arena of the checkpoint (parameters, EMA or a moment) into `whole`,
  // its own shard `mine` and every other member's of its replica, which they send in turn.
  Status GatherArena(const float* mine, float* whole);
  // The whole model and its EMA (saved_view_[0], saved_view_[1]) and the fixed tensors, under
  // the reference names; the EMA of a tensor at an offset `ema_at` holds from there instead.
  // With `gather`, the shard calls it for arena 0 (the parameters) and 1 (the EMA) as it
  // reaches them (SafetensorsWriter::AddFill).
  void AddSavedModel(io::SafetensorsWriter& shard,
                     const std::unordered_map<size_t, const float*>& ema_at = {},
                     const std::function<Status(int arena)>& gather = {}) const;
  // A LoRA run's checkpoint (rank 0; one replica holds everything): the model and its EMA with
  // their adapters fused, the frozen target weights, the adapters, their EMA and moments.
  void AddLoraToCheckpoint(io::SafetensorsWriter& shard);
  // Any other run's: the model's, EMA's and moments' whole arenas (rank 0), their ranges.
  Status AddModelToCheckpoint(io::SafetensorsWriter& shard, nlohmann::json& ranges);
  Status RestoreLora(const io::SafetensorsFile& shard);
  // A textual inversion's checkpoint (rank 0): the frozen model, the vectors, their EMA and
  // moments; and its restore.
  void AddTextualInversionToCheckpoint(io::SafetensorsWriter& shard);
  Status RestoreTextualInversion(const io::SafetensorsFile& shard);
  // The trained arena: the model's parameters and gradients, the LoRA adapters', or a textual
  // inversion's vectors.
  float* trained_params() {
    return lora_ ? lora_->params() : inversion_ ? inversion_->params() : model_->params();
  }
  const float* trained_grads() const {
    return lora_ ? lora_->grads() : inversion_ ? inversion_->grads() : model_->grads();
  }
  size_t trained_elements() const {
    return lora_ ? lora_->size() : inversion_ ? inversion_->size() : model_->num_params();
  }
  // Whether the trained arena is apart from the model's (LoRA, textual inversion): one
  // replicated arena, averaged in one all-reduce.
  bool trains_apart() const { return lora_ || inversion_; }

  TrainConfig config_;
  ParallelOptions parallel_;
  ParallelCoordinates coords_;
  std::unique_ptr<Dataset> data_;
  DataLoader loader_;
  // data.prior_path's samples and their loader (its own permutations); null without a prior.
  std::unique_ptr<Dataset> prior_data_;
  std::unique_ptr<DataLoader> prior_loader_;
  SampleSchema schema_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<LoraAdapters> lora_;  // job.lora's adapters; null: the whole model trains
  // The text encoder the run trains through (textual inversion, a LoRA of the encoder), or null;
  // inversion_ and text_lora_ are it as what it is.
  std::unique_ptr<TextTraining> texts_;
  TextualInversion* inversion_ = nullptr;
  TextEncoderLora* text_lora_ = nullptr;
  std::vector<std::vector<float>> dcontexts_;  // the context's gradients, one per slot
  // The text encoder's weights and gradients a LoRA adapts; null without lora.train_text_encoder.
  float* text_weights() { return text_lora_ ? text_lora_->weights() : nullptr; }
  const float* text_grads() const { return text_lora_ ? text_lora_->grads() : nullptr; }
  GaussianDiffusion diffusion_;
  std::unique_ptr<parallel::GradientSync> sync_;
  std::vector<parallel::Range> whole_;  // [0, n) of the trained arena: what one process owns
  // The model's gradients each step zeroes (ZeroModelGradients): all, or a LoRA run's targets'
  // and vectors (the rest of the arena is never written).
  std::vector<parallel::Range> zeroed_;
  size_t owned_elements_ = 0;
  // Owned ranges this rank adds to the squared gradient norm: tensor-parallel replicas
  // count once, on tp rank 0.
  std::vector<parallel::Range> norm_ranges_;
  Buffer<float> ema_, exp_avg_, exp_avg_sq_;
  // Rank 0: parameters, EMA and moments of the whole model as the shard writes them: the arenas
  // themselves where this rank's are the whole model's (no copies of a model that may take most
  // of the machine's memory), else saved_[0], which each is gathered into in turn; a LoRA's
  // fused EMA weights in saved_[1].
  Buffer<float> saved_[2];
  const float* saved_view_[4] = {};
  Buffer<float> zero1_moments_[2];  // a ZeRO-1 rank's whole moments, for its checkpoint
  Buffer<float> peer_shard_;        // rank 0: one peer's arena at a time, as it gathers
  size_t checkpoint_peak_bytes_ = 0;
  int slots_ = 1;  // micro-batches in flight on this stage
  std::vector<MicroBatch> batches_;
  std::vector<std::vector<float>> douts_;
  mutable std::vector<float> target_;                       // Target()'s v
  std::map<std::pair<int, int>, double> flops_per_sample_;  // FlopsPerSample's, by size
  const float* last_output_ = nullptr;
  // The step in progress: its first sample, micro-batches, loss gradient scale and loss.
  int64_t step_first_ = 0;
  int micro_batches_ = 1;
  float grad_scale_ = 1;
  double step_loss_ = 0;
  double data_wait_seconds_ = 0;  // of the step in progress
  int64_t step_ = 0;
  int64_t samples_seen_ = 0;
  std::unique_ptr<GpuStep> gpu_;
  bool gpu_stale_ = false;  // the host arenas were restored and are newer than the GPU's
  // The GPU step's micro-batches, the next made while the GPU computes. Last: its helper thread
  // uses the members above and ends first.
  std::unique_ptr<BatchAhead<MicroBatch>> ahead_;
};

}  // namespace difftrain
