#include "model/text/wordpiece.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_read.h"
#include "model/text/unicode.h"

namespace difftrain::text {
namespace {

using nlohmann::json;

// The `unicode_categories` crate's predicates (Unicode 8.0; see unicode.h).
bool IsOther(char32_t c) {  // is_other: Cc, Cf, Co (its tables give no Cn)
  const UCharCategory cat = CategoryAsOf(c, kUnicode8);
  return cat == U_CONTROL_CHAR || cat == U_FORMAT_CHAR || cat == U_PRIVATE_USE_CHAR;
}
bool IsNonspacingMark(char32_t c) {
  return CategoryAsOf(c, kUnicode8) == U_NON_SPACING_MARK;
}
// BertPreTokenizer's punctuation: ASCII punctuation or the crate's is_punctuation.
bool IsPunctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126);
  }
  return IsPunctuationCategory(CategoryAsOf(c, kUnicode8));
}
// BertNormalizer's whitespace and control characters.
bool IsBertWhitespace(char32_t c) {
  return c == '\t' || c == '\n' || c == '\r' || IsWhiteSpace(c);
}
bool IsBertControl(char32_t c) {
  return c != '\t' && c != '\n' && c != '\r' && IsOther(c);
}

// A piece of text between added tokens, or an added token (id >= 0).
struct Segment {
  std::u32string text;
  int32_t id = -1;
};

// BertNormalizer's CJK ideographs: BERT's ranges, but tokenizers' Rust code starts the one
// after extension C at U+2B920 where BERT's starts at U+2B820.
bool IsChineseChar(char32_t c) {
  return IsBertChineseChar(c) && !(c >= 0x2B820 && c < 0x2B920);
}

// Cuts the added tokens (those with `normalized` as given) out of `text`: at each position the
// leftmost match, the longest there, as tokenizers' leftmost-longest Aho–Corasick does;
// lstrip/rstrip tokens take the whitespace before/after them with them.
std::vector<Segment> SplitAdded(std::u32string_view text,
                                const std::vector<WordPieceTokenizer::AddedToken>& added,
                                bool normalized) {
  std::vector<Segment> out;
  size_t done = 0;  // text[0, done) is in `out`
  for (size_t i = 0; i < text.size();) {
    const WordPieceTokenizer::AddedToken* best = nullptr;
    for (const auto& token : added) {
      if (token.normalized != normalized || token.content.empty()) continue;
      if (text.substr(i, token.content.size()) != token.content) continue;
      if (best == nullptr || token.content.size() > best->content.size()) best = &token;
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, end = i + best->content.size();
    if (best->lstrip) {
      while (start > done && IsWhiteSpace(text[start - 1]))
        --start;
    }
    if (best->rstrip) {
      while (end < text.size() && IsWhiteSpace(text[end]))
        ++end;
    }
    if (start > done) out.push_back({std::u32string(text.substr(done, start - done)), -1});
    out.push_back({{}, best->id});
    done = i = end;
  }
  if (done < text.size()) out.push_back({std::u32string(text.substr(done)), -1});
  return out;
}

std::string TypeOf(const json& section) {
  if (!section.is_object()) return section.is_null() ? "null" : section.dump();
  const auto type = section.find("type");
  return type != section.end() && type->is_string() ? "\"" + type->get<std::string>() + "\""
                                                    : "without a type";
}

// The id of a special token of TemplateProcessing's single template, from its special_tokens.
int32_t TemplateTokenId(const std::filesystem::path& file, const json& processor, const json& item,
                        const char* key) {
  const json* special =
      item.is_object() && item.contains("SpecialToken") ? &item["SpecialToken"] : nullptr;
  if (special == nullptr || !special->contains("id")) {
    TokenizerFileError(
        file, fmt::format("post_processor.single must be [CLS] $A [SEP] (its {} is {})", key,
                          item.dump()));
  }
  const std::string name = (*special)["id"].get<std::string>();
  const json& tokens = processor.value("special_tokens", json::object());
  if (!tokens.contains(name) || !tokens[name].contains("ids") || tokens[name]["ids"].size() != 1) {
    TokenizerFileError(file,
                       fmt::format("post_processor.special_tokens[\"{}\"].ids is missing", name));
  }
  return TokenId(tokens[name]["ids"][0], file,
                 fmt::format("post_processor.special_tokens[\"{}\"]", name));
}

}  // namespace

std::unique_ptr<WordPieceTokenizer> WordPieceTokenizer::Load(
    const std::filesystem::path& tokenizer_json) {
  const std::filesystem::path& file = tokenizer_json;
  std::ifstream in(file);
  if (!in) TokenizerFileError(file, "cannot be read");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {
    TokenizerFileError(file, fmt::format("is not JSON: {}", e.what()));
  }
  std::unique_ptr<WordPieceTokenizer> tok(new WordPieceTokenizer());
  try {
    const json& normalizer = root.value("normalizer", json());
    if (TypeOf(normalizer) != R"("BertNormalizer")") {
      TokenizerFileError(
          file, fmt::format("normalizer.type is {}, not BertNormalizer", TypeOf(normalizer)));
    }
    tok->clean_text_ = normalizer.value("clean_text", true);
    tok->handle_chinese_chars_ = normalizer.value("handle_chinese_chars", true);
    tok->lowercase_ = normalizer.value("lowercase", true);
    const json& strip = normalizer.value("strip_accents", json());
    tok->strip_accents_ = strip.is_null() ? tok->lowercase_ : strip.get<bool>();

    const json& pre = root.value("pre_tokenizer", json());
    if (TypeOf(pre) != R"("BertPreTokenizer")") {
      TokenizerFileError(
          file, fmt::format("pre_tokenizer.type is {}, not BertPreTokenizer", TypeOf(pre)));
    }

    const json& model = root.value("model", json());
    if (TypeOf(model) != R"("WordPiece")") {
      TokenizerFileError(file, fmt::format("model.type is {}, not WordPiece", TypeOf(model)));
    }
    if (!model.contains("vocab") || !model["vocab"].is_object()) {
      TokenizerFileError(file, "model.vocab is missing");
    }
    for (const auto& [piece, id] : model["vocab"].items()) {
      const int32_t checked = TokenId(id, file, fmt::format("model.vocab[\"{}\"]", piece));
      tok->vocab_[piece] = checked;
      tok->vocab_size_ = std::max(tok->vocab_size_, checked + 1);
    }
    const std::string unk = model.value("unk_token", "[UNK]");
    const auto unk_id = tok->vocab_.find(unk);
    if (unk_id == tok->vocab_.end()) {
      TokenizerFileError(file, fmt::format("model.unk_token \"{}\" is not in model.vocab", unk));
    }
    tok->unk_id_ = unk_id->second;
    tok->prefix_ = model.value("continuing_subword_prefix", "##");
    tok->max_input_chars_per_word_ = JsonIntOr(model, "max_input_chars_per_word", 100);

    for (const json& added : root.value("added_tokens", json::array())) {
      if (added.value("single_word", false)) {
        TokenizerFileError(file, fmt::format("added_tokens: single_word of \"{}\" is not supported",
                                             added.value("content", "")));
      }
      AddedToken token;
      token.content = DecodeUtf8(added.at("content").get<std::string>());
      token.id = TokenId(added.at("id"), file,
                         fmt::format("added token \"{}\"", added.at("content").get<std::string>()));
      token.normalized = added.value("normalized", false);
      token.lstrip = added.value("lstrip", false);
      token.rstrip = added.value("rstrip", false);
      tok->vocab_size_ = std::max(tok->vocab_size_, token.id + 1);
      tok->added_.push_back(std::move(token));
    }

    const json& post = root.value("post_processor", json());
    if (TypeOf(post) == R"("TemplateProcessing")") {
      const json& single = post.value("single", json::array());
      if (!single.is_array() || single.size() != 3 || !single[1].contains("Sequence")) {
        TokenizerFileError(
            file, fmt::format("post_processor.single is {}, not [CLS] $A [SEP]", single.dump()));
      }
      tok->start_id_ = TemplateTokenId(file, post, single[0], "first");
      tok->end_id_ = TemplateTokenId(file, post, single[2], "last");
    } else if (TypeOf(post) == R"("BertProcessing")") {
      tok->start_id_ = TokenId(post.at("cls").at(1), file, "post_processor.cls");
      tok->end_id_ = TokenId(post.at("sep").at(1), file, "post_processor.sep");
    } else {
      TokenizerFileError(
          file, fmt::format("post_processor.type is {}, not TemplateProcessing or BertProcessing",
                            TypeOf(post)));
    }

    const json& padding = root.value("padding", json());
    if (padding.is_object() && padding.contains("pad_id")) {
      tok->pad_id_ = TokenId(padding["pad_id"], file, "padding.pad_id");
    } else if (const auto pad = tok->vocab_.find("[PAD]"); pad != tok->vocab_.end()) {
      tok->pad_id_ = pad->second;
    } else {
      TokenizerFileError(file, "padding.pad_id is missing and model.vocab has no [PAD]");
    }
    // Ids the post-processor and the padding add count as the vocabulary's: the encoder's
    // table must have their rows too (TextEmbedder checks vocab_size against it).
    tok->vocab_size_ =
        std::max({tok->vocab_size_, tok->start_id_ + 1, tok->end_id_ + 1, tok->pad_id_ + 1});
  } catch (const json::exception& e) {
    TokenizerFileError(file, fmt::format("unexpected content: {}", e.what()));
  } catch (const std::invalid_argument& e) {
    TokenizerFileError(file, e.what());
  }
  return tok;
}

std::u32string WordPieceTokenizer::NormalizeChars(std::u32string_view text) const {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (clean_text_) {
      if (c == 0 || c == 0xFFFD || IsBertControl(c)) continue;
      if (IsBertWhitespace(c)) c = ' ';
    }
    if (handle_chinese_chars_ && IsChineseChar(c)) {
      out.push_back(' ');
      out.push_back(c);
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  if (strip_accents_) {
    std::u32string decomposed = Nfd(out, kUnicode8);
    out.clear();
    for (char32_t c : decomposed) {
      if (!IsNonspacingMark(c)) out.push_back(c);
    }
  }
  if (lowercase_) {
    std::u32string lower;
    lower.reserve(out.size());
    for (char32_t c : out)
      AppendLower(c, &lower);
    out = std::move(lower);
  }
  return out;
}

void WordPieceTokenizer::PreTokenizeChars(std::u32string_view normalized,
                                          std::vector<std::u32string>* words) const {
  std::u32string word;
  for (char32_t c : normalized) {
    if (IsWhiteSpace(c) || IsPunctuation(c)) {
      if (!word.empty()) words->push_back(std::move(word));
      word.clear();
      if (!IsWhiteSpace(c)) words->push_back(std::u32string(1, c));
    } else {
      word.push_back(c);
    }
  }
  if (!word.empty()) words->push_back(std::move(word));
}

void WordPieceTokenizer::AppendWord(std::u32string_view word, std::vector<int32_t>* ids) const {
  if (static_cast<int>(word.size()) > max_input_chars_per_word_) {
    ids->push_back(unk_id_);
    return;
  }
  const size_t first = ids->size();
  for (size_t start = 0; start < word.size();) {
    bool found = false;
    for (size_t end = word.size(); end > start; --end) {
      std::string piece = start > 0 ? prefix_ : std::string();
      piece += EncodeUtf8(word.substr(start, end - start));
      if (const auto it = vocab_.find(piece); it != vocab_.end()) {
        ids->push_back(it->second);
        start = end;
        found = true;
        break;
      }
    }
    if (!found) {
      ids->resize(first);
      ids->push_back(unk_id_);
      return;
    }
  }
}

void WordPieceTokenizer::AppendNormalized(std::u32string_view text,
                                          std::vector<int32_t>* ids) const {
  std::vector<std::u32string> words;
  for (const Segment& segment : SplitAdded(NormalizeChars(text), added_, /*normalized=*/true)) {
    if (segment.id >= 0) {
      ids->push_back(segment.id);
      continue;
    }
    words.clear();
    PreTokenizeChars(segment.text, &words);
    for (const std::u32string& word : words)
      AppendWord(word, ids);
  }
}

std::vector<int32_t> WordPieceTokenizer::PieceIds(std::string_view text) const {
  std::vector<int32_t> ids;
  for (const Segment& segment : SplitAdded(DecodeUtf8(text), added_, /*normalized=*/false)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      AppendNormalized(segment.text, &ids);
    }
  }
  return ids;
}

std::string WordPieceTokenizer::Normalize(std::string_view text) const {
  return EncodeUtf8(NormalizeChars(DecodeUtf8(text)));
}

std::vector<std::string> WordPieceTokenizer::PreTokenize(std::string_view normalized) const {
  std::vector<std::u32string> words;
  PreTokenizeChars(DecodeUtf8(normalized), &words);
  std::vector<std::string> out;
  for (const std::u32string& word : words)
    out.push_back(EncodeUtf8(word));
  return out;
}

Tokens WordPieceTokenizer::Encode(std::string_view text, int length) const {
  return FrameTokens(PieceIds(text), length, start_id_, end_id_, pad_id_);
}

}  // namespace difftrain::text
