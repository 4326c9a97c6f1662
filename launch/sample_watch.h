// `difftrain sample --watch`: samples every checkpoint of a run as it is written, beside the
// training (docs/sampling.md, "Samples while a run trains"), as diffusers' scripts sample their
// validation prompts every few epochs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "launch/sample_options.h"

namespace difftrain::launch {

// Where step `step`'s samples of output `path` go: a folder's subfolder `step-00000020`, a
// file's name with `-step-00000020` before its extension (grid.png → grid-step-00000020.png).
std::string StepOutput(const std::string& path, int64_t step, bool folder);

// Watches the run directory o.checkpoint: every published step not sampled yet (its outputs
// missing), the newest first, is sampled by `sample` with o's flags into StepOutput's paths.
// With o.tensorboard, each step's grid (o.out) is also the TensorBoard image `samples` of the
// step, in o.tensorboard/samples. Returns 0 once the run's last step (train.steps of its
// checkpoints) is sampled and no step is left; 1 when no new checkpoint came for o.watch_timeout
// seconds first, or a step could not be sampled (a step pruned by the run's checkpoint.keep before
// it was read is skipped with a warning); 2 for bad input.
int WatchCheckpoints(const SampleOptions& o,
                     const std::function<int(const SampleOptions&)>& sample);

}  // namespace difftrain::launch
