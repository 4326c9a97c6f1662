#include "model/data/captions.h"

#include <vector>

namespace difftrain {
namespace {

// The classes of Fashion-MNIST in label order, each with its article.
constexpr const char* kFashionMnistNouns[] = {
    "a t-shirt", "a pair of trousers", "a pullover", "a dress",      "a coat", "a sandal",
    "a shirt",   "a sneaker",          "a bag",      "an ankle boot"};

// {} is the noun. The first kFashionMnistTrainingTemplates train; the others are paraphrases.
constexpr const char* kTemplates[] = {
    "a photo of {}",
    "a picture of {}",
    "an image of {}",
    "a black and white photo of {}",
    // held out
    "a grayscale snapshot showing {}",
    "a small low-resolution photograph of {}",
};

}  // namespace

TextTable FashionMnistCaptions() {
  TextTable t;
  int label = 0;
  for (const char* noun : kFashionMnistNouns) {
    int index = 0;
    for (const char* pattern : kTemplates) {
      t.captions.push_back(fmt::format(fmt::runtime(pattern), noun));
      t.labels.push_back(label);
      t.held_out.push_back(index++ >= kFashionMnistTrainingTemplates);
    }
    ++label;
  }
  return t;
}

Result<std::unique_ptr<CaptionedDataset>> CaptionedDataset::WithTexts(
    std::unique_ptr<Dataset> images, TextTable texts, std::vector<int64_t> text_ids) {
  if (static_cast<int64_t>(text_ids.size()) != images->size()) {
    return Errorf("{} text ids for {} samples", text_ids.size(), images->size());
  }
  for (int64_t id : text_ids) {
    if (id < 0 || id >= texts.size())
      return Errorf("text id {} is outside the table's [0, {})", id, texts.size());
  }
  return std::unique_ptr<CaptionedDataset>(
      new CaptionedDataset(std::move(images), std::move(texts), std::move(text_ids)));
}

Result<std::unique_ptr<CaptionedDataset>> CaptionedDataset::Create(std::unique_ptr<Dataset> images,
                                                                   TextTable texts) {
  if (images->unbounded()) return Status::Error("captioned data need a bounded image dataset");
  if (texts.labels.empty()) {
    return Status::Error("the text table has no labels: which class each caption names");
  }
  // The training texts of every class.
  std::vector<std::vector<int64_t>> by_class(images->num_classes());
  for (int64_t k = 0; k < texts.size(); ++k) {
    const int label = texts.labels[k];
    if (label < static_cast<int>(by_class.size()) && !texts.is_held_out(k)) {
      by_class[label].push_back(k);
    }
  }
  for (size_t c = 0; c < by_class.size(); ++c) {
    if (by_class[c].empty()) {
      return Errorf("the text table has no training caption of class {}", c);
    }
  }
  std::vector<int64_t> ids(images->size());
  std::vector<float> image;
  for (int64_t i = 0; i < images->size(); ++i) {
    image.resize(images->SampleFloats(i));
    int32_t label = 0;
    Status got = images->Get(i, image.data(), &label);
    if (!got.ok()) return got.WithContext(fmt::format("reading sample {}", i));
    const std::vector<int64_t>& texts_of_class = by_class[label];
    ids[i] = texts_of_class[i % static_cast<int64_t>(texts_of_class.size())];
  }
  return std::unique_ptr<CaptionedDataset>(
      new CaptionedDataset(std::move(images), std::move(texts), std::move(ids)));
}

}  // namespace difftrain
