// The Trainer's checkpoints (model/train/trainer.h): gathering every tp rank's and stage's
// shard of the parameters, EMA and AdamW moments onto rank 0 as it writes them into a shard file,
// and restoring a rank's own shard (and the moments it owns under ZeRO-1) from a checkpoint.
#include "model/train/trainer.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "model/train/initial_weights.h"

namespace difftrain {

Result<ModelSpec> CheckpointModel(const io::SafetensorsFile& shard0) {
  const auto& meta = shard0.metadata();
  auto config = meta.find("config");
  if (config == meta.end()) return Errorf("'{}': metadata has no 'config'", shard0.path());
  const nlohmann::json json = nlohmann::json::parse(config->second, nullptr, false);
  if (json.is_discarded()) return Errorf("'{}': metadata 'config' is not JSON", shard0.path());
  auto family = meta.find("family");
  Result<ModelSpec> spec =
      ModelSpecFromJson(family == meta.end() ? std::string("dit") : family->second, json);
  if (!spec.ok()) return spec.status().WithContext(fmt::format("'{}'", shard0.path()));
  return spec;
}

Status ReadModelArena(const io::SafetensorsFile& shard0, const TensorTable& global, bool ema,
                      float* out) {
  return ReadModelFragments(shard0, global, {{0, 0, global.total()}}, ema, out);
}

Status ReadModelFragments(const io::SafetensorsFile& shard0, const TensorTable& global,
                          const std::vector<Fragment>& fragments, bool ema, float* local) {
  std::vector<Fragment> by_global = fragments;
  std::sort(by_global.begin(), by_global.end(),
            [](const Fragment& a, const Fragment& b) { return a.global < b.global; });
  for (const TensorSpec& t : global.tensors()) {
    DT_ASSIGN_OR_RETURN(const io::TensorView* view,
                        shard0.FindF32(ema ? "ema." + t.name : t.name, t.shape));
    const size_t begin = t.offset, end = t.offset + t.numel;
    const char* data = static_cast<const char*>(view->data);
    // Fragments are disjoint: only the last one to start at or before `begin` can hold it.
    auto f = std::upper_bound(by_global.begin(), by_global.end(), begin,
                              [](size_t at, const Fragment& g) { return at < g.global; });
    if (f != by_global.begin()) --f;
    for (; f != by_global.end() && f->global < end; ++f) {
      const size_t from = std::max(begin, f->global), to = std::min(end, f->global + f->length);
      if (from >= to) continue;
      std::memcpy(local + f->local + (from - f->global), data + (from - begin) * sizeof(float),
                  (to - from) * sizeof(float));
    }
    shard0.Forget(view->data, view->bytes);
  }
  return Status::Ok();
}

Status Trainer::GatherArena(const float* mine, float* whole) {
  model_->GatherToGlobal(mine, whole);
  if (!parallel_.topology) return Status::Ok();
  // Every other tp rank and stage of replica (cp 0, dp 0) sends its arenas in the same order.
  const Topology& t = *parallel_.topology;
  for (int stage = 0; stage < t.pp(); ++stage) {
    for (int tp = 0; tp < t.tp(); ++tp) {
      const int peer = t.RankOf({tp, 0, 0, stage});
      if (peer == parallel_.rank) continue;
      Result<ModelPartition> part =
          FamilyOf(config_.model).Partition(config_.model, parallel_.layout(), tp, 0, stage);
      DT_CHECK(part.ok(), "{}", part.status().message());
      const ShardedParameters& theirs = part->parameters;
      if (peer_shard_.size() < theirs.table.total())
        peer_shard_ = Buffer<float>(theirs.table.total());
      float* local = peer_shard_.data();
      DT_RETURN_IF_ERROR(parallel_.world->Recv(local, theirs.table.total(), peer)
                             .WithContext("gathering the checkpoint"));
      // Replicated tensors are computed identically on every tp rank (model/dit/shard.h);
      // tp rank 0's copy is already in place and this one must be the same, bit for bit.
      for (size_t k = 0; k < theirs.table.tensors().size() && tp > 0; ++k) {
        const TensorSpec& spec = theirs.table.tensors()[k];
        if (theirs.split[k]) continue;
        const float* ours = whole + model_->global_parameter_table().Find(spec.name)->offset;
        DT_CHECK(std::memcmp(ours, local + spec.offset, spec.numel * sizeof(float)) == 0,
                 "replicated tensor {} differs between tensor-parallel ranks 0 and {}", spec.name,
                 tp);
      }
      for (const Fragment& f : theirs.fragments)
        std::memcpy(whole + f.global, local + f.local, f.length * sizeof(float));
    }
  }
  return Status::Ok();
}

void Trainer::AddSavedModel(io::SafetensorsWriter& shard,
                            const std::unordered_map<size_t, const float*>& ema_at,
                            const std::function<Status(int arena)>& gather) const {
  const TensorTable& global = model_->global_parameter_table();
  if (gather) shard.AddFill([gather] { return gather(0); });
  for (const TensorSpec& t : global.tensors())
    shard.AddF32(t.name, t.shape, saved_view_[0] + t.offset);
  for (const FixedTensor& f : model_->fixed_tensors())
    shard.AddF32(f.name, f.shape, f.data);
  if (gather) shard.AddFill([gather] { return gather(1); });
  for (const TensorSpec& t : global.tensors()) {
    const auto at = ema_at.find(t.offset);
    shard.AddF32("ema." + t.name, t.shape,
                 at != ema_at.end() ? at->second : saved_view_[1] + t.offset);
  }
}

size_t Trainer::checkpoint_bytes() const {
  size_t bytes = 0;
  for (const Buffer<float>& saved : saved_)
    bytes += saved.bytes();
  for (const Buffer<float>& moments : zero1_moments_)
    bytes += moments.bytes();
  return bytes + peer_shard_.bytes();
}

void Trainer::ReleaseCheckpoint() {
  checkpoint_peak_bytes_ = std::max(checkpoint_peak_bytes_, checkpoint_bytes());
  peer_shard_ = Buffer<float>();
  for (Buffer<float>& saved : saved_)
    saved = Buffer<float>();
  for (Buffer<float>& moments : zero1_moments_)
    moments = Buffer<float>();
  for (const float*& view : saved_view_)
    view = nullptr;
}

void Trainer::AddLoraToCheckpoint(io::SafetensorsWriter& shard) {
  // The model and its EMA as they sample (the adapters fused: what `sample`, `export` and
  // init_from read of any checkpoint), the frozen weights the adapters apply to, the adapters.
  // A LoRA rank holds the whole model (no tp, no pp): its arena is written as it is, and as its
  // EMA but for the adapted weights, which are fused with the EMA's adapters into a copy the
  // size of the frozen ones (not of the whole model).
  DT_CHECK(model_->holds_whole_model(), "a LoRA run's rank holds the whole model");
  saved_view_[0] = saved_view_[1] = model_->params();
  saved_[1] = Buffer<float>(lora_->model_base_size());
  lora_->ApplyToBase(ema_.data(), saved_[1].data());
  std::unordered_map<size_t, const float*> fused;
  for (const LoraModule& m : lora_->modules()) {
    if (m.part == 0) fused[m.weight] = saved_[1].data() + m.base;
  }
  AddSavedModel(shard, fused);
  for (const LoraModule& m : lora_->modules())
    shard.AddF32("lora.base." + m.name + ".weight", m.shape, lora_->base() + m.base);
  for (const TensorSpec& t : lora_->table().tensors()) {
    shard.AddF32("lora." + t.name, t.shape, lora_->params() + t.offset);
    shard.AddF32("ema.lora." + t.name, t.shape, ema_.data() + t.offset);
  }
  const int64_t total = static_cast<int64_t>(lora_->size());
  shard.AddF32("optim.exp_avg", {total}, exp_avg_.data());
  shard.AddF32("optim.exp_avg_sq", {total}, exp_avg_sq_.data());
}

void Trainer::AddTextualInversionToCheckpoint(io::SafetensorsWriter& shard) {
  // The model, frozen, is its own EMA; the vectors and their EMA, under the token's name in
  // the metadata (export --format textual_inversion).
  DT_CHECK(model_->holds_whole_model(), "a textual inversion's rank holds the whole model");
  saved_view_[0] = saved_view_[1] = model_->params();
  AddSavedModel(shard);
  const std::vector<int64_t> shape = {inversion_->vectors(), inversion_->dim()};
  shard.AddF32(std::string(kInversionVectors), shape, inversion_->params());
  shard.AddF32("ema." + std::string(kInversionVectors), shape, ema_.data());
  const int64_t total = static_cast<int64_t>(inversion_->size());
  shard.AddF32("optim.exp_avg", {total}, exp_avg_.data());
  shard.AddF32("optim.exp_avg_sq", {total}, exp_avg_sq_.data());
}

Status Trainer::AddToCheckpoint(io::SafetensorsWriter& shard) {
  nlohmann::json ranges = nlohmann::json::array();
  if (inversion_) {
    // Every rank holds the same vectors and moments: rank 0 writes.
    if (parallel_.rank == 0) {
      AddTextualInversionToCheckpoint(shard);
      ranges.push_back({0, inversion_->size()});
    }
    nlohmann::json inversion = config_.textual_inversion.ToJson();
    inversion["text_encoder"] = inversion_->embedder().path();  // as resolved
    shard.SetMetadata(std::string(kInversionMetadata), inversion.dump());
  } else if (lora_) {
    // Every rank holds the same adapters and moments (no ZeRO-1, no tp or pp): rank 0 writes.
    if (parallel_.rank == 0) {
      AddLoraToCheckpoint(shard);
      ranges.push_back({0, lora_->size()});
    }
    nlohmann::json lora = config_.lora.ToJson();
    if (text_lora_) lora["text_encoder"] = text_lora_->embedder().path();  // as resolved
    shard.SetMetadata("lora", lora.dump());
  } else {
    DT_RETURN_IF_ERROR(AddModelToCheckpoint(shard, ranges));
  }
  shard.SetMetadata("format", "difftrain-checkpoint-shard");
  shard.SetMetadata("version", "1");
  shard.SetMetadata("step", std::to_string(step_));
  shard.SetMetadata("samples_seen", std::to_string(samples_seen_));
  shard.SetMetadata("seed", std::to_string(config_.seed));
  shard.SetMetadata("family", config_.model.family);
  shard.SetMetadata("config", config_.model.config.dump());
  shard.SetMetadata("train", config_.ToJson().dump());
  shard.SetMetadata("dp_rank", std::to_string(dp_rank()));
  shard.SetMetadata("dp_size", std::to_string(dp_size()));
  shard.SetMetadata("optim.ranges", ranges.dump());
  return Status::Ok();
}

Status Trainer::AddModelToCheckpoint(io::SafetensorsWriter& shard, nlohmann::json& ranges) {
  const size_t n = model_->num_params();
  // Rank 0 writes the whole model: the only rank of a data-parallel layout that needs the
  // device's arenas on the host.
  if (gpu_ && parallel_.rank == 0 && !gpu_stale_) {
    gpu_->DownloadState(model_->params(), ema_.data(), exp_avg_.data(), exp_avg_sq_.data());
  }
  // The whole moments of this rank's shard: with ZeRO-1 every dp-cp rank owns pieces of them.
  const float* moments = exp_avg_.data();
  const float* moments_sq = exp_avg_sq_.data();
  // Kept by the trainer: the shard may write straight from them, or rank 0 gather them
  // (GatherArena).
  Buffer<float>& whole_m = zero1_moments_[0];
  Buffer<float>& whole_v = zero1_moments_[1];
  if (sync_ && sync_->zero1()) {
    whole_m = Buffer<float>(n);
    whole_v = Buffer<float>(n);
    size_t moment = 0;
    for (const parallel::Range& r : owned()) {
      std::memcpy(whole_m.data() + r.begin, exp_avg_.data() + moment, r.size() * sizeof(float));
      std::memcpy(whole_v.data() + r.begin, exp_avg_sq_.data() + moment, r.size() * sizeof(float));
      moment += r.size();
    }
    DT_RETURN_IF_ERROR(sync_->GatherParameters(whole_m.data()).WithContext("checkpoint moments"));
    DT_RETURN_IF_ERROR(sync_->GatherParameters(whole_v.data()).WithContext("checkpoint moments"));
    moments = whole_m.data();
    moments_sq = whole_v.data();
  }
  const float* mine[4] = {model_->params(), ema_.data(), moments, moments_sq};
  if (parallel_.rank != 0) {
    if (coords_.cp != 0 || coords_.dp != 0) return Status::Ok();
    for (const float* arena : mine) {
      DT_RETURN_IF_ERROR(
          parallel_.world->Send(arena, n, 0).WithContext("sending the checkpoint to rank 0"));
    }
    return Status::Ok();
  }
  // Rank 0 writes the whole model's four arenas. Where its own are the whole model's, the shard
  // writes straight from them. Otherwise it gathers one arena at a time into one whole-model
  // buffer as the file reaches it, and each peer's sends wait their turn: one copy of the model,
  // not four.
  std::function<Status(int)> gather;
  if (model_->holds_whole_model()) {
    for (int i = 0; i < 4; ++i)
      saved_view_[i] = mine[i];
  } else {
    saved_[0] = Buffer<float>(model_->global_parameter_table().total());
    for (const float*& view : saved_view_)
      view = saved_[0].data();
    gather = [this, mine](int arena) { return GatherArena(mine[arena], saved_[0].data()); };
  }
  const TensorTable& global = model_->global_parameter_table();
  AddSavedModel(shard, {}, gather);
  const int64_t total = static_cast<int64_t>(global.total());
  if (gather) shard.AddFill([gather] { return gather(2); });
  shard.AddF32("optim.exp_avg", {total}, saved_view_[2]);
  if (gather) shard.AddFill([gather] { return gather(3); });
  shard.AddF32("optim.exp_avg_sq", {total}, saved_view_[3]);
  ranges.push_back({0, global.total()});
  return Status::Ok();
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
  DT_ASSIGN_OR_RETURN(const ModelSpec saved, CheckpointModel(shard));
  if (saved != config_.model) {
    return Errorf("'{}': checkpoint is of model {} {} but this run trains {} {}", shard.path(),
                  saved.family, saved.config.dump(), config_.model.family,
                  config_.model.config.dump());
  }
  DT_ASSIGN_OR_RETURN(std::string seed, field("seed"));
  if (seed != std::to_string(config_.seed)) {
    return Errorf("'{}': checkpoint was trained with seed {} but this run has seed {}",
                  shard.path(), seed, config_.seed);
  }
  // The checkpoint holds the whole model: this rank takes its shard of it.
  if (!lora_ && meta.contains("lora")) {
    return Errorf("'{}': checkpoint trained LoRA adapters {} but this run trains the whole model",
                  shard.path(), meta.at("lora"));
  }
  if (!inversion_ && meta.contains(std::string(kInversionMetadata))) {
    return Errorf("'{}': checkpoint trained a textual inversion {} but this run does not",
                  shard.path(), meta.at(std::string(kInversionMetadata)));
  }
  // This rank's fragments, straight out of the mapped shard: no whole-model copy.
  const auto read = [&](bool ema, float* local) {
    return ReadModelFragments(shard, model_->global_parameter_table(), model_->sharded().fragments,
                              ema, local);
  };
  DT_RETURN_IF_ERROR(read(/*ema=*/false, model_->params()));
  if (lora_) {
    DT_RETURN_IF_ERROR(RestoreLora(shard));
  } else if (inversion_) {
    DT_RETURN_IF_ERROR(RestoreTextualInversion(shard));
  } else {
    DT_RETURN_IF_ERROR(read(/*ema=*/true, ema_.data()));
  }
  gpu_stale_ = gpu_ != nullptr;
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

Status Trainer::RestoreLora(const io::SafetensorsFile& shard) {
  nlohmann::json want = config_.lora.ToJson();
  auto saved = shard.metadata().find("lora");
  if (saved == shard.metadata().end()) {
    return Errorf("'{}': checkpoint trained the whole model but this run trains LoRA adapters {}",
                  shard.path(), want.dump());
  }
  // The same adapters (a text encoder's may have moved: its path is not compared).
  nlohmann::json theirs = nlohmann::json::parse(saved->second, nullptr, false);
  if (theirs.is_object() && theirs.contains("text_encoder")) theirs["text_encoder"] = "";
  if (want.contains("text_encoder")) want["text_encoder"] = "";
  if (theirs != want) {
    return Errorf("'{}': checkpoint trained LoRA adapters {} but this run's are {}", shard.path(),
                  saved->second, want.dump());
  }
  // The model's arena holds the fused weights (the text encoder's weights the adapted ones); the
  // targets' frozen ones are kept apart.
  for (const LoraModule& m : lora_->modules()) {
    float* part = m.part == 0 ? model_->params() : text_weights();
    DT_RETURN_IF_ERROR(shard.CopyF32("lora.base." + m.name + ".weight", m.shape, part + m.weight));
  }
  lora_->SetBase(model_->params(), text_weights());
  for (const TensorSpec& t : lora_->table().tensors()) {
    DT_RETURN_IF_ERROR(shard.CopyF32("lora." + t.name, t.shape, lora_->params() + t.offset));
    DT_RETURN_IF_ERROR(shard.CopyF32("ema.lora." + t.name, t.shape, ema_.data() + t.offset));
  }
  lora_->Apply(lora_->params(), model_->params(), text_weights());
  return Status::Ok();
}

Status Trainer::RestoreTextualInversion(const io::SafetensorsFile& shard) {
  auto saved = shard.metadata().find(std::string(kInversionMetadata));
  if (saved == shard.metadata().end()) {
    return Errorf(
        "'{}': checkpoint trained the whole model but this run trains a textual "
        "inversion of {}",
        shard.path(), config_.textual_inversion.token);
  }
  // The same token, vectors and texts (the encoder may have moved: its path is not compared).
  nlohmann::json theirs = nlohmann::json::parse(saved->second, nullptr, false);
  nlohmann::json ours = config_.textual_inversion.ToJson();
  if (theirs.is_object()) theirs.erase("text_encoder");
  ours.erase("text_encoder");
  if (theirs != ours) {
    return Errorf("'{}': checkpoint trained the textual inversion {} but this run's is {}",
                  shard.path(), saved->second, ours.dump());
  }
  const std::vector<int64_t> shape = {inversion_->vectors(), inversion_->dim()};
  DT_RETURN_IF_ERROR(shard.CopyF32(std::string(kInversionVectors), shape, inversion_->params()));
  DT_RETURN_IF_ERROR(shard.CopyF32("ema." + std::string(kInversionVectors), shape, ema_.data()));
  inversion_->Apply(inversion_->params());
  return Status::Ok();
}

Result<std::vector<std::string>> Trainer::InitializeFrom(const io::SafetensorsFile& file) {
  const TensorTable& global = model_->global_parameter_table();
  std::vector<std::string> fixed;
  for (const FixedTensor& f : model_->fixed_tensors())
    fixed.push_back(f.name);
  DT_ASSIGN_OR_RETURN(std::vector<std::string> unused, CheckInitialWeights(file, global, fixed));
  if (lora_) {
    // The file's weights are the frozen ones; the adapters (B = 0) leave them as they are. A
    // LoRA rank holds the whole model. DoRA's magnitudes become their rows' norms, in the EMA
    // too.
    DT_RETURN_IF_ERROR(ReadPretrainedWeights(file, global, /*ema=*/false, model_->params()));
    // The text encoder's frozen weights stay its own.
    lora_->SetBase(model_->params());
    lora_->SetMagnitudesToNorms();
    lora_->Apply(lora_->params(), model_->params(), text_weights());
    std::memcpy(ema_.data(), lora_->params(), lora_->size() * sizeof(float));
  } else if (inversion_) {
    // The file's weights are the frozen model; the vectors and their EMA stay as they started.
    DT_RETURN_IF_ERROR(ReadPretrainedWeights(file, global, /*ema=*/false, model_->params()));
  } else if (model_->holds_whole_model()) {
    DT_RETURN_IF_ERROR(ReadInitialWeights(file, global, model_->params(), ema_.data()));
  } else {
    // One whole-model arena at a time: the weights, then the EMA's start (a checkpoint's EMA,
    // any other file's weights again).
    Buffer<float> arena(global.total());
    for (const bool ema : {false, true}) {
      DT_RETURN_IF_ERROR(ReadPretrainedWeights(file, global, ema, arena.data()));
      model_->ScatterFromGlobal(arena.data(), ema ? ema_.data() : model_->params());
    }
  }
  gpu_stale_ = gpu_ != nullptr;
  return unused;
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
        r[1].get<size_t>() > model_->global_parameter_table().total()) {
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
  if (trains_apart()) {
    // The adapters' (the vectors') moments, whole (RestoreModel checked that they are this
    // run's).
    if (held != trained_elements()) {
      return Errorf("'{}': {} moments for {} {} elements", shard.path(), held, trained_elements(),
                    lora_ ? "LoRA adapter" : "textual inversion");
    }
    std::memcpy(exp_avg_.data(), m->data, m->bytes);
    std::memcpy(exp_avg_sq_.data(), v->data, v->bytes);
    return held;
  }
  // Copy every element that a saved range (of the whole-model arena) holds, that a fragment
  // maps into this rank's arena, and that this rank owns.
  std::vector<size_t> owned_offset;  // where each owned range starts in the moments
  size_t next = 0;
  for (const parallel::Range& o : owned()) {
    owned_offset.push_back(next);
    next += o.size();
  }
  size_t copied = 0, saved_offset = 0;
  for (const auto& r : ranges) {
    const parallel::Range saved{r[0].get<size_t>(), r[1].get<size_t>()};
    for (const Fragment& f : model_->sharded().fragments) {
      const size_t gb = std::max(saved.begin, f.global);
      const size_t ge = std::min(saved.end, f.global + f.length);
      if (gb >= ge) continue;
      // Local [lb, le) holds saved elements from `from` on.
      const size_t lb = f.local + (gb - f.global), le = f.local + (ge - f.global);
      const size_t from = saved_offset + (gb - saved.begin);
      for (size_t i = 0; i < owned().size(); ++i) {
        const parallel::Range& o = owned()[i];
        const size_t begin = std::max(lb, o.begin), end = std::min(le, o.end);
        if (begin >= end) continue;
        const size_t src = (from + begin - lb) * sizeof(float);
        const size_t dst = owned_offset[i] + begin - o.begin;
        std::memcpy(exp_avg_.data() + dst, static_cast<const char*>(m->data) + src,
                    (end - begin) * sizeof(float));
        std::memcpy(exp_avg_sq_.data() + dst, static_cast<const char*>(v->data) + src,
                    (end - begin) * sizeof(float));
        copied += end - begin;
      }
      // The pages of the fragment's moments, read (a mapped shard: RestoreLatestCheckpoint).
      const size_t bytes = (ge - gb) * sizeof(float);
      shard.Forget(static_cast<const char*>(m->data) + from * sizeof(float), bytes);
      shard.Forget(static_cast<const char*>(v->data) + from * sizeof(float), bytes);
    }
    saved_offset += saved.size();
  }
  gpu_stale_ = gpu_ != nullptr;
  return copied;
}

}  // namespace difftrain
