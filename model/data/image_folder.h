// A folder of PNG or JPEG images laid out as torchvision's ImageFolder reads it (DiT's and
// most diffusion training scripts' input): DIR/<class>/…/<image>, one class per subfolder,
// labels by the subfolders' names in sorted order; a DIR with no subfolders holds unlabelled
// images. Files are listed (recursively within a class, sorted by path) when it is opened and
// decoded one by one in Get, so a folder of any size costs only its list in memory.
//
// Each image becomes C × S × S floats in [−1, 1] (C × h × w with aspect-ratio buckets), by the
// bytes Pillow makes of it (every resize is Pillow's, byte for byte: model/io/resample.h):
//   1. decoded to 8 bits (16-bit PNGs are reduced by libpng); alpha is dropped, as PIL's
//      convert("RGB") drops it; C 3: grey is repeated into R, G and B; C 1: colour becomes
//      PIL's convert("L") luma, (19595·R + 38470·G + 7471·B + 2¹⁵) >> 16;
//   2. cropped and resized to S × S: ImageCrop::kDit (the default) as DiT's center_crop_arr,
//      halvings with BOX while the shorter side is ≥ 2·S, BICUBIC to a shorter side of S, the
//      centred S × S; ImageCrop::kSquare the centred square of the shorter side, then BOX;
//      ImageCrop::kBuckets (SDXL's multi-aspect training) to the h × w of the bucket whose
//      aspect ratio is nearest the picture's (NearestBucket), as MosaicML diffusion's bucketed
//      crop with torchvision's Resize: scaled by s = max(w/W, h/H) to round(W·s) × round(H·s)
//      (half to even as Python's round, each at least the bucket's side) with BILINEAR in one
//      pass, then the centred w × h (offsets as torchvision's CenterCrop: round(d/2), half to
//      even);
//   3. x / 127.5 − 1, the mean 0.5, std 0.5 normalisation of DiT's transform.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/data/dataset.h"
#include "model/io/png.h"

namespace difftrain {

enum class ImageCrop { kDit, kSquare, kBuckets };

class ImageFolderDataset : public Dataset {
 public:
  // `size` S and `channels` C (1 or 3) of the samples. kBuckets: the buckets are `buckets`
  // (pixels, height × width) or, when it is empty, AspectRatioBuckets(S); every file's header is
  // read here to place it in its bucket. Errors: DIR missing, no images, a class folder without
  // images, a header that cannot be read (named); buckets without kBuckets, a bucket with a side
  // below 1 or given twice, an automatic list for an S that is not a multiple of 64.
  static Result<std::unique_ptr<ImageFolderDataset>> Open(const std::string& dir, int size,
                                                          int channels,
                                                          ImageCrop crop = ImageCrop::kDit,
                                                          std::vector<SampleSize> buckets = {});

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int channels() const override { return channels_; }
  // S; with kBuckets and a single bucket, that bucket's sides (a dataset of one size).
  int height() const override { return single_bucket() ? buckets_[0].height : size_; }
  int width() const override { return single_bucket() ? buckets_[0].width : size_; }
  int num_classes() const override { return static_cast<int>(classes_.size()); }
  // An image that cannot be decoded is an error naming its file. kBuckets: C × h × w floats of
  // the image's bucket h × w.
  Status Get(int64_t index, float* image, int32_t* label) const override;
  // CropGeometry of the image, from its file's header (kBuckets: BucketGeometry in its bucket,
  // from the size read at Open).
  bool has_geometry() const override { return true; }
  Status GetGeometry(int64_t index, PictureGeometry* geometry) const override;
  // kBuckets: the buckets and each image's (the nearest to its aspect ratio); otherwise the
  // single S × S.
  std::vector<SampleSize> buckets() const override;
  int BucketOf(int64_t index) const override;

  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& file(int64_t index) const { return files_[index]; }

 private:
  ImageFolderDataset() = default;
  bool single_bucket() const { return crop_ == ImageCrop::kBuckets && buckets_.size() == 1; }

  int size_ = 0, channels_ = 0;
  ImageCrop crop_ = ImageCrop::kDit;
  std::vector<std::string> classes_;  // empty: unlabelled
  std::vector<std::string> files_;
  std::vector<int32_t> labels_;
  // kBuckets: the buckets, each file's bucket and its picture's size (from its header).
  std::vector<SampleSize> buckets_;
  std::vector<int32_t> bucket_of_;
  std::vector<SampleSize> picture_sizes_;
};

// SDXL's aspect-ratio buckets for the nominal size `size` (Podell et al. 2023, section 2.3 and
// appendix I): sides multiples of `step`, pixel counts as near size² as they go without
// exceeding it. For each height h = size, size + step, …, 2·size, the widest w (a multiple of
// step) with h·w ≤ size², kept when w ≥ size/2 (aspect ratios within [1/4, 4]), and with it
// its transpose w × h: the same list as that rule over every h from size/2 to 2·size with the
// transposes added, symmetric by construction (h × w in it, so is w × h). Sorted by aspect
// ratio h/w ascending (the widest first, 1024 × 1024 in the middle for size 1024), no
// duplicates. 1024 gives 33 buckets from 512 × 2048 to 2048 × 512, among them 1024²,
// 1152 × 896, 1216 × 832, 1344 × 768, 1536 × 640 and their transposes: SDXL's table of 40
// less the seven that are not widest for their height (960 × 1024, 896 × 1088, 832 × 1152,
// their transposes, and 704 × 1344, whose transpose the table lacks). Empty when size or step
// is below 1 or size is not a multiple of step (Open refuses that by name).
std::vector<SampleSize> AspectRatioBuckets(int size, int step = 64);

// The index of the bucket whose aspect ratio is nearest a picture of width × height's, by
// |log(height/width) − log(h/w)|, compared exactly (in integers), ties to the earlier bucket.
// `buckets` must not be empty, every side positive.
int NearestBucket(const std::vector<SampleSize>& buckets, int width, int height);

// The caption of each of `folder`'s images (in its order), as fine-tuning scripts read an
// image folder's captions: from DIR/metadata.jsonl where there is one (Hugging Face datasets'
// imagefolder, diffusers' train_text_to_image: one JSON object a line, "file_name" relative to
// DIR and the caption under `column`), else from each image's sidecar file beside it, IMAGE.txt
// or IMAGE.caption (kohya's sd-scripts), trailing whitespace dropped. Errors name the image
// without a caption, or the line that says what cannot be read.
Result<std::vector<std::string>> ReadImageCaptions(const ImageFolderDataset& folder,
                                                   const std::string& dir,
                                                   const std::string& column = "text");

// Steps 1–3 above for one decoded image: `out` is channels × size × size (kBuckets: in the one
// bucket size × size, as PrepareBucketed).
void PrepareImage(const io::PngImage& image, int size, int channels, ImageCrop crop, float* out);

// Steps 1–3 above with kBuckets for one decoded image in `bucket` (any bucket, not necessarily
// the nearest): `out` is channels × bucket.height × bucket.width.
void PrepareBucketed(const io::PngImage& image, SampleSize bucket, int channels, float* out);

// Where step 2 crops a picture of width × height: the corner of its size × size crop in the
// picture scaled as the crop is (kDit: after the halvings and BICUBIC; kSquare: the centred
// square's corner times size/shorter side, rounded; kBuckets: BucketGeometry in size × size),
// as diffusers' SDXL training scripts take crops_coords_top_left after their resize.
PictureGeometry CropGeometry(int width, int height, int size, ImageCrop crop);

// Where kBuckets crops a picture of width × height into `bucket`: its original size, the corner
// of the crop in the BILINEAR-resized picture (((rw − w)/2, (rh − h)/2), rounded down) and the
// bucket's h × w: diffusers' original_size, crops_coords_top_left and target_size.
PictureGeometry BucketGeometry(int width, int height, SampleSize bucket);

// An image to image pipeline's input, as diffusers' VaeImageProcessor.preprocess(image, height,
// width) makes it: step 1 above, then stretched (no crop) to width × height with Pillow's
// LANCZOS where its size differs, then 2·(x/255) − 1 in float32. `out` is channels × height ×
// width.
void PrepareStretched(const io::PngImage& image, int width, int height, int channels, float* out);

// An inpainting pipeline's mask, as diffusers' mask processor (VaeImageProcessor with
// do_convert_grayscale, do_binarize, no normalisation) makes it: stretched to width × height with
// Pillow's LANCZOS in the image's own colours (grey or RGB; an alpha channel is dropped first),
// converted to PIL's "L" luma, then 1 where x/255 ≥ 0.5 (to be painted), 0 elsewhere. `out` is
// height × width.
void PrepareMask(const io::PngImage& image, int width, int height, float* out);

}  // namespace difftrain
