#include "model/train/trainer.h"

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/diffusion/vb_loss.h"
#include "model/optim/adamw.h"
#include "model/tensor/rng.h"

namespace difftrain {
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

nlohmann::json RangesJson(const std::vector<parallel::Range>& ranges) {
  nlohmann::json j = nlohmann::json::array();
  for (const parallel::Range& r : ranges)
    j.push_back({r.begin, r.end});
  return j;
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                 const DataParallelOptions& dp) {
  DT_RETURN_IF_ERROR(config.Validate(dp.comm ? dp.comm->size() : 1));
  const DiTConfig& m = config.model;
  DatasetSpec spec;
  spec.kind = config.data.kind;
  spec.path = config.data.path;
  spec.split = config.data.split;
  spec.seed = config.seed;
  spec.channels = m.in_channels;
  spec.image_size = m.input_size;
  spec.num_classes = m.num_classes;
  Result<std::unique_ptr<Dataset>> opened = OpenDataset(spec);
  if (!opened.ok()) return opened.status().WithContext("data");
  const Dataset& d = **opened;
  if (d.channels() != m.in_channels || d.height() != m.input_size || d.width() != m.input_size ||
      d.num_classes() != m.num_classes) {
    return Errorf(
        "data: {} samples are {}x{}x{} with {} classes, but the model takes "
        "in_channels {}, input_size {} and num_classes {}",
        config.data.kind, d.channels(), d.height(), d.width(), d.num_classes(), m.in_channels,
        m.input_size, m.num_classes);
  }
  return std::make_unique<Trainer>(config, std::move(opened).value(), dp);
}

Trainer::Trainer(const TrainConfig& config, std::unique_ptr<Dataset> data,
                 const DataParallelOptions& dp)
    : config_(config),
      dp_(dp),
      data_(std::move(data)),
      loader_(*data_, LoaderOptions(config, dp_rank(), dp_size())),
      model_(config.model),
      diffusion_(config.diffusion),
      whole_{{0, model_.num_params()}},
      ema_(model_.num_params()) {
  Status valid = config.Validate(dp_size());
  DT_CHECK(valid.ok(), "{}", valid.message());
  if (dp.comm != nullptr) {
    sync_ = std::make_unique<parallel::GradientSync>(*dp.comm, model_.num_params(),
                                                     dp.bucket_elements, dp.zero1, dp.overlap);
  }
  for (const parallel::Range& r : owned())
    owned_elements_ += r.size();
  exp_avg_ = Buffer<float>(owned_elements_);
  exp_avg_sq_ = Buffer<float>(owned_elements_);
  model_.InitializeReference(config.seed);
  std::memcpy(ema_.data(), model_.params(), ema_.bytes());
}

const std::vector<parallel::Range>& Trainer::owned() const {
  return sync_ ? sync_->owned() : whole_;
}

Status Trainer::MakeMicroBatch(int64_t first, int B, MicroBatch& batch) {
  const DiTConfig& m = config_.model;
  const size_t n = static_cast<size_t>(m.in_channels) * m.input_size * m.input_size;
  batch.size = B;
  batch.x0.resize(B * n);
  batch.noise.resize(B * n);
  batch.x_t.resize(B * n);
  batch.t.resize(B);
  batch.t_float.resize(B);
  batch.y.resize(B);
  DT_RETURN_IF_ERROR(loader_.Fill(first, B, batch.x0.data(), batch.y.data()));
  for (int b = 0; b < B; ++b) {
    Rng rng(config_.seed, RngStream::kNoise, static_cast<uint64_t>(first + b));
    batch.t[b] = static_cast<int64_t>(rng.Below(diffusion_.steps()));
    batch.t_float[b] = static_cast<float>(batch.t[b]);
    // Classifier-free guidance training: the label becomes the null class with probability p.
    if (rng.Uniform() < m.class_dropout_prob) batch.y[b] = m.num_classes;
    for (size_t i = 0; i < n; ++i)
      batch.noise[b * n + i] = static_cast<float>(rng.Normal());
  }
  diffusion_.QSample(batch.x_t.data(), batch.x0.data(), batch.noise.data(), batch.t.data(), B, n);
  return Status::Ok();
}

double Trainer::ForwardBackward(const MicroBatch& batch, float grad_scale,
                                const DiT::GradientsReady& ready) {
  const DiTConfig& m = config_.model;
  const int HW = m.input_size * m.input_size;
  last_output_ = model_.Forward(batch.x_t.data(), batch.t_float.data(), batch.y.data(), batch.size);
  dout_.resize(static_cast<size_t>(batch.size) * m.out_channels() * HW);
  const double loss =
      config_.learn_sigma_loss
          ? DiffusionLoss(diffusion_, last_output_, batch.x0.data(), batch.x_t.data(),
                          batch.noise.data(), batch.t.data(), batch.size, m.in_channels, HW,
                          /*learn_sigma=*/true, grad_scale, dout_.data())
          : EpsilonMseLoss(last_output_, batch.noise.data(), batch.size, m.in_channels,
                           m.out_channels(), HW, grad_scale, dout_.data());
  model_.Backward(dout_.data(), ready);
  return loss;
}

Result<StepStats> Trainer::Step() {
  const int accumulation = config_.AccumulationSteps(dp_size());
  const int64_t rank_first = loader_.RankFirstSample(samples_seen_);
  std::memset(model_.grads(), 0, model_.num_params() * sizeof(float));
  double loss = 0;
  for (int i = 0; i < accumulation; ++i) {
    const int64_t first = rank_first + static_cast<int64_t>(i) * config_.micro_batch;
    DT_RETURN_IF_ERROR(MakeMicroBatch(first, config_.micro_batch, batch_));
    const bool last = i + 1 == accumulation;
    DiT::GradientsReady ready;
    if (last && sync_) {
      // Only the last micro-batch's backward makes gradients final.
      sync_->Begin(model_.grads());
      ready = [this](size_t from) { sync_->OnGradientsReady(from); };
    }
    loss += ForwardBackward(batch_, 1.0f / accumulation, ready) / accumulation;
  }
  // Read this rank's slice of the next global batch while the update runs.
  loader_.Prefetch(loader_.RankFirstSample(samples_seen_ + config_.global_batch),
                   config_.global_batch / dp_size());
  return ApplyUpdate(loss, config_.global_batch, sync_ != nullptr);
}

StepStats Trainer::StepOn(const MicroBatch& batch) {
  DT_CHECK(sync_ == nullptr, "StepOn is for one process");
  std::memset(model_.grads(), 0, model_.num_params() * sizeof(float));
  const double loss = ForwardBackward(batch, 1.0f);
  return *ApplyUpdate(loss, batch.size, false);
}

Result<StepStats> Trainer::ApplyUpdate(double loss, int64_t samples, bool synchronised) {
  StepStats stats;
  float* params = model_.params();
  const float* grads = model_.grads();
  // Data parallel: average the gradients (and the loss, for reporting) over the group.
  float reduced[2] = {static_cast<float>(loss), 0.0f};
  if (synchronised) {
    Result<double> waited = sync_->Finish();
    if (!waited.ok()) return waited.status();
    stats.comm_wait_seconds = *waited;
  }
  double sum_squares = 0;
  for (const parallel::Range& r : owned())
    sum_squares += SumOfSquares(grads + r.begin, r.size());
  reduced[1] = static_cast<float>(sum_squares);
  if (synchronised) {
    DT_RETURN_IF_ERROR(dp_.comm->AllReduce(reduced, 2, parallel::ReduceOp::kSum)
                           .WithContext("reducing loss and gradient norm"));
    reduced[0] /= static_cast<float>(dp_size());
    // With ZeRO-1 the ranks' sums cover disjoint pieces and add up; without it every rank
    // summed the whole (identical) averaged gradient.
    if (!sync_->zero1()) reduced[1] /= static_cast<float>(dp_size());
    stats.loss = reduced[0];
    sum_squares = reduced[1];
  } else {
    stats.loss = loss;
  }
  stats.grad_norm = std::sqrt(sum_squares);
  stats.lr = LearningRate(config_.optimizer, step_);
  const double clip = ClipScale(stats.grad_norm, config_.optimizer.grad_clip);
  size_t moment = 0;
  for (const parallel::Range& r : owned()) {
    AdamWUpdate(params + r.begin, grads + r.begin, exp_avg_.data() + moment,
                exp_avg_sq_.data() + moment, r.size(), stats.lr, clip, step_ + 1,
                config_.optimizer);
    moment += r.size();
  }
  if (sync_) DT_RETURN_IF_ERROR(sync_->GatherParameters(params));
  EmaUpdate(ema_.data(), params, model_.num_params(), config_.optimizer.ema_decay);
  ++step_;
  samples_seen_ += samples;
  stats.step = step_;
  return stats;
}

void Trainer::AddToCheckpoint(io::SafetensorsWriter& shard) const {
  const DiTConfig& m = config_.model;
  if (dp_rank() == 0) {
    for (const TensorSpec& t : model_.parameter_table().tensors()) {
      shard.AddF32(t.name, t.shape, model_.params() + t.offset);
    }
    shard.AddF32("pos_embed", {1, m.tokens(), m.hidden_size}, model_.pos_embed());
    for (const TensorSpec& t : model_.parameter_table().tensors()) {
      shard.AddF32("ema." + t.name, t.shape, ema_.data() + t.offset);
    }
  }
  // Without ZeRO-1 every rank holds the same full moments: rank 0 saves them once.
  const bool sharded = sync_ != nullptr && sync_->zero1();
  const std::vector<parallel::Range> none;
  const std::vector<parallel::Range>& saved = sharded || dp_rank() == 0 ? owned() : none;
  const int64_t moments = saved.empty() ? 0 : static_cast<int64_t>(owned_elements_);
  if (moments > 0) {
    shard.AddF32("optim.exp_avg", {moments}, exp_avg_.data());
    shard.AddF32("optim.exp_avg_sq", {moments}, exp_avg_sq_.data());
  }
  shard.SetMetadata("format", "difftrain-checkpoint-shard");
  shard.SetMetadata("version", "1");
  shard.SetMetadata("step", std::to_string(step_));
  shard.SetMetadata("samples_seen", std::to_string(samples_seen_));
  shard.SetMetadata("seed", std::to_string(config_.seed));
  shard.SetMetadata("config", m.ToJson().dump());
  shard.SetMetadata("train", config_.ToJson().dump());
  shard.SetMetadata("dp_rank", std::to_string(dp_rank()));
  shard.SetMetadata("dp_size", std::to_string(dp_size()));
  shard.SetMetadata("optim.ranges", RangesJson(saved).dump());
}

Status Trainer::RestoreModel(const io::SafetensorsFile& shard) {
  const auto& meta = shard.metadata();
  auto field = [&](const std::string& key) -> Result<std::string> {
    auto it = meta.find(key);
    if (it == meta.end()) return Errorf("'{}': metadata has no '{}'", shard.path(), key);
    return it->second;
  };
  DT_ASSIGN_OR_RETURN(std::string format, field("format"));
  if (format != "difftrain-checkpoint-shard") {
    return Errorf("'{}': not a difftrain checkpoint shard (format '{}')", shard.path(), format);
  }
  DT_ASSIGN_OR_RETURN(std::string config_text, field("config"));
  nlohmann::json saved = nlohmann::json::parse(config_text, nullptr, false);
  const nlohmann::json ours = config_.model.ToJson();
  if (saved != ours) {
    return Errorf("'{}': checkpoint is of model {} but this run trains {}", shard.path(),
                  saved.dump(), ours.dump());
  }
  DT_ASSIGN_OR_RETURN(std::string seed, field("seed"));
  if (seed != std::to_string(config_.seed)) {
    return Errorf("'{}': checkpoint was trained with seed {} but this run has seed {}",
                  shard.path(), seed, config_.seed);
  }
  for (const TensorSpec& t : model_.parameter_table().tensors()) {
    DT_RETURN_IF_ERROR(shard.CopyF32(t.name, t.shape, model_.params() + t.offset));
    DT_RETURN_IF_ERROR(shard.CopyF32("ema." + t.name, t.shape, ema_.data() + t.offset));
  }
  DT_ASSIGN_OR_RETURN(std::string step, field("step"));
  DT_ASSIGN_OR_RETURN(std::string seen, field("samples_seen"));
  try {
    step_ = std::stoll(step);
    samples_seen_ = std::stoll(seen);
  } catch (const std::exception&) {
    return Errorf("'{}': malformed step '{}' or samples_seen '{}'", shard.path(), step, seen);
  }
  if (samples_seen_ != step_ * config_.global_batch) {
    return Errorf("'{}': {} samples seen in {} steps do not match this run's global batch {}",
                  shard.path(), samples_seen_, step_, config_.global_batch);
  }
  return Status::Ok();
}

Result<size_t> Trainer::RestoreOptimizer(const io::SafetensorsFile& shard) {
  auto it = shard.metadata().find("optim.ranges");
  if (it == shard.metadata().end()) {
    return Errorf("'{}': metadata has no 'optim.ranges'", shard.path());
  }
  const nlohmann::json ranges = nlohmann::json::parse(it->second, nullptr, false);
  if (!ranges.is_array()) return Errorf("'{}': malformed 'optim.ranges'", shard.path());
  size_t held = 0;
  for (const auto& r : ranges) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() ||
        !r[1].is_number_unsigned() || r[0].get<size_t>() > r[1].get<size_t>() ||
        r[1].get<size_t>() > model_.num_params()) {
      return Errorf("'{}': malformed range {} in 'optim.ranges'", shard.path(), r.dump());
    }
    held += r[1].get<size_t>() - r[0].get<size_t>();
  }
  if (held == 0) return size_t{0};
  const io::TensorView* m = shard.Find("optim.exp_avg");
  const io::TensorView* v = shard.Find("optim.exp_avg_sq");
  if (m == nullptr || v == nullptr || m->dtype != io::DType::kF32 || v->dtype != io::DType::kF32 ||
      m->bytes != held * sizeof(float) || v->bytes != held * sizeof(float)) {
    return Errorf("'{}': optimizer moments do not match its {} elements of 'optim.ranges'",
                  shard.path(), held);
  }
  // Copy every overlap of a saved range with an owned range.
  size_t copied = 0, saved_offset = 0;
  for (const auto& r : ranges) {
    const parallel::Range saved{r[0].get<size_t>(), r[1].get<size_t>()};
    size_t owned_offset = 0;
    for (const parallel::Range& o : owned()) {
      const size_t begin = std::max(saved.begin, o.begin), end = std::min(saved.end, o.end);
      if (begin < end) {
        const size_t from = (saved_offset + begin - saved.begin) * sizeof(float);
        const size_t to = owned_offset + begin - o.begin;
        std::memcpy(exp_avg_.data() + to, static_cast<const char*>(m->data) + from,
                    (end - begin) * sizeof(float));
        std::memcpy(exp_avg_sq_.data() + to, static_cast<const char*>(v->data) + from,
                    (end - begin) * sizeof(float));
        copied += end - begin;
      }
      owned_offset += o.size();
    }
    saved_offset += saved.size();
  }
  return copied;
}

}  // namespace difftrain
