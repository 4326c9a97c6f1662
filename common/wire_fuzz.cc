// libFuzzer target: the wire decoder (common/wire.h) on arbitrary bytes. A frame either
// fails to decode, or decodes into a message that encodes and decodes again to the same.
// Built and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace difftrain::wire;
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  difftrain::Result<Message> m = Decode(frame);
  if (!m.ok()) {
    (void)DropReason(m.status());
    return 0;
  }
  // Encode fails fast on a header its schema refuses: the decoder must never let one by.
  difftrain::Result<Message> again = Decode(Encode(*m));
  if (!again.ok() || again->type != m->type || again->header != m->header ||
      again->payload != m->payload) {
    std::abort();
  }
  return 0;
}
