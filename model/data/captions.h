// Captions for class-labelled images, and a dataset that pairs each image with an embedded
// caption of its class (docs/data.md).
//
// Fashion-MNIST's captions: for each class c (in label order) the same templates, filled in
// with the class's noun ("a photo of a sneaker", "an image of an ankle boot"): the first
// kFashionMnistTrainingTemplates are the training captions, the rest are paraphrases held
// out of training, to test a model on prompts it never saw. Caption id = c · templates + t.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/data/dataset.h"
#include "model/data/text_table.h"

namespace difftrain {

inline constexpr int kFashionMnistTrainingTemplates = 4;

// The captions, without embeddings: captions, labels and held_out set, L = D = 0.
TextTable FashionMnistCaptions();

// Every sample of `images` (class-labelled) with a training caption of its class from
// `texts` (its `labels` say which class a text names; `held_out` texts are never used):
// sample i of class c takes the (i mod n_c)-th of the n_c training texts of class c, so each
// class's captions are used evenly.
class CaptionedDataset : public Dataset {
 public:
  // Errors: `texts` has no labels, or has no training text for a class of `images`.
  static Result<std::unique_ptr<CaptionedDataset>> Create(std::unique_ptr<Dataset> images,
                                                          TextTable texts);
  // Sample i with text text_ids[i] of `texts` (an image folder's own captions). Errors: a count
  // or an id that does not fit.
  static Result<std::unique_ptr<CaptionedDataset>> WithTexts(std::unique_ptr<Dataset> images,
                                                             TextTable texts,
                                                             std::vector<int64_t> text_ids);

  int64_t size() const override { return images_->size(); }
  int channels() const override { return images_->channels(); }
  int height() const override { return images_->height(); }
  int width() const override { return images_->width(); }
  int num_classes() const override { return images_->num_classes(); }
  int frames() const override { return images_->frames(); }
  Status Get(int64_t index, float* image, int32_t* label) const override {
    return images_->Get(index, image, label);
  }
  const TextTable* texts() const override { return &texts_; }
  int64_t TextId(int64_t index) const override { return text_ids_[index]; }
  bool has_geometry() const override { return images_->has_geometry(); }
  Status GetGeometry(int64_t index, PictureGeometry* geometry) const override {
    return images_->GetGeometry(index, geometry);
  }
  std::vector<SampleSize> buckets() const override { return images_->buckets(); }
  int BucketOf(int64_t index) const override { return images_->BucketOf(index); }

 private:
  CaptionedDataset(std::unique_ptr<Dataset> images, TextTable texts, std::vector<int64_t> ids)
      : images_(std::move(images)), texts_(std::move(texts)), text_ids_(std::move(ids)) {}

  std::unique_ptr<Dataset> images_;
  TextTable texts_;
  std::vector<int64_t> text_ids_;  // one per sample
};

}  // namespace difftrain
