// The Trainer's data (model/train/trainer.h): opening what a run trains on (config.data, cut by
// data.max_samples, and DreamBooth's prior) and checking it against the model, the data
// loaders' options, and making micro-batches of it: each sample's x0 from the loader, its
// noise, timestep and label dropout from its own random stream.
#include "model/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "model/tensor/rng.h"

namespace difftrain {

Status CheckBucketsFitTraining(const Dataset& d, const TrainConfig& config, const std::string& kind,
                               bool announce) {
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
  if (!announce) return Status::Ok();
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

}  // namespace

DataLoaderOptions Trainer::LoaderOptions(const TrainConfig& config, int dp_rank, int dp_size) {
  DataLoaderOptions o;
  o.seed = config.seed;
  o.batch_size = config.global_batch / dp_size;  // this rank's samples of one global batch
  o.dp_rank = dp_rank;
  o.dp_size = dp_size;
  o.shuffle = config.data.shuffle;
  o.horizontal_flip = config.data.horizontal_flip;
  return o;
}

// The prior's loader draws its own permutations: a seed of its own, from the job's.
DataLoaderOptions Trainer::PriorLoaderOptions(const TrainConfig& config, int dp_rank, int dp_size) {
  DataLoaderOptions o = LoaderOptions(config, dp_rank, dp_size);
  o.seed = config.seed ^ 0x5052494f52ull;  // "PRIOR"
  return o;
}

Result<std::pair<std::unique_ptr<Dataset>, std::unique_ptr<Dataset>>> Trainer::OpenData(
    const TrainConfig& config, const SampleSchema& m, bool announce) {
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
    if (announce && unbounded) {
      spdlog::info("data: the first {} samples (data.max_samples)", (*opened)->size());
    } else if (announce && (*opened)->size() < all) {
      spdlog::info("data: {} of the {} samples, at random (data.max_samples)", (*opened)->size(),
                   all);
    }
  }
  DT_RETURN_IF_ERROR(CheckDataFitsModel(**opened, m, config.data.kind).WithContext("data"));
  DT_RETURN_IF_ERROR(
      CheckBucketsFitTraining(**opened, config, config.data.kind, announce).WithContext("data"));
  std::unique_ptr<Dataset> prior;
  if (config.data.has_prior()) {
    DT_ASSIGN_OR_RETURN(prior, OpenPriorData(config, **opened, m));
    if (announce)
      spdlog::info(
          "data: prior preservation with the {} samples of {}: half of every micro-batch, their "
          "loss weighted {}",
          prior->size(), config.data.prior_path, config.data.prior_loss_weight);
  }
  return std::pair(std::move(opened).value(), std::move(prior));
}

Status Trainer::ResolveEpochs(TrainConfig& config) {
  if (config.epochs < 1 || config.steps > 0) return Status::Ok();
  const std::string where = config.cluster.Where("train.epochs");
  const SampleSchema m = FamilyOf(config.model).Samples(config.model);
  Result<std::pair<std::unique_ptr<Dataset>, std::unique_ptr<Dataset>>> opened =
      OpenData(config, m, /*announce=*/false);
  if (!opened.ok()) return opened.status().WithContext(where + ": train.epochs");
  const Dataset& data = *opened->first;
  if (data.unbounded()) {
    return Errorf(
        "{}: train.epochs: data.kind {} has a sample at every index and no epochs; give "
        "data.max_samples (an epoch of that many samples) or train.steps",
        where, config.data.kind);
  }
  DataLoaderOptions options = LoaderOptions(config, /*dp_rank=*/0, /*dp_size=*/1);
  options.prefetch = false;
  // One epoch is the loader's: the data's samples, or the buckets' whole global batches.
  const int64_t epoch = DataLoader(data, options).epoch_samples();
  // With a prior, half of each step's samples are the prior's, which has epochs of its own.
  const int64_t per_step = config.data.has_prior() ? config.global_batch / 2 : config.global_batch;
  const int64_t kMaxSteps = int64_t{1} << 40;
  if (config.epochs > kMaxSteps / std::max<int64_t>(epoch, 1)) {
    return Errorf("{}: train.epochs {} of {} samples are more than {} samples", where,
                  config.epochs, epoch, kMaxSteps);
  }
  config.epoch_samples = epoch;
  config.steps = (config.epochs * epoch + per_step - 1) / per_step;
  return Status::Ok();
}

double Trainer::epochs_seen() const {
  const int64_t epoch = loader_.epoch_samples();
  if (data_->unbounded() || epoch < 1) return 0;
  // With a prior, half of every step's samples are the prior's.
  const int64_t seen = prior_loader_ ? samples_seen_ / 2 : samples_seen_;
  return static_cast<double>(seen) / static_cast<double>(epoch);
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
  if (texts_) {
    batch.texts.resize(B);
    batch.text_dropped.assign(B, 0);
  }
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
  // Both halves have texts or neither (Create checked). A run that trains through the text
  // encoder encodes its own.
  const bool data_texts = text > 0 && data_->texts() != nullptr && !texts_;
  for (const Part& part : parts) {
    if (part.loader == nullptr) continue;
    for (int b = 0; b < own && texts_; ++b) {
      // The sample's caption, or a template drawn from its own stream.
      const TextTable* table = part.data->texts();
      const std::string caption =
          table ? table->captions[part.data->TextId(part.loader->IndexOf(from + b))] : "";
      Rng pick(config_.seed, RngStream::kPrompt, static_cast<uint64_t>(first + part.offset + b));
      try {
        batch.texts[part.offset + b] = texts_->Tokenize(texts_->Text(caption, pick.NextU64()));
      } catch (const std::invalid_argument& e) {
        return Errorf("data: the caption \"{}\": {}", caption, e.what());
      }
    }
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
      if (texts_) {
        batch.text_dropped[b] = dropped;  // the context is the encoder's (Trainer::EncodeTexts)
      } else if (dropped) {
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

void Trainer::Prefetch(int64_t first, int count) {
  if (!prior_loader_) {
    loader_.Prefetch(first, count);
    return;
  }
  loader_.Prefetch(first / 2, count / 2);
  prior_loader_->Prefetch(first / 2, count / 2);
}

}  // namespace difftrain
