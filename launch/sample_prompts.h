// A text model's rows in `difftrain sample`: the prompts and captions sampled from, their
// embeddings and the unconditional text guidance steers away from (docs/sampling.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "launch/sample_options.h"
#include "launch/sample_source.h"
#include "model/data/text_table.h"
#include "model/family/family.h"

namespace difftrain::launch {

// A text model's grid rows: the texts sampled from (rows of `table`).
struct Prompts {
  TextTable table;                 // with the prompts a text encoder embedded appended
  std::string table_path;          // "": no table (a pretrained model's prompts, all embedded here)
  std::vector<int64_t> ids;        // one per row
  std::string text_encoder;        // the encoder that embedded prompts here, if one did
  std::vector<float> null_text;    // [L, D]: the unconditional text; empty: zeros
  std::vector<float> null_pooled;  // [P]: its pooled embedding (SDXL); empty: zeros
  // Whether the text encoder took the --lora files' text encoder parts (the prompts are all
  // embedded by it): the UNet's fusing passes those over.
  bool lora_text_encoder = false;
};

// The rows a text model samples: each --prompt (found in the text table by its exact text, or
// embedded by the text encoder) and each --captions id. The table is --text-table, or the one
// in the folder the checkpoint was trained from; from --pretrained weights with a text encoder
// it may be none, and the unconditional text is the empty prompt's embedding.
Result<Prompts> ResolvePrompts(const SampleOptions& o, const SampleSource& ckpt,
                               const SampleSchema& m);

}  // namespace difftrain::launch
