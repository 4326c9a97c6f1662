// libFuzzer target: a text table (model/data/text_table.h: a safetensors file of caption
// embeddings with captions, labels, held-out flags and the encoder in its metadata, what
// `difftrain data embed` writes and a job's text model reads) on arbitrary bytes. It must read
// or be an error, never crash or hang; and a table that reads must hold what its sizes say
// (Validate: K captions, labels and flags, K·L·D embeddings, K·P pooled), every row's
// embedding and pooled embedding inside its arrays. The seeds carry no difftrain.crc32 (the
// reader checks it where present), so that mutations reach the parser.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/data/text_table.h"
#include "tests/fuzz/memory_file.h"

extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace difftrain;
  const fuzz::MemoryFile file(data, size);
  Result<TextTable> table = ReadTextTable(file.path());
  if (std::getenv("TEXT_TABLE_FUZZ_VERBOSE") != nullptr) {  // for reading what an input does
    std::fprintf(stderr, "%s\n", table.ok() ? "read" : table.status().message().c_str());
  }
  if (!table.ok()) return 0;
  if (!table->Validate().ok() || table->length <= 0 || table->dim <= 0) std::abort();
  if (table->skip_layers < 0) std::abort();
  volatile float sum = 0;  // each row's last values, read where ASan sees them
  for (int64_t k = 0; k < table->size(); ++k) {
    sum = sum + table->embedding(k)[table->text_floats() - 1];
    if (table->pooled_dim > 0) sum = sum + table->pooled_embedding(k)[table->pooled_dim - 1];
    (void)table->is_held_out(k);
  }
  return 0;
}
