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

DataLoaderOptions LoaderOptions(const TrainConfig& config, int dp_rank, int dp_size) {
  DataLoaderOptions o;
  o.seed = config.seed;
  o.batch_size = config.global_batch / dp_size;  // this rank's samples of one global batch
  o.dp_rank = dp_rank;
  o.dp_size = dp_size;
  o.shuffle = config.data.shuffle;
  o.horizontal_flip = config.data.horizontal_flip;
  return o;
}

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
                               size_t bucket_elements, bool recompute, const LoraConfig& lora) {
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
  m.activations = family.ActivationBytes(
      model, layout, stage, micro_batch,
      parallel::InFlightMicroBatches(layout.pp, stage, micro_batches), recompute);
  return m;
}

namespace {

// What a rank's host arenas take (PlanMemory: what the constructor below allocates), for the
// out-of-memory error: "1.23 GiB (parameters 0.01, ... activations 1.16 GiB)".
std::string HostArenasNeeded(const TrainConfig& config, const ParallelOptions& parallel) {
  const std::string whole =
      "more host memory for its parameters, gradients, optimizer state, "
      "EMA and activations";
  if (config.device == "cuda") return whole;  // the host keeps no activations then
  const Topology* t = parallel.topology ? &*parallel.topology : nullptr;
  const int dp = t ? t->dp() : 1, cp = t ? t->cp() : 1;
  const LayoutShape layout{t ? t->tp() : 1, cp, t ? t->pp() : 1, parallel.stage_blocks};
  const int stage = t ? t->CoordinatesOf(parallel.rank).pp : 0;
  const Result<MemoryBytes> m =
      PlanMemory(config.model, layout, stage, config.micro_batch, config.AccumulationSteps(dp),
                 parallel.zero1, dp * cp, parallel.bucket_elements, config.recompute, config.lora);
  if (!m.ok()) return whole;
  constexpr double kGiB = double(1ull << 30);
  return fmt::format(
      "{:.2f} GiB of host memory (parameters {:.2f}, gradients {:.2f}, AdamW moments {:.2f}, "
      "EMA {:.2f}, activations {:.2f} GiB)",
      double(m->total()) / kGiB, m->parameters / kGiB, m->gradients / kGiB, m->optimizer / kGiB,
      m->ema / kGiB, m->activations / kGiB);
}

}  // namespace

Status CheckBucketsFitTraining(const Dataset& d, const TrainConfig& config,
                               const std::string& kind) {
  if (!d.bucketed()) return Status::Ok();
  const std::vector<SampleSize> buckets = d.buckets();
  if (config.device != "cpu") {
    return Errorf(
        "{} samples come in {} aspect-ratio buckets, which train.device {} does not take yet "
        "(its step is built for one size); train them with train.device: cpu, or pack the "
        "pictures at one size (data pack --crop square)",
        kind, buckets.size(), config.device);
  }
  const ModelFamily& family = FamilyOf(config.model);
  std::vector<int64_t> counts(buckets.size());
  for (int64_t i = 0; i < d.size(); ++i)
    ++counts[d.BucketOf(i)];
  int64_t kept = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    // Every bucket, even one without samples: the trainer lays out each one's activations.
    Result<ModelSpec> resized = family.Resized(config.model, buckets[b].height, buckets[b].width);
    if (!resized.ok()) {
      return resized.status().WithContext(fmt::format("{} bucket {} ({}x{} latents, {} samples)",
                                                      kind, b, buckets[b].height, buckets[b].width,
                                                      counts[b]));
    }
    kept += counts[b] / config.global_batch * config.global_batch;
  }
  if (kept == 0) {
    return Errorf(
        "no aspect-ratio bucket of the {} holds a global batch (batch.global {}): every batch is "
        "of one bucket's size, and the largest bucket holds {} samples; lower batch.global or "
        "pack fewer buckets",
        kind, config.global_batch, *std::max_element(counts.begin(), counts.end()));
  }
  spdlog::info(
      "data: {} samples in {} aspect-ratio buckets; an epoch trains {} of them, in whole global "
      "batches of one bucket each ({} left out: the buckets' remainders)",
      d.size(), std::count_if(counts.begin(), counts.end(), [](int64_t n) { return n > 0; }), kept,
      d.size() - kept);
  return Status::Ok();
}

Status CheckDataFitsModel(const Dataset& d, const SampleSchema& m, const std::string& kind) {
  // An unconditional model (no classes) trains on any labels: it never reads them.
  if (d.frames() != m.frames || d.channels() != m.channels || d.height() != m.height ||
      d.width() != m.width || (m.num_classes > 0 && d.num_classes() != m.num_classes)) {
    return Errorf(
        "{} samples are {}x{}x{}x{} (frames x channels x height x width) with {} classes, "
        "but the model takes {}x{}x{}x{} samples with {} classes",
        kind, d.frames(), d.channels(), d.height(), d.width(), d.num_classes(), m.frames,
        m.channels, m.height, m.width, m.num_classes);
  }
  // Text-conditional data train a text-conditional model on their own text embeddings;
  // without texts the model gets synthetic ones (NeMo's precached benchmark mode).
  if (const TextTable* texts = d.texts();
      texts != nullptr && m.context_length > 0 &&
      (texts->length != m.context_length || texts->dim != m.context_dim)) {
    return Errorf(
        "{} texts are embedded as {}x{} (tokens x features), but the model takes text "
        "embeddings of {}x{} (text_length x cross_attention_dim)",
        kind, texts->length, texts->dim, m.context_length, m.context_dim);
  }
  // SDXL's UNet adds each text's pooled embedding: a table the data carry must have them.
  if (const TextTable* texts = d.texts();
      texts != nullptr && m.pooled_text_dim > 0 && texts->pooled_dim != m.pooled_text_dim) {
    return Errorf(
        "the model takes each text's pooled embedding of {} features (SDXL's "
        "projection_class_embeddings_input_dim less its time ids'), but the {} texts' table has "
        "{}; embed the captions with the model's text encoders (difftrain data embed --encoder "
        "an SDXL pipeline)",
        m.pooled_text_dim, kind,
        texts->pooled_dim == 0 ? std::string("none") : std::to_string(texts->pooled_dim));
  }
  return Status::Ok();
}

namespace {

// data.prior_path's latent folder, checked against the model and the data it trains beside.
Result<std::unique_ptr<Dataset>> OpenPriorData(const TrainConfig& config, const Dataset& data,
                                               const SampleSchema& m) {
  DatasetSpec spec;
  spec.kind = "latent_folder";
  spec.path = config.data.prior_path;
  spec.seed = config.seed;
  Result<std::unique_ptr<Dataset>> opened = OpenDataset(spec);
  if (!opened.ok()) return opened.status().WithContext("data.prior_path");
  const Dataset& prior = **opened;
  DT_RETURN_IF_ERROR(CheckDataFitsModel(prior, m, "data.prior_path").WithContext("data"));
  if (data.bucketed() || prior.bucketed()) {
    return Errorf(
        "data.prior_path: the {} is packed in aspect-ratio buckets; prior preservation takes "
        "data of one size (pack it with --crop square)",
        data.bucketed() ? "data (data.path)" : "prior");
  }
  // A text model trains each half on its own texts: both folders have them, or neither.
  if (m.context_length > 0 && (data.texts() != nullptr) != (prior.texts() != nullptr)) {
    return Errorf(
        "data.prior_path: the {} has text embeddings and the {} has none; pack both with the "
        "same --text-encoder (the prior's with the class prompt, e.g. \"a photo of a dog\")",
        data.texts() != nullptr ? "data" : "prior", data.texts() != nullptr ? "prior" : "data");
  }
  return opened;
}

// The prior's loader draws its own permutations: a seed of its own, from the job's.
DataLoaderOptions PriorLoaderOptions(const TrainConfig& config, int dp_rank, int dp_size) {
  DataLoaderOptions o = LoaderOptions(config, dp_rank, dp_size);
  o.seed = config.seed ^ 0x5052494f52ull;  // "PRIOR"
  return o;
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                 const ParallelOptions& parallel,
                                                 std::unique_ptr<GpuStep> gpu) {
  const int dp = parallel.topology ? parallel.topology->dp() : 1;
  DT_RETURN_IF_ERROR(config.Validate(dp));
  const ModelFamily& family = FamilyOf(config.model);
  if (parallel.topology) {
    DT_RETURN_IF_ERROR(family.ValidateLayout(config.model, parallel.layout()));
  }
  const SampleSchema m = family.Samples(config.model);
  DatasetSpec spec;
  spec.kind = config.data.kind;
  spec.path = config.data.path;
  spec.split = config.data.split;
  spec.seed = config.seed;
  spec.channels = m.channels;
  spec.image_size = m.height;
  spec.num_classes = m.num_classes;
  spec.frames = m.frames;
  Result<std::unique_ptr<Dataset>> opened = OpenDataset(spec);
  if (!opened.ok()) return opened.status().WithContext("data");
  if (config.data.max_samples > 0) {
    const int64_t all = (*opened)->size();
    const bool unbounded = (*opened)->unbounded();
    *opened = TakeSubset(std::move(opened).value(), config.data.max_samples, config.seed);
    if (unbounded) {
      spdlog::info("data: the first {} samples (data.max_samples)", (*opened)->size());
    } else if ((*opened)->size() < all) {
      spdlog::info("data: {} of the {} samples, at random (data.max_samples)", (*opened)->size(),
                   all);
    }
  }
  DT_RETURN_IF_ERROR(CheckDataFitsModel(**opened, m, config.data.kind).WithContext("data"));
  DT_RETURN_IF_ERROR(
      CheckBucketsFitTraining(**opened, config, config.data.kind).WithContext("data"));
  std::unique_ptr<Dataset> prior;
  if (config.data.has_prior()) {
    DT_ASSIGN_OR_RETURN(prior, OpenPriorData(config, **opened, m));
    spdlog::info(
        "data: prior preservation with the {} samples of {}: half of every micro-batch, their "
        "loss weighted {}",
        prior->size(), config.data.prior_path, config.data.prior_loss_weight);
  }
  if (config.device == "cuda" && gpu == nullptr) {
    DT_ASSIGN_OR_RETURN(gpu, GpuStep::Create(config, /*device=*/0));
  }
  // Arenas larger than the memory this rank may take are an error that names the job's sizes
  // and the limit (the machine's or its cgroup's: model/tensor/host_memory.h), not an
  // uncaught std::bad_alloc or a rank OOM-killed while it fills them.
  try {
    return std::make_unique<Trainer>(config, std::move(opened).value(), parallel, std::move(gpu),
                                     std::move(prior));
  } catch (const std::bad_alloc&) {
    return Errorf(
        "out of host memory creating the trainer: {} with {}x{}x{}x{} samples (frames x channels "
        "x height x width) at batch.micro {} needs {}, more than {}; lower batch.micro, set "
        "train.recompute: true, split the model (tp, cp, pp) or give the rank more memory; "
        "`difftrain plan` predicts a rank's memory",
        config.model.name(), m.frames, m.channels, m.height, m.width, config.micro_batch,
        HostArenasNeeded(config, parallel), ReadHostMemory().Describe());
  }
}

Trainer::Trainer(const TrainConfig& config, std::unique_ptr<Dataset> data,
                 const ParallelOptions& parallel, std::unique_ptr<GpuStep> gpu,
                 std::unique_ptr<Dataset> prior)
    : config_(config),
      parallel_(parallel),
      coords_(parallel.topology ? parallel.topology->CoordinatesOf(parallel.rank)
                                : ParallelCoordinates{}),
      data_(std::move(data)),
      loader_(*data_, LoaderOptions(config, dp_rank(), dp_size())),
      prior_data_(std::move(prior)),
      schema_(FamilyOf(config.model).Samples(config.model)),
      model_(CreateModel(config, parallel)),
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
  if (config.lora.enabled()) {
    // Validate refused the layouts that split the model, so this rank's table is the whole's.
    Result<LoraAdapters> adapters = LoraAdapters::Create(config.lora, model_->parameter_table());
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
      if (targets.contains(t.offset) || t.shape.size() < 2) {
        if (!zeroed_.empty() && zeroed_.back().end == t.offset) {
          zeroed_.back().end += t.numel;
        } else {
          zeroed_.push_back({t.offset, t.offset + t.numel});
        }
      }
    }
    model_->SkipGradients(std::move(frozen));
  } else {
    zeroed_ = {{0, model_->num_params()}};
  }
  whole_ = {{0, trained_elements()}};
  ema_ = Buffer<float>(trained_elements());
  // On the GPU the gradients are averaged on the device (StepOnGpu), not by GradientSync; a
  // LoRA's adapters' gradients in one all-reduce (ApplyUpdate).
  if (parallel.dp_cp != nullptr && !gpu_ && !lora_) {
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
  norm_ranges_ = lora_ ? whole_ : Intersect(owned(), counted);
  micro_batches_ = config.AccumulationSteps(dp_size());
  slots_ = parallel::InFlightMicroBatches(model_->placement().pp, model_->placement().stage,
                                          micro_batches_);
  batches_.resize(slots_);
  douts_.resize(slots_);
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
    lora_->SetBase(model_->params());
    lora_->Initialize(config.seed);
    lora_->Apply(lora_->params(), model_->params());
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
    lora_->SetBase(model_->params());
    lora_->InitializeRandom(seed);
    lora_->Apply(lora_->params(), model_->params());
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
  m.optimizer = exp_avg_.bytes() + exp_avg_sq_.bytes();
  m.ema = ema_.bytes();
  m.activations = model_->activation_bytes();
  return m;
}

Status Trainer::MakeMicroBatch(int64_t first, int B, MicroBatch& batch) {
  return FillMicroBatch(first, B, batch, &data_wait_seconds_);
}

Status Trainer::FillMicroBatch(int64_t first, int B, MicroBatch& batch, double* loader_seconds) {
  // With a prior, each half of the micro-batch comes from one loader, at half the index.
  DT_CHECK(!prior_loader_ || (B % 2 == 0 && first % 2 == 0),
           "a micro-batch with a prior takes an even number of samples from an even one");
  const int own = prior_loader_ ? B / 2 : B;
  const int64_t from = prior_loader_ ? first / 2 : first;
  // A global batch is of one size: a bucket's, where the data has several.
  batch.sample_size = loader_.SizeOf(from);
  const size_t n = SampleElements(batch);
  batch.size = B;
  batch.x0.resize(B * n);
  batch.noise.resize(B * n);
  batch.x_t.resize(B * n);
  batch.perturbation.resize(diffusion_.perturbs_input() ? B * n : 0);
  batch.t.resize(B);
  batch.t_float.resize(B);
  batch.y.resize(B);
  const size_t text = size_t(schema_.context_length) * schema_.context_dim;
  batch.context.resize(B * text);
  const size_t pooled = schema_.pooled_text_dim;
  batch.pooled_text.resize(B * pooled);
  const size_t ids = schema_.time_ids.size();
  batch.time_ids.resize(pooled > 0 ? B * ids : 0);
  // The data's half and the prior's (or the data's whole batch), from `offset` on.
  struct Part {
    const Dataset* data;
    DataLoader* loader;
    int offset;
  };
  const Part parts[] = {{data_.get(), &loader_, 0}, {prior_data_.get(), prior_loader_.get(), own}};
  const auto wait_start = std::chrono::steady_clock::now();
  // Both halves have texts or neither (Create checked).
  const bool data_texts = text > 0 && data_->texts() != nullptr;
  for (const Part& part : parts) {
    if (part.loader == nullptr) continue;
    for (int b = 0; b < own && pooled > 0; ++b) {
      float* row = batch.time_ids.data() + (part.offset + b) * ids;
      std::copy(schema_.time_ids.begin(), schema_.time_ids.end(), row);
      // SDXL's time ids of the picture the sample came from, where the data knows it: its
      // original size and crop, then the target size (the refiner's five keep their aesthetic
      // score).
      if (!part.data->has_geometry()) continue;
      PictureGeometry g;
      DT_RETURN_IF_ERROR(part.data->GetGeometry(part.loader->IndexOf(from + b), &g));
      const int32_t geometry[] = {g.original_height, g.original_width, g.crop_top,
                                  g.crop_left,       g.height,         g.width};
      for (size_t i = 0; i < ids && i < 6 && (ids == 6 || i < 4); ++i)
        row[i] = static_cast<float>(geometry[i]);
    }
    DT_RETURN_IF_ERROR(part.loader->Fill(
        from, own, batch.x0.data() + part.offset * n, batch.y.data() + part.offset,
        data_texts ? batch.context.data() + part.offset * text : nullptr,
        data_texts && pooled > 0 ? batch.pooled_text.data() + part.offset * pooled : nullptr));
  }
  // The loss is the data's mean plus prior_loss_weight times the prior's (diffusers'
  // train_dreambooth.py): as a weighted mean over all B samples, weights 2 and 2 · λ.
  batch.sample_weights.assign(prior_loader_ ? B : 0, 2.0);
  for (int b = own; b < B && prior_loader_; ++b)
    batch.sample_weights[b] = 2.0 * config_.data.prior_loss_weight;
  if (loader_seconds != nullptr) {
    *loader_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  }
  // Each sample draws from its own stream, so the samples are made in parallel with the same
  // result.
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; ++b) {
    Rng rng(config_.seed, RngStream::kNoise, static_cast<uint64_t>(first + b));
    batch.t[b] = static_cast<int64_t>(rng.Below(diffusion_.steps()));
    batch.t_float[b] = static_cast<float>(batch.t[b]);
    // Classifier-free guidance training: the label becomes the null class with probability p.
    if (rng.Uniform() < schema_.label_dropout) batch.y[b] = schema_.num_classes;
    if (text > 0) {
      // The data's text embedding, or a synthetic one (N(0, 1), as NeMo's precached mode
      // feeds), or with probability context_dropout the unconditional one: zeros.
      // An SDXL UNet's pooled embedding goes with its text.
      float* context = batch.context.data() + b * text;
      float* pooled_text = batch.pooled_text.data() + b * pooled;
      const bool dropped = rng.Uniform() < schema_.context_dropout;
      if (dropped) {
        std::fill(context, context + text, 0.0f);
        std::fill(pooled_text, pooled_text + pooled, 0.0f);
      } else if (!data_texts) {
        Rng text_rng(config_.seed, RngStream::kText, static_cast<uint64_t>(first + b));
        for (size_t i = 0; i < text; ++i)
          context[i] = static_cast<float>(text_rng.Normal());
        for (size_t i = 0; i < pooled; ++i)
          pooled_text[i] = static_cast<float>(text_rng.Normal());
      }
    }
    DrawFrameNoise(rng, diffusion_.frame_noise_correlation(), schema_.frames, n / schema_.frames,
                   batch.noise.data() + b * n);
    // diffusion.noise_offset and input_perturbation, drawn after the noise so that a job
    // without them draws what it always drew.
    if (diffusion_.has_noise_extras()) {
      diffusion_.DrawNoiseExtras(
          rng, schema_.frames, schema_.channels, batch.sample_size.area(),
          batch.noise.data() + b * n,
          diffusion_.perturbs_input() ? batch.perturbation.data() + b * n : nullptr);
    }
  }
  diffusion_.QSample(batch.x_t.data(), batch.x0.data(), batch.noise.data(), batch.t.data(), B, n,
                     batch.perturbation.empty() ? nullptr : batch.perturbation.data());
  return Status::Ok();
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

void Trainer::Prefetch(int64_t first, int count) {
  if (!prior_loader_) {
    loader_.Prefetch(first, count);
    return;
  }
  loader_.Prefetch(first / 2, count / 2);
  prior_loader_->Prefetch(first / 2, count / 2);
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
  Status forward = model_->Forward(0, batch.inputs(), nullptr, nullptr);
  DT_CHECK(forward.ok(), "{}", forward.message());
  last_output_ = model_->output(0);
  douts_[0].resize(batch.size * OutputElements(batch));
  const double loss = Loss(last_output_, batch, grad_scale, douts_[0].data());
  Status backward = model_->Backward(0, douts_[0].data(), nullptr);
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
  return model_->Backward(slot, grad, input_grad, ready);
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
  return stats;
}

void Trainer::ZeroModelGradients() {
  float* grads = model_->grads();
  for (const parallel::Range& r : zeroed_)
    std::memset(grads + r.begin, 0, r.size() * sizeof(float));
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
  if (lora_) {
    // The adapters' gradients from this rank's, averaged: linear in the model's, so the same
    // as from the averaged model gradients, for a fraction of the bytes.
    lora_->Gradients(model_->grads());
    if (parallel_.dp_cp != nullptr) {
      const auto start = std::chrono::steady_clock::now();
      DT_RETURN_IF_ERROR(
          parallel_.dp_cp->AllReduce(lora_->grads(), lora_->size(), parallel::ReduceOp::kAvg)
              .WithContext("averaging the LoRA adapters' gradients"));
      stats.comm_wait_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
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
  if (lora_) lora_->Apply(lora_->params(), model_->params());
  EmaUpdate(ema_.data(), params, trained_elements(), EmaDecayAt(config_.optimizer, step_ + 1));
  ++step_;
  samples_seen_ += samples;
  stats.step = step_;
  return stats;
}

}  // namespace difftrain
