// libFuzzer target: the checkpoint shard reader (model/io/safetensors.h) on arbitrary bytes.
// The input is a file (an anonymous memory file, so no disk is touched); the whole-file
// reader and the streaming verifier must agree on it: both refuse it, or both accept it with
// the same size and checksum, and every tensor Read accepts lies inside the file.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/io/safetensors.h"
#include "tests/fuzz/memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace difftrain;
  const fuzz::MemoryFile file(data, size);
  const std::string path = file.path();
  Result<io::SafetensorsFile> read = io::SafetensorsFile::Read(path);
  Result<io::FileDigest> verified = io::SafetensorsFile::Verify(path);
  if (read.ok() != verified.ok()) std::abort();
  if (!read.ok()) return 0;
  if (read->digest().bytes != size || verified->bytes != size ||
      read->digest().crc32 != verified->crc32) {
    std::abort();
  }
  for (const std::string& name : read->Names()) {
    const io::TensorView* t = read->Find(name);
    if (t == nullptr || t->bytes > size) std::abort();
    const auto* begin = static_cast<const uint8_t*>(t->data);
    (void)begin[0 < t->bytes ? t->bytes - 1 : 0];  // ASan: inside the buffer
  }
  return 0;
}
