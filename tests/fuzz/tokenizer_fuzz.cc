// libFuzzer target: the tokenizer loaders (model/text/tokenizer.h) on arbitrary files, and
// Encode on arbitrary text. A tokenizer's files come with the pretrained weights a user points
// a job or `difftrain sample` at, so they are input like any other: loading must return a
// tokenizer or throw std::runtime_error (what LoadTokenizer promises, and what
// TextEmbedder::Load turns into an error naming the file), never crash, hang or throw anything
// else; and a tokenizer that loads must give `length` ids, each in [0, vocab_size()) — the text
// encoder indexes its embedding table with them after checking vocab_size() alone — with a
// mask of ones then zeros.
//
// The input is files then a text, parted by a line of five '=': its first byte picks the kind
// (even: CLIP's BPE, the parts vocab.json, merges.txt, special_tokens_map.json and
// tokenizer_config.json, the last two written only when present; odd: WordPiece's
// tokenizer.json), the part after the files is encoded. The files go to a folder in /dev/shm
// where there is one (a file on ext4 costs a writeback each input), made once a process.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/text/tokenizer.h"

// As job_spec_fuzz: allocation stacks kept by ASan grow without bound over a long run.
extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

namespace {

namespace fs = std::filesystem;

const fs::path& Folder() {
  static const fs::path folder = [] {
    const std::string base = fs::is_directory("/dev/shm") ? "/dev/shm" : fs::temp_directory_path();
    std::string name = base + "/tokenizer_fuzz.XXXXXX";
    if (::mkdtemp(name.data()) == nullptr) std::abort();
    return fs::path(name);
  }();
  return folder;
}

std::vector<std::string_view> Parts(std::string_view input) {
  constexpr std::string_view kSeparator = "\n=====\n";
  std::vector<std::string_view> parts;
  for (;;) {
    const size_t at = input.find(kSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(input.substr(0, at));
    input.remove_prefix(at + kSeparator.size());
  }
  parts.push_back(input);
  return parts;
}

void Write(const fs::path& file, const std::string_view* content) {
  if (content == nullptr) {
    fs::remove(file);
    return;
  }
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(content->data(), static_cast<std::streamsize>(content->size()));
  if (!out) std::abort();
}

void Check(const difftrain::text::Tokenizer& tokenizer, std::string_view text, int length) {
  difftrain::text::Tokens tokens;
  try {
    tokens = tokenizer.Encode(text, length);
  } catch (const std::invalid_argument&) {
    return;  // text that is not UTF-8
  }
  if (tokens.ids.size() != size_t(length) || tokens.mask.size() != size_t(length)) std::abort();
  bool padding = false;
  for (int i = 0; i < length; ++i) {
    if (tokens.ids[i] < 0 || tokens.ids[i] >= tokenizer.vocab_size()) std::abort();
    if (tokens.mask[i] > 1 || (padding && tokens.mask[i] == 1)) std::abort();
    padding = padding || tokens.mask[i] == 0;
  }
  if (tokens.mask[0] != 1 || tokens.mask[1] != 1) std::abort();  // start and end
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool wordpiece = data[0] % 2 == 1;
  const std::vector<std::string_view> parts =
      Parts(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  const fs::path& folder = Folder();
  static constexpr std::array<const char*, 5> kFiles = {"vocab.json", "merges.txt",
                                                        "special_tokens_map.json",
                                                        "tokenizer_config.json", "tokenizer.json"};
  const size_t files = wordpiece ? 1 : 4;
  for (size_t f = 0; f < kFiles.size(); ++f) {
    const size_t part = wordpiece ? f - 4 : f;  // WordPiece: tokenizer.json is part 0
    const bool used = wordpiece ? f == 4 : f < 4;
    // CLIP's folder always has vocab.json and merges.txt (LoadTokenizer's choice of kind).
    const std::string_view empty;
    const std::string_view* content =
        used && part < parts.size() - 1 ? &parts[part] : (used && f < 2 ? &empty : nullptr);
    Write(folder / kFiles[f], content);
  }
  std::unique_ptr<difftrain::text::Tokenizer> tokenizer;
  try {
    tokenizer = difftrain::text::LoadTokenizer(folder);
  } catch (const std::runtime_error&) {
    return 0;
  }
  if (tokenizer == nullptr || tokenizer->vocab_size() <= 0) std::abort();
  const std::string_view text = parts.size() > files ? parts[files] : std::string_view();
  for (int length : {2, 5, 77})
    Check(*tokenizer, text, length);
  return 0;
}
