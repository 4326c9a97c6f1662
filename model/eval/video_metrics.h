// What a person checks in sampled videos of a moving garment (moving_fashion_mnist, docs/
// data.md), as `difftrain eval video` measures it (docs/eval.md):
//   frame accuracy   the classifier's accuracy on each frame's garment, cropped and resized
//                    to the classifier's 28×28 in a 32×32 frame as Fashion-MNIST's;
//   track residual   how far the garment's centre strays from the best straight path folded
//                    by reflection off the canvas borders (pixels, RMS over frames and axes);
//   agreement        the fraction of a video's frames that the classifier gives the video's
//                    most frequent class (the frames show one garment).
// The same measures of real videos, processed the same way, are the floor to compare with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/data/dataset.h"
#include "model/eval/classifier.h"

namespace difftrain::eval {

// Grey videos [count, frames, 1, size, size] with values in [−1, 1] and their labels.
struct Videos {
  int64_t count = 0;
  int frames = 0, size = 0;
  std::vector<float> pixels;
  std::vector<int32_t> labels;
};

// A samples file of a video model (`difftrain sample --raw`): `images` F32 [N, F, 1, S, S],
// `labels` I64 [N]; errors name what is wrong.
Result<Videos> ReadVideoSampleFile(const std::string& path);
// The first `count` videos of a video dataset, in order.
Result<Videos> ReadVideos(const Dataset& data, int64_t count);

// The garment of one frame: the centroid of its brightness ((x + 1) / 2) and the
// garment × garment window around it; `found` is false for a frame with (almost) no light.
struct GarmentCrop {
  bool found = false;
  double x = 0, y = 0;
  std::vector<float> image;  // 1 × 32 × 32: the window scaled to 28 × 28, padded with −1
};
GarmentCrop CropGarment(const float* frame, int size, int garment);

// The residual (RMS, pixels) of the best fit of `track` by lo + Bounce(q + v·f, travel) for
// free offset lo, start q and velocity v.
double BouncingPathResidual(const std::vector<double>& track, int travel);

// The measures of a set of videos (all of them, or those of one label).
struct VideoMeasures {
  int64_t videos = 0;
  double frame_accuracy = 0;  // over every frame with a garment found (missing frames count wrong)
  double agreement = 0;       // mean over videos
  double track_residual = 0;  // RMS over videos whose garment is found in every frame
  double missing_frames = 0;  // fraction of frames without a garment
  nlohmann::json ToJson() const;
};

struct VideoReport : VideoMeasures {
  int frames = 0;
  // The same measures for the videos of each label (index: the label), to see which classes
  // pull the totals down; the track residual's RMS weighs a class by its videos.
  std::vector<VideoMeasures> per_label;
  nlohmann::json ToJson() const;
};
// `garment` is the garment's side on the canvas (14 for moving_fashion_mnist).
VideoReport EvaluateVideos(Classifier<float>& net, const Videos& videos, int garment);

}  // namespace difftrain::eval
