// Resizing 8-bit images the way Pillow's Image.resize does, byte for byte: the preprocessing
// of DiT (center_crop_arr: BOX halvings, then BICUBIC) and of torchvision pipelines runs on
// PIL images, so a dataset prepared here equals theirs; diffusers' VaeImageProcessor resizes
// with LANCZOS, torchvision's transforms.Resize (diffusers' SDXL training scripts, MosaicML
// diffusion's aspect-ratio buckets) with BILINEAR.
//
// Pillow's rule (libImaging/Resample.c semantics): separable, the horizontal pass first, each
// pass rounded to bytes. Output pixel j of a pass covers centre c = (j + 0.5)·in/out; with the
// filter widened by s = max(in/out, 1), input pixels [⌊c − support·s + 0.5⌋,
// ⌊c + support·s + 0.5⌋) (clamped to the image) weigh filter((i − c + 0.5)·(1/s)), normalised to
// sum 1, then rounded to fixed point with 22 fractional bits; the sum starts at one half and
// is shifted down and clamped to [0, 255].
#pragma once

#include "model/io/png.h"

namespace difftrain::io {

enum class ResampleFilter {
  kBox,       // 1 inside (−½, ½]: the mean of the pixels whose centres fall in the footprint
  kBilinear,  // the triangle 1 − |x| inside (−1, 1), support 1
  kBicubic,   // Keys' cubic convolution with a = −0.5, support 2
  kLanczos,   // sinc(x)·sinc(x/3) inside [−3, 3), support 3 (diffusers' image processor's)
};

// `image` (any channel count, 8-bit) resized to width × height. A dimension that keeps its
// size is not resampled (Pillow skips that pass).
PngImage Resize(const PngImage& image, int width, int height, ResampleFilter filter);

// The rectangle [left, left + width) × [top, top + height) of `image`.
PngImage Crop(const PngImage& image, int left, int top, int width, int height);

}  // namespace difftrain::io
