#include "model/text/clip_bpe.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/text/unicode.h"

namespace difftrain::text {
namespace {

using nlohmann::json;

constexpr int kMaxMerges = 49152 - 256 - 2;  // transformers reads lines [1, 49152 − 256 − 2]

std::string ReadFile(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) TokenizerFileError(file, "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

json ReadJson(const std::filesystem::path& file) {
  try {
    return json::parse(ReadFile(file));
  } catch (const json::exception& e) {
    TokenizerFileError(file, fmt::format("is not JSON: {}", e.what()));
  }
}

// Python 3.11's unicodedata (Unicode 14.0) through ICU.
UCharCategory PyCategory(char32_t c) {
  return CategoryAsOf(c, kUnicode14);
}
bool IsPyControl(char32_t c) {  // transformers' _is_control
  return c != '\t' && c != '\n' && c != '\r' && IsControlCategory(PyCategory(c));
}
bool IsPyWhitespace(char32_t c) {  // transformers' _is_whitespace
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || PyCategory(c) == U_SPACE_SEPARATOR;
}
bool IsLetter(char32_t c) {
  return IsLetterCategory(PyCategory(c));
}
bool IsNumber(char32_t c) {
  return IsNumberCategory(PyCategory(c));
}

// Under IGNORECASE the `regex` module matches neither [\p{L}] nor [^\s\p{L}\p{N}] at a
// character that is no letter but folds to one (U+0345 COMBINING GREEK YPOGEGRAMMENI → ι):
// findall passes over it.
bool FoldsToLetterOnly(char32_t c) {
  return !IsLetter(c) && IsLetter(FoldCase(c));
}
bool IsOtherSymbol(char32_t c) {  // [^\s\p{L}\p{N}]
  return !IsWhiteSpace(c) && !IsLetter(c) && !IsNumber(c) && !FoldsToLetterOnly(c);
}

// Whether `pattern` (ASCII, lowercase) is at text[i], as IGNORECASE compares: simple case
// folding (so 'ſ' is an 's').
bool MatchesAt(std::u32string_view text, size_t i, std::string_view pattern) {
  if (text.size() - i < pattern.size()) return false;
  for (size_t k = 0; k < pattern.size(); ++k) {
    if (FoldCase(text[i + k]) != static_cast<char32_t>(pattern[k])) return false;
  }
  return true;
}

// The pattern's matches in `text` (re.findall).
std::vector<std::u32string> FindWords(std::u32string_view text) {
  static constexpr std::string_view kLiterals[] = {
      "<|startoftext|>", "<|endoftext|>", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  std::vector<std::u32string> out;
  for (size_t i = 0; i < text.size();) {
    size_t end = i;
    for (std::string_view literal : kLiterals) {
      if (MatchesAt(text, i, literal)) {
        end = i + literal.size();
        break;
      }
    }
    if (end == i) {
      const char32_t c = text[i];
      if (IsLetter(c)) {
        while (end < text.size() && IsLetter(text[end]))
          ++end;
      } else if (IsNumber(c)) {
        end = i + 1;
      } else if (IsOtherSymbol(c)) {
        while (end < text.size() && IsOtherSymbol(text[end]))
          ++end;
      }
    }
    if (end == i) {
      ++i;
    } else {
      out.emplace_back(text.substr(i, end - i));
      i = end;
    }
  }
  return out;
}

// BasicTokenizer(strip_accents=False, do_split_on_punc=False).tokenize, joined by ' '.
std::u32string BasicTokenize(std::u32string_view text) {
  std::u32string cleaned;
  cleaned.reserve(text.size());
  for (char32_t c : text) {
    if (c == 0 || c == 0xFFFD || IsPyControl(c)) continue;
    if (IsPyWhitespace(c)) {
      cleaned.push_back(' ');
    } else if (IsBertChineseChar(c)) {
      cleaned += {' ', c, ' '};
    } else {
      cleaned.push_back(c);
    }
  }
  const std::u32string composed = Nfc(cleaned);
  std::u32string out;
  for (size_t i = 0; i < composed.size();) {
    if (IsPythonSpace(composed[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < composed.size() && !IsPythonSpace(composed[end]))
      ++end;
    if (!out.empty()) out.push_back(' ');
    out += ToLower(std::u32string_view(composed).substr(i, end - i));
    i = end;
  }
  return out;
}

// A token of special_tokens_map.json / tokenizer_config.json: a string or {"content": …}.
bool TokenContent(const json& config, const char* key, std::string* out) {
  if (!config.is_object() || !config.contains(key)) return false;
  const json& value = config[key];
  if (value.is_string()) {
    *out = value.get<std::string>();
    return true;
  }
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    *out = value["content"].get<std::string>();
    return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<ClipBpeTokenizer> ClipBpeTokenizer::Load(const std::filesystem::path& folder) {
  std::unique_ptr<ClipBpeTokenizer> tok(new ClipBpeTokenizer());
  const std::filesystem::path vocab_file = folder / "vocab.json";
  const json vocab = ReadJson(vocab_file);
  if (!vocab.is_object()) TokenizerFileError(vocab_file, "is not a JSON object of token → id");
  for (const auto& [token, id] : vocab.items()) {
    const int32_t checked = TokenId(id, vocab_file, fmt::format("\"{}\"", token));
    tok->vocab_[token] = checked;
    tok->vocab_size_ = std::max(tok->vocab_size_, checked + 1);
  }

  // Python: read().strip().split("\n")[1 : 49152 - 256 - 2 + 1], each line .split().
  const std::filesystem::path merges_file = folder / "merges.txt";
  std::istringstream merges(ReadFile(merges_file));
  std::string line;
  std::getline(merges, line);  // the "#version" header
  for (int rank = 0; rank < kMaxMerges && std::getline(merges, line); ++rank) {
    std::istringstream fields(line);
    std::string first, second, extra;
    if (fields >> first >> second && !(fields >> extra)) tok->ranks_[first + " " + second] = rank;
  }

  // bytes_to_unicode: printable Latin-1 bytes are themselves, the others U+0100 onwards.
  for (int b = 0, n = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    tok->byte_chars_[b].clear();
    AppendUtf8(printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++),
               &tok->byte_chars_[b]);
  }

  // Special tokens: tokenizer_config.json, then special_tokens_map.json over it.
  std::string bos = "<|startoftext|>", eos = "<|endoftext|>", unk = "<|endoftext|>",
              pad = "<|endoftext|>";
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (!std::filesystem::exists(folder / name)) continue;
    const json config = ReadJson(folder / name);
    TokenContent(config, "bos_token", &bos);
    TokenContent(config, "eos_token", &eos);
    TokenContent(config, "unk_token", &unk);
    TokenContent(config, "pad_token", &pad);
  }
  // As transformers adds them: one not in the vocabulary gets the next id.
  int next_id = static_cast<int>(tok->vocab_.size());
  for (const std::string* token : {&bos, &eos, &unk, &pad}) {
    if (!tok->vocab_.contains(*token)) {
      tok->vocab_[*token] = next_id++;
      tok->vocab_size_ = std::max(tok->vocab_size_, next_id);
    }
    try {
      tok->specials_.push_back({DecodeUtf8(*token), tok->vocab_[*token]});
    } catch (const std::invalid_argument& e) {
      TokenizerFileError(folder, fmt::format("special token: {}", e.what()));
    }
  }
  tok->bos_id_ = tok->vocab_[bos];
  tok->eos_id_ = tok->vocab_[eos];
  tok->unk_id_ = tok->vocab_[unk];
  tok->pad_id_ = tok->vocab_[pad];
  return tok;
}

int32_t ClipBpeTokenizer::Id(const std::string& symbol) const {
  const auto it = vocab_.find(symbol);
  return it != vocab_.end() ? it->second : unk_id_;
}

std::vector<std::string> ClipBpeTokenizer::BpeBytes(const std::string& encoded) const {
  if (encoded == "<|startoftext|>" || encoded == "<|endoftext|>") return {encoded};
  std::vector<std::string> word;
  for (char32_t c : DecodeUtf8(encoded)) {
    word.emplace_back();
    AppendUtf8(c, &word.back());
  }
  if (word.empty()) return word;
  word.back() += "</w>";
  while (word.size() > 1) {
    int best = INT_MAX;
    std::string best_first, best_second;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks_.find(word[i] + " " + word[i + 1]);
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        best_first = word[i];
        best_second = word[i + 1];
      }
    }
    if (best == INT_MAX) break;
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == best_first && word[i + 1] == best_second) {
        merged.push_back(best_first + best_second);
        i += 2;
      } else {
        merged.push_back(std::move(word[i]));
        ++i;
      }
    }
    word = std::move(merged);
  }
  return word;
}

std::vector<std::string> ClipBpeTokenizer::Bpe(std::string_view word) const {
  std::string encoded;
  for (unsigned char b : word)
    encoded += byte_chars_[b];
  return BpeBytes(encoded);
}

std::vector<std::u32string> ClipBpeTokenizer::WordChars(std::u32string_view text) const {
  return FindWords(BasicTokenize(text));
}

std::vector<std::string> ClipBpeTokenizer::Words(std::string_view text) const {
  std::vector<std::string> out;
  for (const std::u32string& word : WordChars(DecodeUtf8(text)))
    out.push_back(EncodeUtf8(word));
  return out;
}

std::vector<int32_t> ClipBpeTokenizer::PieceIds(std::string_view text) const {
  const std::u32string chars = DecodeUtf8(text);
  std::vector<int32_t> ids;
  auto add_text = [&](std::u32string_view piece) {
    if (piece.empty()) return;
    for (const std::u32string& word : WordChars(piece)) {
      for (const std::string& symbol : Bpe(EncodeUtf8(word)))
        ids.push_back(Id(symbol));
    }
  };
  // The added tokens' trie: the leftmost match, the longest there.
  size_t done = 0;
  for (size_t i = 0; i < chars.size();) {
    const Special* best = nullptr;
    for (const Special& special : specials_) {
      if (!special.content.empty() &&
          std::u32string_view(chars).substr(i, special.content.size()) == special.content &&
          (best == nullptr || special.content.size() > best->content.size())) {
        best = &special;
      }
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    add_text(std::u32string_view(chars).substr(done, i - done));
    ids.push_back(best->id);
    done = i = i + best->content.size();
  }
  add_text(std::u32string_view(chars).substr(done));
  return ids;
}

std::vector<int32_t> ClipBpeTokenizer::AddTokens(const std::vector<std::string>& tokens) {
  std::vector<int32_t> ids;
  for (const std::string& token : tokens) {
    const std::u32string content = DecodeUtf8(token);
    const bool added = std::any_of(specials_.begin(), specials_.end(),
                                   [&](const Special& s) { return s.content == content; });
    if (content.empty() || added || vocab_.contains(token)) {
      throw std::invalid_argument(
          fmt::format("the token '{}' is {} the tokenizer's vocabulary: choose another", token,
                      content.empty() ? "empty, not a token of" : "already in"));
    }
    ids.push_back(vocab_size_++);
    specials_.push_back({content, ids.back()});
  }
  return ids;
}

Tokens ClipBpeTokenizer::Encode(std::string_view text, int length) const {
  return FrameTokens(PieceIds(text), length, bos_id_, eos_id_, pad_id_);
}

}  // namespace difftrain::text
