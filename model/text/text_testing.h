// A small BERT text encoder folder for tests, as transformers and tokenizers lay one out:
// config.json, model.safetensors (F32, weights N(0, 0.5²)) and a WordPiece tokenizer.json
// whose vocabulary holds the special tokens, Fashion-MNIST's caption words (model/data/captions.h)
// and every lower-case letter alone and as a ## piece, so that any lower-case text tokenizes.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/io/safetensors.h"
#include "model/tensor/rng.h"
#include "model/text/encoder.h"

namespace difftrain::testing {

inline std::vector<std::string> TinyWordPieceVocabulary() {
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "-", ",", "."};
  for (const char* word :
       {"a",          "an",         "of",        "photo",    "picture", "image",    "black",
        "and",        "white",      "grayscale", "snapshot", "showing", "small",    "low",
        "resolution", "photograph", "t",         "shirt",    "pair",    "trousers", "pullover",
        "dress",      "coat",       "sandal",    "sneaker",  "bag",     "ankle",    "boot"}) {
    vocab.push_back(word);
  }
  for (char c = 'a'; c <= 'z'; ++c) {
    if (std::string(1, c) != "a" && std::string(1, c) != "t") vocab.push_back(std::string(1, c));
    vocab.push_back(std::string("##") + c);
  }
  return vocab;
}

// A BERT tokenizer.json as `tokenizers` writes one, on `vocab`, whose first five entries are
// [PAD], [UNK], [CLS], [SEP], [MASK] (ids 0 to 4, as BERT's).
inline nlohmann::json WordPieceTokenizerJson(const std::vector<std::string>& vocab,
                                             int max_input_chars_per_word = 100) {
  nlohmann::json ids = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t i = 0; i < vocab.size(); ++i) {
    ids[vocab[i]] = i;
    if (i < 5) {
      added.push_back({{"id", i},
                       {"content", vocab[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
  }
  const auto special = [](const char* token, int id) {
    return nlohmann::json{{"id", token}, {"ids", {id}}, {"tokens", {token}}};
  };
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", {{"pad_id", 0}, {"pad_token", "[PAD]"}}},
          {"added_tokens", added},
          {"normalizer",
           {{"type", "BertNormalizer"},
            {"clean_text", true},
            {"handle_chinese_chars", true},
            {"strip_accents", nullptr},
            {"lowercase", true}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}}},
            {"pair", nlohmann::json::array()},
            {"special_tokens", {{"[CLS]", special("[CLS]", 2)}, {"[SEP]", special("[SEP]", 3)}}}}},
          {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
          {"model",
           {{"type", "WordPiece"},
            {"unk_token", "[UNK]"},
            {"continuing_subword_prefix", "##"},
            {"max_input_chars_per_word", max_input_chars_per_word},
            {"vocab", ids}}}};
}

// Writes the folder `dir` of a BERT with `hidden` features (hidden / 2 heads of 2), `layers`
// layers and texts of up to `max_positions` tokens. An error message, or "".
inline std::string WriteTextEncoderFolder(const std::filesystem::path& dir, int hidden,
                                          uint64_t seed, int layers = 2, int max_positions = 16) {
  const std::vector<std::string> vocab = TinyWordPieceVocabulary();
  const nlohmann::json config = {{"model_type", "bert"},
                                 {"architectures", {"BertModel"}},
                                 {"vocab_size", vocab.size()},
                                 {"hidden_size", hidden},
                                 {"num_hidden_layers", layers},
                                 {"num_attention_heads", hidden / 2},
                                 {"intermediate_size", 2 * hidden},
                                 {"max_position_embeddings", max_positions},
                                 {"hidden_act", "gelu"}};
  Result<TextEncoderConfig> c = TextEncoderConfig::FromJson(config);
  if (!c.ok()) return c.status().message();
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);

  const TensorTable table = TextEncoder::Tensors(*c);
  std::vector<float> weights(table.total());
  Rng rng(seed, RngStream::kInit);
  for (float& w : weights)
    w = static_cast<float>(0.5 * rng.Normal());
  io::SafetensorsWriter file;
  for (const TensorSpec& t : table.tensors())
    file.AddF32(t.name, t.shape, weights.data() + t.offset);
  const Status s = file.WriteAtomic((dir / "model.safetensors").string());
  if (!s.ok()) return s.message();

  const nlohmann::json tokenizer = WordPieceTokenizerJson(vocab);
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump(2);
  return "";
}

// The config of a CLIP text model of the given sizes (tests that build one in memory).
inline TextEncoderConfig ClipConfig(int vocab_size, int hidden_size, int intermediate_size,
                                    int num_layers, int num_heads, int max_positions,
                                    TextActivation activation) {
  TextEncoderConfig c;
  c.kind = TextEncoderKind::kClip;
  c.vocab_size = vocab_size;
  c.hidden_size = hidden_size;
  c.intermediate_size = intermediate_size;
  c.num_layers = num_layers;
  c.num_heads = num_heads;
  c.max_positions = max_positions;
  c.layer_norm_eps = 1e-5;
  c.activation = activation;
  return c;
}

}  // namespace difftrain::testing
