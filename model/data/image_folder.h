// A folder of PNG or JPEG images laid out as torchvision's ImageFolder reads it (DiT's and
// most diffusion training scripts' input): DIR/<class>/…/<image>, one class per subfolder,
// labels by the subfolders' names in sorted order; a DIR with no subfolders holds unlabelled
// images. Files are listed (recursively within a class, sorted by path) when it is opened and
// decoded one by one in Get, so a folder of any size costs only its list in memory.
//
// Each image becomes C × S × S floats in [−1, 1], by the bytes Pillow makes of it (every
// resize is Pillow's, byte for byte: model/io/resample.h):
//   1. decoded to 8 bits (16-bit PNGs are reduced by libpng); alpha is dropped, as PIL's
//      convert("RGB") drops it; C 3: grey is repeated into R, G and B; C 1: colour becomes
//      PIL's convert("L") luma, (19595·R + 38470·G + 7471·B + 2¹⁵) >> 16;
//   2. cropped and resized to S × S: ImageCrop::kDit (the default) as DiT's center_crop_arr,
//      halvings with BOX while the shorter side is ≥ 2·S, BICUBIC to a shorter side of S, the
//      centred S × S; ImageCrop::kSquare the centred square of the shorter side, then BOX;
//   3. x / 127.5 − 1, the mean 0.5, std 0.5 normalisation of DiT's transform.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/data/dataset.h"
#include "model/io/png.h"

namespace difftrain {

enum class ImageCrop { kDit, kSquare };

class ImageFolderDataset : public Dataset {
 public:
  // `size` S and `channels` C (1 or 3) of the samples. Errors: DIR missing, no images, a class
  // folder without images (named).
  static Result<std::unique_ptr<ImageFolderDataset>> Open(const std::string& dir, int size,
                                                          int channels,
                                                          ImageCrop crop = ImageCrop::kDit);

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int channels() const override { return channels_; }
  int height() const override { return size_; }
  int width() const override { return size_; }
  int num_classes() const override { return static_cast<int>(classes_.size()); }
  // An image that cannot be decoded is an error naming its file.
  Status Get(int64_t index, float* image, int32_t* label) const override;
  // CropGeometry of the image, from its file's header.
  bool has_geometry() const override { return true; }
  Status GetGeometry(int64_t index, PictureGeometry* geometry) const override;

  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& file(int64_t index) const { return files_[index]; }

 private:
  ImageFolderDataset() = default;

  int size_ = 0, channels_ = 0;
  ImageCrop crop_ = ImageCrop::kDit;
  std::vector<std::string> classes_;  // empty: unlabelled
  std::vector<std::string> files_;
  std::vector<int32_t> labels_;
};

// The caption of each of `folder`'s images (in its order), as fine-tuning scripts read an
// image folder's captions: from DIR/metadata.jsonl where there is one (Hugging Face datasets'
// imagefolder, diffusers' train_text_to_image: one JSON object a line, "file_name" relative to
// DIR and the caption under `column`), else from each image's sidecar file beside it, IMAGE.txt
// or IMAGE.caption (kohya's sd-scripts), trailing whitespace dropped. Errors name the image
// without a caption, or the line that says what cannot be read.
Result<std::vector<std::string>> ReadImageCaptions(const ImageFolderDataset& folder,
                                                   const std::string& dir,
                                                   const std::string& column = "text");

// Steps 1–3 above for one decoded image: `out` is channels × size × size.
void PrepareImage(const io::PngImage& image, int size, int channels, ImageCrop crop, float* out);

// Where step 2 crops a picture of width × height: the corner of its size × size crop in the
// picture scaled as the crop is (kDit: after the halvings and BICUBIC; kSquare: the centred
// square's corner times size/shorter side, rounded), as diffusers' SDXL training scripts take
// crops_coords_top_left after their resize.
PictureGeometry CropGeometry(int width, int height, int size, ImageCrop crop);

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
