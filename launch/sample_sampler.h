// The sampler of `difftrain sample` and its options (docs/sampling.md): which sampler and
// timestep spacing the flags or a pipeline's scheduler name, and the solvers' and LCM's/TCD's
// keys, a pipeline scheduler's config with the flags over it.
#pragma once

#include <string>

#include "common/status.h"
#include "launch/sample_options.h"
#include "launch/sample_source.h"
#include "model/diffusion/sampler.h"

namespace difftrain::launch {

struct Sampling {
  std::string name;  // its flag: ddpm, ddim, euler …
  SamplerKind kind;
  TimestepSpacing spacing;
};

// The sampler and its timestep spacing (sample_sampler.cc says how they are chosen).
Result<Sampling> ChooseSampling(const SampleOptions& o, const SampleSource& source);

// DPM-Solver++'s (multistep, singlestep), DEIS's or UniPC's options into `options`; their flags
// with another sampler are refused.
Status ChooseSolverOptions(const SampleOptions& o, const SampleSource& source, SamplerKind kind,
                           SamplerOptions& options);

// Whether and how the x0 predictions are clipped into `options` (sample_sampler.cc says how);
// `latents`: the model samples latents, not pixels.
Status ChooseClipping(const SampleOptions& o, const SampleSource& source, SamplerKind kind,
                      bool latents, SamplerOptions& options);

// LCM's and TCD's options into `options`; --original-inference-steps with another sampler is
// refused.
Status ChooseLcmOptions(const SampleOptions& o, const SampleSource& source, SamplerKind kind,
                        SamplerOptions& options);

}  // namespace difftrain::launch
