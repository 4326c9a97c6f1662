#include "model/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "model/diffusion/vb_loss.h"
#include "model/optim/adamw.h"
#include "model/tensor/host_memory.h"
#include "model/tensor/rng.h"
#include "model/train/gpu_step.h"

namespace difftrain {

LayoutShape ParallelOptions::layout() const {
  if (!topology) return {};
  return {topology->tp(), topology->cp(), topology->pp(), stage_blocks};
}

namespace {

// This rank's shard of the model. The layout was validated by Create (or fails fast here).
std::unique_ptr<Model> CreateModel(const TrainConfig& config, const ParallelOptions& p) {
  const ParallelCoordinates c =
      p.topology ? p.topology->CoordinatesOf(p.rank) : ParallelCoordinates{};
  Result<std::unique_ptr<Model>> model =
      FamilyOf(config.model)
          .Create(config.model, p.layout(), c.tp, c.cp, c.pp, ModelComms{p.tp, p.cp});
  DT_CHECK(model.ok(), "{}", model.status().message());
  return std::move(model).value();
}

// The ranges common to two increasing lists of disjoint ranges.
std::vector<parallel::Range> Intersect(const std::vector<parallel::Range>& a,
                                       const std::vector<parallel::Range>& b) {
  std::vector<parallel::Range> out;
  for (const parallel::Range& x : a) {
    for (const parallel::Range& y : b) {
      const size_t begin = std::max(x.begin, y.begin), end = std::min(x.end, y.end);
      if (begin < end) out.push_back({begin, end});
    }
  }
  return out;
}

}  // namespace

Result<MemoryBytes> PlanMemory(const ModelSpec& model, const LayoutShape& layout, int stage,
                               int micro_batch, int micro_batches, bool zero1, int dp_cp,
                               size_t bucket_elements, bool recompute, const LoraConfig& lora,
                               const TextualInversionConfig& inversion,
                               const TrainedEncoder* encoder) {
  const ModelFamily& family = FamilyOf(model);
  DT_ASSIGN_OR_RETURN(const ModelPartition part, family.Partition(model, layout, 0, 0, stage));
  const size_t n = part.parameters.table.total();
  size_t owned = 0;
  for (const parallel::Range& r :
       parallel::GradientSync::OwnedRanges(n, bucket_elements, zero1, dp_cp, 0))
    owned += r.size();
  MemoryBytes m;
  m.parameters = (n + part.fixed_elements) * sizeof(float);
  m.gradients = n * sizeof(float);
  m.optimizer = 2 * owned * sizeof(float);
  m.ema = n * sizeof(float);
  if (lora.enabled()) {
    // The model's gradients of the targets and of its vectors (Trainer::zeroed_), and the
    // adapters'.
    DT_ASSIGN_OR_RETURN(const LoraElements e, CountLoraElements(lora, part.parameters.table));
    m.parameters += (e.adapters + e.frozen) * sizeof(float);
    m.gradients = (e.frozen + e.vectors + e.adapters) * sizeof(float);
    m.optimizer = 2 * e.adapters * sizeof(float);
    m.ema = e.adapters * sizeof(float);
  }
  if (inversion.enabled()) {
    // The model's vectors' gradients (Trainer::zeroed_) and the trained vectors'.
    const size_t trained = size_t(inversion.vectors) * family.Samples(model).context_dim;
    size_t vectors = 0;
    for (const TensorSpec& t : part.parameters.table.tensors())
      vectors += t.shape.size() < 2 ? t.numel : 0;
    m.parameters += trained * sizeof(float);
    m.gradients = (vectors + trained) * sizeof(float);
    m.optimizer = 2 * trained * sizeof(float);
    m.ema = trained * sizeof(float);
  }
  const int slots = parallel::InFlightMicroBatches(layout.pp, stage, micro_batches);
  m.activations = family.ActivationBytes(model, layout, stage, micro_batch, slots, recompute);
  if (encoder != nullptr && (inversion.enabled() || lora.train_text_encoder)) {
    DT_ASSIGN_OR_RETURN(
        const TextEncoderMemory text,
        PlanTextEncoderMemory(encoder->config, inversion.enabled() ? nullptr : &lora,
                              inversion.enabled() ? inversion.vectors : 0, micro_batch, slots,
                              family.Samples(model).context_length, encoder->skip_layers));
    m.text_encoder = text.total();
  }
  return m;
}

Result<size_t> PlanCheckpointMemory(const ModelSpec& model, const LayoutShape& layout, int tp,
                                    int stage, bool writer, bool zero1, const LoraConfig& lora,
                                    const TextualInversionConfig& inversion) {
  if (inversion.enabled() || (lora.enabled() && !writer)) return size_t{0};
  const ModelFamily& family = FamilyOf(model);
  const bool gathers = lora.enabled() || layout.tp > 1 || layout.pp > 1;
  std::optional<ModelPartition> whole;
  if (writer && gathers) {
    DT_ASSIGN_OR_RETURN(whole, family.Partition(model, {}, 0, 0, 0));
  }
  if (lora.enabled()) {
    DT_ASSIGN_OR_RETURN(const LoraElements e, CountLoraElements(lora, whole->parameters.table));
    return e.frozen * sizeof(float);
  }
  DT_ASSIGN_OR_RETURN(const ModelPartition part, family.Partition(model, layout, tp, 0, stage));
  size_t floats = zero1 ? 2 * part.parameters.table.total() : 0;
  if (whole) {
    size_t peer = 0;
    for (int s = 0; s < layout.pp; ++s) {
      for (int t = 0; t < layout.tp; ++t) {
        if (s == stage && t == tp) continue;
        DT_ASSIGN_OR_RETURN(const ModelPartition theirs, family.Partition(model, layout, t, 0, s));
        peer = std::max(peer, theirs.parameters.table.total());
      }
    }
    floats += whole->parameters.table.total() + peer;
  }
  return floats * sizeof(float);
}

std::string DescribeHostArenas(const TrainConfig& config, const ParallelOptions& parallel) {
  const std::string whole =
      "more host memory for its parameters, gradients, optimizer state, "
      "EMA and activations";
  if (config.device == "cuda") return whole;  // the host keeps no activations then
  const Topology* t = parallel.topology ? &*parallel.topology : nullptr;
  const int dp = t ? t->dp() : 1, cp = t ? t->cp() : 1;
  const LayoutShape layout{t ? t->tp() : 1, cp, t ? t->pp() : 1, parallel.stage_blocks};
  const int stage = t ? t->CoordinatesOf(parallel.rank).pp : 0;
  // The text encoder a run trains through, where its files can be read.
  const std::optional<TrainedEncoder> encoder = Trainer::TrainedTextEncoder(config);
  const Result<MemoryBytes> m =
      PlanMemory(config.model, layout, stage, config.micro_batch, config.AccumulationSteps(dp),
                 parallel.zero1, dp * cp, parallel.bucket_elements, config.recompute, config.lora,
                 config.textual_inversion, encoder ? &*encoder : nullptr);
  if (!m.ok()) return whole;
  constexpr double kGiB = double(1ull << 30);
  return fmt::format(
      "{:.2f} GiB of host memory (parameters {:.2f}, gradients {:.2f}, AdamW moments {:.2f}, "
      "EMA {:.2f}, activations {:.2f}{} GiB)",
      double(m->total()) / kGiB, m->parameters / kGiB, m->gradients / kGiB, m->optimizer / kGiB,
      m->ema / kGiB, m->activations / kGiB,
      m->text_encoder > 0 ? fmt::format(", text encoder {:.2f}", m->text_encoder / kGiB) : "");
}

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                 const ParallelOptions& parallel,
                                                 std::unique_ptr<GpuStep> gpu) {
  const int dp = parallel.topology ? parallel.topology->dp() : 1;
  DT_RETURN_IF_ERROR(config.Validate(dp));
  if (config.steps < 1) {
    return Errorf("train.epochs {}: the steps are not resolved from the data (ResolveEpochs)",
                  config.epochs);
  }
  const ModelFamily& family = FamilyOf(config.model);
  if (parallel.topology) {
    DT_RETURN_IF_ERROR(family.ValidateLayout(config.model, parallel.layout()));
  }
  const SampleSchema m = family.Samples(config.model);
  DT_ASSIGN_OR_RETURN(auto opened, OpenData(config, m));
  auto& [data, prior] = opened;
  DT_ASSIGN_OR_RETURN(std::unique_ptr<TextTraining> texts, OpenTextTraining(config, *data));
  if (config.device == "cuda" && gpu == nullptr) {
    DT_ASSIGN_OR_RETURN(gpu, GpuStep::Create(config, /*device=*/0));
  }
  // Arenas larger than the memory this rank may take are an error that names the job's sizes
  // and the limit (the machine's or its cgroup's: model/tensor/host_memory.h), not an
  // uncaught std::bad_alloc or a rank OOM-killed while it fills them.
  try {
    return std::make_unique<Trainer>(config, std::move(data), parallel, std::move(gpu),
                                     std::move(prior), std::move(texts));
  } catch (const std::bad_alloc&) {
    return Errorf(
        "out of host memory creating the trainer: {} with {}x{}x{}x{} samples (frames x channels "
        "x height x width) at batch.micro {} needs {}, more than {}; lower batch.micro, set "
        "train.recompute: true, split the model (tp, cp, pp) or give the rank more memory; "
        "`difftrain plan` predicts a rank's memory",
        config.model.name(), m.frames, m.channels, m.height, m.width, config.micro_batch,
        DescribeHostArenas(config, parallel), ReadHostMemory().Describe());
  }
}

Trainer::Trainer(const TrainConfig& config, std::unique_ptr<Dataset> data,
                 const ParallelOptions& parallel, std::unique_ptr<GpuStep> gpu,
                 std::unique_ptr<Dataset> prior, std::unique_ptr<TextTraining> texts)
    : config_(config),
      parallel_(parallel),
      coords_(parallel.topology ? parallel.topology->CoordinatesOf(parallel.rank)
                                : ParallelCoordinates{}),
      data_(std::move(data)),
      loader_(*data_, LoaderOptions(config, dp_rank(), dp_size())),
      prior_data_(std::move(prior)),
      schema_(FamilyOf(config.model).Samples(config.model)),
      model_(CreateModel(config, parallel)),
      texts_(std::move(texts)),
      diffusion_(config.diffusion),
      gpu_(std::move(gpu)) {
  Status valid = config.Validate(dp_size());
  DT_CHECK(valid.ok(), "{}", valid.message());
  DT_CHECK((config.device == "cuda") == (gpu_ != nullptr), "train.device {} with{} a GpuStep",
           config.device, gpu_ ? "" : "out");
  DT_CHECK(config.data.has_prior() == (prior_data_ != nullptr),
           "data.prior_path '{}' with{} its samples (Trainer::Create opens them)",
           config.data.prior_path, prior_data_ ? "" : "out");
  if (prior_data_) {
    prior_loader_ = std::make_unique<DataLoader>(*prior_data_,
                                                 PriorLoaderOptions(config, dp_rank(), dp_size()));
  }
  // Adds tensor t to the ranges each step zeroes, merged with the last where they touch.
  const auto append_zeroed = [this](const TensorSpec& t) {
    if (!zeroed_.empty() && zeroed_.back().end == t.offset) {
      zeroed_.back().end += t.numel;
    } else {
      zeroed_.push_back({t.offset, t.offset + t.numel});
    }
  };
  if ((config.textual_inversion.enabled() || config.lora.train_text_encoder) && !texts_) {
    Result<std::unique_ptr<TextTraining>> made = OpenTextTraining(config, *data_);
    DT_CHECK(made.ok(), "{}", made.status().message());
    texts_ = std::move(made).value();
  }
  inversion_ = dynamic_cast<TextualInversion*>(texts_.get());
  text_lora_ = dynamic_cast<TextEncoderLora*>(texts_.get());
  DT_CHECK(config.textual_inversion.enabled() == (inversion_ != nullptr) &&
               (config.lora.enabled() && config.lora.train_text_encoder) == (text_lora_ != nullptr),
           "the text encoder the run trains through is not the job's");
  if (config.lora.enabled()) {
    // Validate refused the layouts that split the model, so this rank's table is the whole's.
    Result<LoraAdapters> adapters = LoraAdapters::Create(
        config.lora, model_->parameter_table(), text_lora_ ? &text_lora_->table() : nullptr);
    DT_CHECK(adapters.ok(), "{}", adapters.status().message());
    lora_ = std::make_unique<LoraAdapters>(std::move(adapters).value());
    // The frozen weights' gradients are not needed: only the targets' (the chain rule's input).
    std::unordered_set<size_t> targets;
    for (const LoraModule& m : lora_->modules())
      targets.insert(m.weight);
    std::vector<size_t> frozen;
    for (const TensorSpec& t : model_->parameter_table().tensors()) {
      if (!targets.contains(t.offset)) frozen.push_back(t.offset);
      // Zeroed each step: the targets' gradients, which the adapters' come from, and the
      // vectors (norms, biases) a family may compute whatever it is asked to skip. The rest
      // of the gradient arena is never written, and its pages never touched.
      if (targets.contains(t.offset) || t.shape.size() < 2) append_zeroed(t);
    }
    model_->SkipGradients(std::move(frozen));
  } else if (config.textual_inversion.enabled()) {
    // The whole model is frozen: its gradients are not needed, only its context's.
    std::vector<size_t> frozen;
    for (const TensorSpec& t : model_->parameter_table().tensors()) {
      frozen.push_back(t.offset);
      if (t.shape.size() < 2) append_zeroed(t);
    }
    model_->SkipGradients(std::move(frozen));
  } else {
    zeroed_ = {{0, model_->num_params()}};
  }
  whole_ = {{0, trained_elements()}};
  ema_ = Buffer<float>(trained_elements());
  // On the GPU the gradients are averaged on the device (StepOnGpu), not by GradientSync; a
  // LoRA's adapters' (or a textual inversion's vectors') gradients in one all-reduce
  // (ApplyUpdate).
  if (parallel.dp_cp != nullptr && !gpu_ && !trains_apart()) {
    sync_ = std::make_unique<parallel::GradientSync>(*parallel.dp_cp, model_->num_params(),
                                                     parallel.bucket_elements, parallel.zero1,
                                                     parallel.overlap);
  }
  for (const parallel::Range& r : owned())
    owned_elements_ += r.size();
  exp_avg_ = Buffer<float>(owned_elements_);
  exp_avg_sq_ = Buffer<float>(owned_elements_);
  // Every owned range counts on tp rank 0; elsewhere only the tensors split over tp do.
  std::vector<parallel::Range> counted;
  const ShardedParameters& sharded = model_->sharded();
  for (size_t i = 0; i < sharded.table.tensors().size(); ++i) {
    const TensorSpec& t = sharded.table.tensors()[i];
    if (coords_.tp == 0 || sharded.split[i]) counted.push_back({t.offset, t.offset + t.numel});
  }
  norm_ranges_ = trains_apart() ? whole_ : Intersect(owned(), counted);
  micro_batches_ = config.AccumulationSteps(dp_size());
  slots_ = parallel::InFlightMicroBatches(model_->placement().pp, model_->placement().stage,
                                          micro_batches_);
  batches_.resize(slots_);
  douts_.resize(slots_);
  if (texts_) {
    texts_->SetSlots(slots_);
    dcontexts_.resize(slots_);
  }
  // On the GPU the host model keeps only the checkpoint's copy of the parameters.
  if (!gpu_) model_->Reserve(config.micro_batch, slots_, config.recompute);
  if (!gpu_ && data_->bucketed()) {
    // Every bucket's activations laid out once, largest first, so that the arena is made here at
    // the largest (a machine without room for it fails to create the trainer, with Create's
    // message, not a step later) and kept by every step's size (UNet::Reserve).
    std::vector<SampleSize> sizes = data_->buckets();
    std::sort(sizes.begin(), sizes.end(),
              [](SampleSize a, SampleSize b) { return a.area() > b.area(); });
    for (const SampleSize& s : sizes) {
      Status sized = model_->SetSampleSize(s.height, s.width);
      DT_CHECK(sized.ok(), "{}", sized.message());  // CheckBucketsFitTraining took every bucket
      model_->Reserve(config.micro_batch, slots_, config.recompute);
    }
  }
  model_->InitializeReference(config.seed);
  if (lora_) {
    lora_->SetBase(model_->params(), text_weights());
    lora_->Initialize(config.seed);
    lora_->Apply(lora_->params(), model_->params(), text_weights());
  }
  std::memcpy(ema_.data(), trained_params(), ema_.bytes());
  if (gpu_) {
    gpu_->UploadState(model_->params(), ema_.data(), nullptr, nullptr);
    ahead_ = std::make_unique<BatchAhead<MicroBatch>>([this](int64_t first, MicroBatch& batch) {
      return FillMicroBatch(first, config_.micro_batch, batch, nullptr);
    });
  }
}

Trainer::~Trainer() = default;

void Trainer::InitializeRandom(uint64_t seed) {
  model_->InitializeRandom(seed);
  if (lora_) {
    lora_->SetBase(model_->params(), text_weights());
    lora_->InitializeRandom(seed);
    lora_->Apply(lora_->params(), model_->params(), text_weights());
  }
  std::memcpy(ema_.data(), trained_params(), ema_.bytes());
  gpu_stale_ = gpu_ != nullptr;
}

const std::vector<parallel::Range>& Trainer::owned() const {
  return sync_ ? sync_->owned() : whole_;
}

MemoryBytes Trainer::memory() const {
  if (gpu_) return gpu_->memory();
  MemoryBytes m;
  m.parameters = model_->num_params() * sizeof(float) + model_->fixed_bytes();
  size_t zeroed = 0;  // the model's gradients a step writes
  for (const parallel::Range& r : zeroed_)
    zeroed += r.size();
  m.gradients = zeroed * sizeof(float);
  if (lora_) {  // the adapters and the frozen copy of their weights
    m.parameters += (lora_->size() + lora_->base_size()) * sizeof(float);
    m.gradients += lora_->size() * sizeof(float);
  }
  if (inversion_) {  // the vectors (the text encoder's weights are not counted)
    m.parameters += inversion_->size() * sizeof(float);
    m.gradients += inversion_->size() * sizeof(float);
  }
  // The adapted text encoder weights' gradients (its weights are not counted).
  if (text_lora_) m.gradients += text_lora_->trained_elements() * sizeof(float);
  m.optimizer = exp_avg_.bytes() + exp_avg_sq_.bytes();
  m.ema = ema_.bytes();
  m.activations = model_->activation_bytes();
  return m;
}

double Trainer::FlopsPerSample(SampleSize size) {
  const auto key = std::make_pair(size.height, size.width);
  if (auto it = flops_per_sample_.find(key); it != flops_per_sample_.end()) return it->second;
  const ModelFamily& family = FamilyOf(config_.model);
  double flops = family.Cost(config_.model).training_flops_per_sample();
  if (size.height != schema_.height || size.width != schema_.width) {
    // Only a family that resizes takes buckets (CheckBucketsFitTraining).
    Result<ModelSpec> resized = family.Resized(config_.model, size.height, size.width);
    if (resized.ok()) flops = family.Cost(*resized).training_flops_per_sample();
  }
  return flops_per_sample_[key] = flops;
}

size_t Trainer::SampleElements(const MicroBatch& batch) const {
  return size_t(schema_.frames) * schema_.channels * batch.sample_size.area();
}

size_t Trainer::OutputElements(const MicroBatch& batch) const {
  return size_t(schema_.frames) * schema_.out_channels * batch.sample_size.area();
}

void Trainer::ReserveFor(const MicroBatch& batch) {
  // Only bucketed data change the model's size (CheckBucketsFitTraining took every bucket).
  if (data_->bucketed()) {
    Status sized = model_->SetSampleSize(batch.sample_size.height, batch.sample_size.width);
    DT_CHECK(sized.ok(), "{}", sized.message());
  }
  model_->Reserve(batch.size, slots_, config_.recompute);
}

const float* Trainer::Target(const MicroBatch& batch) const {
  if (diffusion_.predicts_noise()) return batch.noise.data();
  target_.resize(batch.noise.size());
  diffusion_.Target(target_.data(), batch.x0.data(), batch.noise.data(), batch.t.data(), batch.size,
                    SampleElements(batch));
  return target_.data();
}

double Trainer::Loss(const float* output, const MicroBatch& batch, float grad_scale,
                     float* dout) const {
  const SampleSchema& m = schema_;
  // A video's frames are [C, H, W] images with the video's timestep (its output splits ε and
  // σ per frame); every sample has F·C·H·W elements, so the mean over the frames of all
  // samples is the mean over the samples.
  const int HW = static_cast<int>(batch.sample_size.area()), n = batch.size * m.frames;
  std::vector<int64_t> t(batch.t);
  if (m.frames > 1) {
    t.resize(n);
    for (int i = 0; i < n; ++i)
      t[i] = batch.t[i / m.frames];
  }
  std::vector<double> weights = diffusion_.LossWeights(t.data(), n);
  if (!batch.sample_weights.empty()) {  // a prior's halves: each frame takes its sample's
    weights.resize(n, 1.0);
    for (int i = 0; i < n; ++i)
      weights[i] *= batch.sample_weights[i / m.frames];
  }
  const double* w = weights.empty() ? nullptr : weights.data();
  return config_.learn_sigma_loss
             ? DiffusionLoss(diffusion_, output, batch.x0.data(), batch.x_t.data(),
                             batch.noise.data(), t.data(), n, m.channels, HW,
                             /*learn_sigma=*/true, grad_scale, dout, w)
             : EpsilonMseLoss(output, Target(batch), n, m.channels, m.out_channels, HW, grad_scale,
                              dout, w);
}

double Trainer::ForwardBackward(const MicroBatch& batch, float grad_scale) {
  DT_CHECK(!parallel_.topology && !gpu_, "ForwardBackward is for one process on the CPU");
  ReserveFor(batch);
  if (texts_) {  // the texts encoded into a copy of the batch, in slot 0
    batches_[0] = batch;
    Status encoded = EncodeTexts(0, batches_[0]);
    DT_CHECK(encoded.ok(), "{}", encoded.message());
  }
  const MicroBatch& used = texts_ ? batches_[0] : batch;
  Status forward = model_->Forward(0, used.inputs(), nullptr, nullptr);
  DT_CHECK(forward.ok(), "{}", forward.message());
  last_output_ = model_->output(0);
  douts_[0].resize(batch.size * OutputElements(batch));
  const double loss = Loss(last_output_, used, grad_scale, douts_[0].data());
  Status backward = BackwardWithTexts(0, douts_[0].data(), nullptr, {});
  DT_CHECK(backward.ok(), "{}", backward.message());
  return loss;
}

Status Trainer::Forward(int micro, const float* input, float* output) {
  const int slot = micro % slots_;
  MicroBatch& batch = batches_[slot];
  const ModelShard& shard = model_->placement();
  // The first stage reads the inputs, the last the loss targets; the others need neither.
  if (shard.first_stage() || shard.last_stage()) {
    const int64_t first = step_first_ + static_cast<int64_t>(micro) * config_.micro_batch;
    DT_RETURN_IF_ERROR(MakeMicroBatch(first, config_.micro_batch, batch));
    // The step's size (a bucket's): the model's activations follow it. Only a family that
    // resizes takes buckets, and it has one stage.
    ReserveFor(batch);
    DT_RETURN_IF_ERROR(EncodeTexts(slot, batch));
  }
  DT_RETURN_IF_ERROR(model_->Forward(slot, batch.inputs(), input, output));
  if (shard.last_stage()) {
    last_output_ = model_->output(slot);
    douts_[slot].resize(batch.size * OutputElements(batch));
    step_loss_ += Loss(last_output_, batch, grad_scale_, douts_[slot].data()) / micro_batches_;
  }
  return Status::Ok();
}

Status Trainer::Backward(int micro, const float* output_grad, float* input_grad) {
  const int slot = micro % slots_;
  Model::GradientsReady ready;
  if (micro + 1 == micro_batches_ && sync_) {
    // Only the last micro-batch's backward makes gradients final.
    sync_->Begin(model_->grads());
    ready = [this](size_t from) { sync_->OnGradientsReady(from); };
  }
  const float* grad = model_->placement().last_stage() ? douts_[slot].data() : output_grad;
  return BackwardWithTexts(slot, grad, input_grad, ready);
}

Result<StepStats> Trainer::Step() {
  if (gpu_) return StepOnGpu();
  step_first_ = loader_.RankFirstSample(samples_seen_);
  // Each context-parallel rank's gradients are partial sums over its tokens; the dp-cp
  // average divides by cp as well as dp.
  grad_scale_ = static_cast<float>(model_->placement().cp) / static_cast<float>(micro_batches_);
  step_loss_ = 0;
  data_wait_seconds_ = 0;
  ZeroModelGradients();
  DT_RETURN_IF_ERROR(parallel::RunOneForwardOneBackward(parallel_.pp, micro_batches_, *this));
  // Read this rank's slice of the next global batch while the update runs.
  if (model_->placement().first_stage() || model_->placement().last_stage()) {
    Prefetch(loader_.RankFirstSample(samples_seen_ + config_.global_batch),
             config_.global_batch / dp_size());
  }
  const SampleSize size = loader_.SizeOf(step_first_);  // the whole global batch's
  Result<StepStats> stats = ApplyUpdate(step_loss_, config_.global_batch);
  if (stats.ok()) {
    stats->data_wait_seconds = data_wait_seconds_;
    stats->flops_per_sample = FlopsPerSample(size);
    if (data_->bucketed()) stats->sample_size = size;
  }
  return stats;
}

Result<StepStats> Trainer::StepOnGpu() {
  if (gpu_stale_) {
    gpu_->UploadState(model_->params(), ema_.data(), exp_avg_.data(), exp_avg_sq_.data());
    gpu_stale_ = false;
  }
  step_first_ = loader_.RankFirstSample(samples_seen_);
  gpu_->ZeroGradients();
  double loss = 0;
  for (int micro = 0; micro < micro_batches_; ++micro) {
    const int64_t first = step_first_ + static_cast<int64_t>(micro) * config_.micro_batch;
    DT_ASSIGN_OR_RETURN(const MicroBatch* batch, ahead_->Take(first));
    // While the GPU computes this one, the host makes the next: this step's, or the next step's
    // first (the data loader's own prefetch is not used: the helper reads ahead).
    ahead_->MakeAhead(micro + 1 < micro_batches_
                          ? first + config_.micro_batch
                          : loader_.RankFirstSample(samples_seen_ + config_.global_batch));
    loss +=
        gpu_->ForwardBackward(*batch, 1.0f / static_cast<float>(micro_batches_)) / micro_batches_;
  }
  StepStats stats;
  stats.data_wait_seconds = ahead_->TakeWaitSeconds();
  if (parallel_.dp_cp != nullptr) {
    const auto start = std::chrono::steady_clock::now();
    DT_RETURN_IF_ERROR(
        parallel_.dp_cp
            ->AllReduce(gpu_->gradients(), model_->num_params(), parallel::ReduceOp::kAvg)
            .WithContext("averaging gradients"));
    stats.comm_wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  stats.loss = loss;
  if (parallel_.world != nullptr) {  // host buffers: the world group is Gloo
    float sum = static_cast<float>(loss);
    DT_RETURN_IF_ERROR(parallel_.world->AllReduce(&sum, 1, parallel::ReduceOp::kSum)
                           .WithContext("reducing the loss"));
    stats.loss = sum / static_cast<float>(dp_size());
  }
  stats.lr = LearningRate(config_.optimizer, step_, config_.steps);
  stats.grad_norm = gpu_->OptimizerStep(stats.lr, step_ + 1);
  ++step_;
  samples_seen_ += config_.global_batch;
  stats.step = step_;
  stats.epoch = epochs_seen();
  return stats;
}

void Trainer::ZeroModelGradients() {
  float* grads = model_->grads();
  for (const parallel::Range& r : zeroed_)
    std::memset(grads + r.begin, 0, r.size() * sizeof(float));
  if (inversion_) std::fill_n(inversion_->grads(), inversion_->size(), 0.0f);
  if (text_lora_) text_lora_->ZeroGradients();
}

StepStats Trainer::StepOn(const MicroBatch& batch) {
  DT_CHECK(!parallel_.topology && !gpu_, "StepOn is for one process on the CPU");
  ZeroModelGradients();
  const double loss = ForwardBackward(batch, 1.0f);
  return *ApplyUpdate(loss, batch.size);
}

Result<StepStats> Trainer::ApplyUpdate(double loss, int64_t samples) {
  StepStats stats;
  float* params = trained_params();
  const float* grads = trained_grads();
  if (sync_) {
    Result<double> waited = sync_->Finish();
    if (!waited.ok()) return waited.status();
    stats.comm_wait_seconds = *waited;
  }
  // The adapters' gradients from this rank's model gradients, averaged: linear in the model's,
  // so the same as from the averaged model gradients, for a fraction of the bytes.
  if (lora_) lora_->Gradients(model_->grads(), text_grads());
  if (trains_apart() && parallel_.dp_cp != nullptr) {
    const auto start = std::chrono::steady_clock::now();
    float* apart = lora_ ? lora_->grads() : inversion_->grads();
    DT_RETURN_IF_ERROR(
        parallel_.dp_cp->AllReduce(apart, trained_elements(), parallel::ReduceOp::kAvg)
            .WithContext(lora_ ? "averaging the LoRA adapters' gradients"
                               : "averaging the textual inversion's gradients"));
    stats.comm_wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  double sum_squares = 0;
  for (const parallel::Range& r : norm_ranges_)
    sum_squares += SumOfSquares(grads + r.begin, r.size());
  stats.loss = loss;
  if (parallel_.world != nullptr) {
    // One sum over the world: the loss of each replica once (its last stage, tp and cp rank
    // 0), and each gradient element once (without ZeRO-1 the dp-cp ranks hold the same
    // averaged gradient: dp-cp rank 0 counts it; with ZeRO-1 their pieces are disjoint).
    const bool loss_here = model_->placement().last_stage() && coords_.tp == 0 && coords_.cp == 0;
    const bool norm_here = (sync_ && sync_->zero1()) || (coords_.cp == 0 && coords_.dp == 0);
    float reduced[2] = {loss_here ? static_cast<float>(loss) : 0.0f,
                        norm_here ? static_cast<float>(sum_squares) : 0.0f};
    DT_RETURN_IF_ERROR(parallel_.world->AllReduce(reduced, 2, parallel::ReduceOp::kSum)
                           .WithContext("reducing loss and gradient norm"));
    stats.loss = reduced[0] / static_cast<float>(dp_size());
    sum_squares = reduced[1];
  }
  stats.grad_norm = std::sqrt(sum_squares);
  stats.lr = LearningRate(config_.optimizer, step_, config_.steps);
  const double clip = ClipScale(stats.grad_norm, config_.optimizer.grad_clip);
  size_t moment = 0;
  for (const parallel::Range& r : owned()) {
    AdamWUpdate(params + r.begin, grads + r.begin, exp_avg_.data() + moment,
                exp_avg_sq_.data() + moment, r.size(), stats.lr, clip, step_ + 1,
                config_.optimizer);
    moment += r.size();
  }
  if (sync_) DT_RETURN_IF_ERROR(sync_->GatherParameters(params));
  if (lora_) lora_->Apply(lora_->params(), model_->params(), text_weights());
  if (inversion_) inversion_->Apply(inversion_->params());
  EmaUpdate(ema_.data(), params, trained_elements(), EmaDecayAt(config_.optimizer, step_ + 1));
  ++step_;
  samples_seen_ += samples;
  stats.step = step_;
  stats.epoch = epochs_seen();
  return stats;
}

}  // namespace difftrain
