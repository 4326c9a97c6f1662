#include "model/eval/video_metrics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "model/data/moving_fashion_mnist.h"
#include "model/eval/classifier_training.h"
#include "model/io/safetensors.h"

namespace difftrain::eval {
namespace {

constexpr int kClassifierSide = 32, kRawSide = 28, kPad = (kClassifierSide - kRawSide) / 2;
// A frame whose brightness sums to less than this many fully lit pixels holds no garment.
constexpr double kMinLight = 4.0;

// The least-squares fit of `track` by lo + Bounce(q + v·f) over a grid of (q, v) around
// (q0, v0): returns the best (residual, q, v).
std::array<double, 3> FitGrid(const std::vector<double>& track, int travel, double q0,
                              double q_step, int q_half, double v0, double v_step, int v_half) {
  const int F = static_cast<int>(track.size());
  std::array<double, 3> best = {INFINITY, q0, v0};
  std::vector<double> path(F);
  for (int iv = -v_half; iv <= v_half; ++iv) {
    const double v = v0 + iv * v_step;
    for (int iq = -q_half; iq <= q_half; ++iq) {
      const double q = q0 + iq * q_step;
      double mean = 0;
      for (int f = 0; f < F; ++f) {
        path[f] = Bounce(q + v * f, travel);
        mean += track[f] - path[f];
      }
      mean /= F;  // the offset lo that fits best
      double sq = 0;
      for (int f = 0; f < F; ++f)
        sq += (track[f] - path[f] - mean) * (track[f] - path[f] - mean);
      if (sq < best[0]) best = {sq, q, v};
    }
  }
  return best;
}

}  // namespace

Result<Videos> ReadVideoSampleFile(const std::string& path) {
  DT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::Read(path));
  const io::TensorView* images = file.Find("images");
  const io::TensorView* labels = file.Find("labels");
  if (images == nullptr || labels == nullptr || images->dtype != io::DType::kF32 ||
      labels->dtype != io::DType::kI64) {
    return Errorf("samples '{}': needs tensors images F32 and labels I64", path);
  }
  const std::vector<int64_t>& s = images->shape;
  if (s.size() != 5 || s[2] != 1 || s[3] != s[4] || s[0] < 1 || s[1] < 2) {
    return Errorf("samples '{}': images must be grey videos [N, F >= 2, 1, S, S]", path);
  }
  if (labels->shape != std::vector<int64_t>{s[0]})
    return Errorf("samples '{}': labels must be [{}]", path, s[0]);
  Videos v;
  v.count = s[0];
  v.frames = static_cast<int>(s[1]);
  v.size = static_cast<int>(s[3]);
  v.pixels.resize(images->bytes / sizeof(float));
  std::memcpy(v.pixels.data(), images->data, images->bytes);
  std::vector<int64_t> wide(v.count);
  std::memcpy(wide.data(), labels->data, labels->bytes);
  v.labels.assign(wide.begin(), wide.end());
  if (std::any_of(v.pixels.begin(), v.pixels.end(), [](float x) { return !std::isfinite(x); }))
    return Errorf("samples '{}': a video holds a non-finite value", path);
  return v;
}

Result<Videos> ReadVideos(const Dataset& data, int64_t count) {
  if (data.channels() != 1 || data.height() != data.width() || data.frames() < 2)
    return Status::Error("real videos must be grey, square and of several frames");
  Videos v;
  v.count = std::min(count, data.size());
  v.frames = data.frames();
  v.size = data.height();
  v.pixels.resize(v.count * data.sample_floats());
  v.labels.resize(v.count);
  for (int64_t i = 0; i < v.count; ++i)
    DT_RETURN_IF_ERROR(data.Get(i, v.pixels.data() + i * data.sample_floats(), &v.labels[i]));
  return v;
}

GarmentCrop CropGarment(const float* frame, int size, int garment) {
  GarmentCrop crop;
  double light = 0, sx = 0, sy = 0;
  for (int r = 0; r < size; ++r) {
    for (int c = 0; c < size; ++c) {
      const double w = std::clamp((frame[r * size + c] + 1.0) / 2.0, 0.0, 1.0);
      light += w;
      sx += w * c;
      sy += w * r;
    }
  }
  crop.image.assign(kClassifierSide * kClassifierSide, -1.0f);
  if (light < kMinLight) return crop;
  crop.found = true;
  crop.x = sx / light;
  crop.y = sy / light;
  // The window centred on the centroid, inside the canvas, scaled to 28 × 28 (nearest).
  const int travel = size - garment;
  const int left =
      std::clamp(static_cast<int>(std::lround(crop.x - (garment - 1) / 2.0)), 0, travel);
  const int top =
      std::clamp(static_cast<int>(std::lround(crop.y - (garment - 1) / 2.0)), 0, travel);
  for (int r = 0; r < kRawSide; ++r) {
    for (int c = 0; c < kRawSide; ++c) {
      const int gr = r * garment / kRawSide, gc = c * garment / kRawSide;
      crop.image[(kPad + r) * kClassifierSide + kPad + c] =
          std::clamp(frame[(top + gr) * size + left + gc], -1.0f, 1.0f);
    }
  }
  return crop;
}

double BouncingPathResidual(const std::vector<double>& track, int travel) {
  // A coarse grid over every start and velocity up to 3 pixels a frame, then a finer one
  // around the best.
  const double coarse_q = 0.25, coarse_v = 0.05;
  auto best = FitGrid(track, travel, travel / 2.0, coarse_q,
                      static_cast<int>(std::ceil(travel / 2.0 / coarse_q)), 0, coarse_v, 60);
  best = FitGrid(track, travel, best[1], coarse_q / 10, 10, best[2], coarse_v / 10, 10);
  return std::sqrt(best[0] / track.size());
}

nlohmann::json VideoMeasures::ToJson() const {
  return {{"videos", videos},
          {"frame_accuracy", frame_accuracy},
          {"agreement", agreement},
          {"track_residual", track_residual},
          {"missing_frames", missing_frames}};
}

nlohmann::json VideoReport::ToJson() const {
  nlohmann::json json = VideoMeasures::ToJson();
  json["frames"] = frames;
  json["per_label"] = nlohmann::json::array();
  for (const VideoMeasures& m : per_label)
    json["per_label"].push_back(m.ToJson());
  return json;
}

namespace {

// Running sums of the measures over a set of videos.
struct MeasureSums {
  int64_t videos = 0, frames = 0, correct = 0, missing = 0, tracked = 0;
  double agreement = 0, residual_sq = 0;

  VideoMeasures Measures() const {
    VideoMeasures m;
    m.videos = videos;
    if (videos == 0) return m;
    m.frame_accuracy = static_cast<double>(correct) / frames;
    m.agreement = agreement / videos;
    m.track_residual = tracked > 0 ? std::sqrt(residual_sq / tracked) : INFINITY;
    m.missing_frames = static_cast<double>(missing) / frames;
    return m;
  }
};

}  // namespace

VideoReport EvaluateVideos(Classifier<float>& net, const Videos& v, int garment) {
  const size_t frame_floats = size_t(v.size) * v.size;
  const int64_t n = v.count * v.frames;
  std::vector<float> crops(n * kClassifierSide * kClassifierSide);
  std::vector<GarmentCrop> found(n);
  for (int64_t i = 0; i < n; ++i) {
    found[i] = CropGarment(v.pixels.data() + i * frame_floats, v.size, garment);
    std::copy(found[i].image.begin(), found[i].image.end(),
              crops.begin() + i * kClassifierSide * kClassifierSide);
  }
  const Classification out = Classify(net, crops.data(), n);
  MeasureSums all;
  std::vector<MeasureSums> by_label;
  for (int64_t video = 0; video < v.count; ++video) {
    const int32_t label = v.labels[video];
    if (label >= 0 && label >= static_cast<int32_t>(by_label.size())) by_label.resize(label + 1);
    MeasureSums scratch;
    MeasureSums& mine = label >= 0 ? by_label[label] : scratch;
    std::map<int32_t, int> votes;
    std::vector<double> xs, ys;
    int correct = 0, missing = 0;
    for (int f = 0; f < v.frames; ++f) {
      const int64_t i = video * v.frames + f;
      if (!found[i].found) {
        ++missing;
        continue;
      }
      correct += out.predictions[i] == label;
      ++votes[out.predictions[i]];
      xs.push_back(found[i].x);
      ys.push_back(found[i].y);
    }
    int most = 0;
    for (const auto& [predicted, count] : votes)
      most = std::max(most, count);
    double residual_sq = 0;
    const bool tracked = static_cast<int>(xs.size()) == v.frames;
    if (tracked) {
      const double rx = BouncingPathResidual(xs, v.size - garment);
      const double ry = BouncingPathResidual(ys, v.size - garment);
      residual_sq = (rx * rx + ry * ry) / 2;
    }
    for (MeasureSums* sums : {&all, &mine}) {
      ++sums->videos;
      sums->frames += v.frames;
      sums->correct += correct;
      sums->missing += missing;
      sums->agreement += static_cast<double>(most) / v.frames;
      sums->tracked += tracked;
      sums->residual_sq += residual_sq;
    }
  }
  VideoReport report;
  static_cast<VideoMeasures&>(report) = all.Measures();
  report.frames = v.frames;
  for (const MeasureSums& sums : by_label)
    report.per_label.push_back(sums.Measures());
  return report;
}

}  // namespace difftrain::eval
