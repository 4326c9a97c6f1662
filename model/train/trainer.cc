#include "model/train/trainer.h"

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/optim/adamw.h"
#include "model/tensor/rng.h"

namespace difftrain {

namespace {

DataLoaderOptions LoaderOptions(const TrainConfig& config) {
  DataLoaderOptions o;
  o.seed = config.seed;
  o.batch_size = config.global_batch;  // this process's samples of one global batch
  o.shuffle = config.data.shuffle;
  o.horizontal_flip = config.data.horizontal_flip;
  return o;
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config) {
  DT_RETURN_IF_ERROR(config.Validate());
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
  return std::make_unique<Trainer>(config, std::move(opened).value());
}

Trainer::Trainer(const TrainConfig& config, std::unique_ptr<Dataset> data)
    : config_(config),
      data_(std::move(data)),
      loader_(*data_, LoaderOptions(config)),
      model_(config.model),
      diffusion_(config.diffusion),
      ema_(model_.num_params()),
      exp_avg_(model_.num_params()),
      exp_avg_sq_(model_.num_params()) {
  DT_CHECK(data_->channels() == config.model.in_channels &&
               data_->height() == config.model.input_size &&
               data_->width() == config.model.input_size,
           "dataset shape does not match the model");
  model_.InitializeReference(config.seed);
  std::memcpy(ema_.data(), model_.params(), ema_.bytes());
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
    const int64_t sample = first + b;
    Rng rng(config_.seed, RngStream::kNoise, static_cast<uint64_t>(sample));
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

double Trainer::ForwardBackward(const MicroBatch& batch, float grad_scale) {
  const DiTConfig& m = config_.model;
  const int HW = m.input_size * m.input_size;
  last_output_ = model_.Forward(batch.x_t.data(), batch.t_float.data(), batch.y.data(), batch.size);
  dout_.resize(static_cast<size_t>(batch.size) * m.out_channels() * HW);
  const double loss = EpsilonMseLoss(last_output_, batch.noise.data(), batch.size, m.in_channels,
                                     m.out_channels(), HW, grad_scale, dout_.data());
  model_.Backward(dout_.data());
  return loss;
}

Result<StepStats> Trainer::Step() {
  const int accumulation = config_.AccumulationSteps();
  std::memset(model_.grads(), 0, model_.num_params() * sizeof(float));
  double loss = 0;
  for (int i = 0; i < accumulation; ++i) {
    const int64_t first = samples_seen_ + static_cast<int64_t>(i) * config_.micro_batch;
    DT_RETURN_IF_ERROR(MakeMicroBatch(first, config_.micro_batch, batch_));
    loss += ForwardBackward(batch_, 1.0f / accumulation) / accumulation;
  }
  // Read the next global batch while the optimizer runs and the next step begins.
  loader_.Prefetch(samples_seen_ + config_.global_batch, config_.global_batch);
  return ApplyUpdate(loss, config_.global_batch);
}

StepStats Trainer::StepOn(const MicroBatch& batch) {
  std::memset(model_.grads(), 0, model_.num_params() * sizeof(float));
  const double loss = ForwardBackward(batch, 1.0f);
  return ApplyUpdate(loss, batch.size);
}

StepStats Trainer::ApplyUpdate(double loss, int64_t samples) {
  const size_t n = model_.num_params();
  StepStats stats;
  stats.loss = loss;
  stats.grad_norm = std::sqrt(SumOfSquares(model_.grads(), n));
  stats.lr = LearningRate(config_.optimizer, step_);
  AdamWUpdate(model_.params(), model_.grads(), exp_avg_.data(), exp_avg_sq_.data(), n, stats.lr,
              ClipScale(stats.grad_norm, config_.optimizer.grad_clip), step_ + 1,
              config_.optimizer);
  EmaUpdate(ema_.data(), model_.params(), n, config_.optimizer.ema_decay);
  ++step_;
  samples_seen_ += samples;
  stats.step = step_;
  return stats;
}

void Trainer::AddToCheckpoint(io::SafetensorsWriter& shard) const {
  const DiTConfig& m = config_.model;
  for (const TensorSpec& t : model_.parameter_table().tensors()) {
    shard.AddF32(t.name, t.shape, model_.params() + t.offset);
  }
  shard.AddF32("pos_embed", {1, m.tokens(), m.hidden_size}, model_.pos_embed());
  for (const TensorSpec& t : model_.parameter_table().tensors()) {
    shard.AddF32("ema." + t.name, t.shape, ema_.data() + t.offset);
    shard.AddF32("optim.exp_avg." + t.name, t.shape, exp_avg_.data() + t.offset);
    shard.AddF32("optim.exp_avg_sq." + t.name, t.shape, exp_avg_sq_.data() + t.offset);
  }
  shard.SetMetadata("format", "difftrain-checkpoint-shard");
  shard.SetMetadata("version", "1");
  shard.SetMetadata("step", std::to_string(step_));
  shard.SetMetadata("samples_seen", std::to_string(samples_seen_));
  shard.SetMetadata("seed", std::to_string(config_.seed));
  shard.SetMetadata("config", m.ToJson().dump());
  shard.SetMetadata("train", config_.ToJson().dump());
}

Status Trainer::RestoreFromCheckpoint(const io::SafetensorsFile& shard) {
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
    DT_RETURN_IF_ERROR(
        shard.CopyF32("optim.exp_avg." + t.name, t.shape, exp_avg_.data() + t.offset));
    DT_RETURN_IF_ERROR(
        shard.CopyF32("optim.exp_avg_sq." + t.name, t.shape, exp_avg_sq_.data() + t.offset));
  }
  DT_ASSIGN_OR_RETURN(std::string step, field("step"));
  DT_ASSIGN_OR_RETURN(std::string seen, field("samples_seen"));
  try {
    step_ = std::stoll(step);
    samples_seen_ = std::stoll(seen);
  } catch (const std::exception&) {
    return Errorf("'{}': malformed step '{}' or samples_seen '{}'", shard.path(), step, seen);
  }
  return Status::Ok();
}

}  // namespace difftrain
