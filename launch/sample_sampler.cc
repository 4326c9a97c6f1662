#include "launch/sample_sampler.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace difftrain::launch {

namespace {

// The sampler a pipeline's scheduler names: its own where difftrain has it, else DDIM.
std::string PipelineSampler(const std::string& scheduler_class) {
  if (std::optional<SamplerKind> sampler = SamplerOfScheduler(scheduler_class))
    return SamplerFlag(*sampler);
  spdlog::info("the pipeline's scheduler is {}, which difftrain does not have: sampling with DDIM",
               scheduler_class.empty() ? "unnamed" : scheduler_class);
  return "ddim";
}

// Where a source's scheduler config was read from, for its errors: the pipeline's file, or the
// one diffusers' from_single_file gives an original checkpoint.
std::string SchedulerConfigName(const SampleSource& source) {
  return source.pipeline.empty()
             ? std::string("the scheduler config")
             : fmt::format("'{}/scheduler/scheduler_config.json'", source.pipeline);
}

}  // namespace

// The sampler and its timestep spacing: the flags, else a pipeline's scheduler's (spaced as its
// config says), else the sampler's default (DefaultSpacing: DiT's respacing for DDPM and DDIM,
// else its scheduler's default spacing, leading for PNDM, linspace for the others). A spacing
// flag keeps the scheduler's other keys, as diffusers' from_config(config, timestep_spacing=…).
// A pipeline's Karras σ's stay with a sampler that has them and are dropped for one that has
// not (DDIM, PNDM …), as from_config drops keys a class does not take.
Result<Sampling> ChooseSampling(const SampleOptions& o, const SampleSource& source) {
  Sampling c;
  c.name = o.sampler        ? *o.sampler
           : source.spacing ? PipelineSampler(source.scheduler_class)
                            : "ddpm";
  Result<SamplerKind> kind = ParseSamplerKind(c.name);
  if (!kind.ok()) return kind.status().WithContext("--sampler");
  c.kind = *kind;
  // DDPMScheduler's variance: difftrain's DDPM takes the posterior's (fixed_small; its _log
  // form is the same draw) or a model's learned range.
  if (const nlohmann::json& config = source.scheduler_config; c.kind == SamplerKind::kDdpm &&
                                                              config.contains("variance_type") &&
                                                              !config["variance_type"].is_null()) {
    const nlohmann::json& variance = config["variance_type"];
    if (!variance.is_string() || (variance != "fixed_small" && variance != "fixed_small_log" &&
                                  variance != "learned_range")) {
      return Errorf(
          "{}: variance_type {} is not supported by --sampler ddpm (fixed_small, "
          "fixed_small_log and learned_range are)",
          SchedulerConfigName(source), variance.dump());
    }
  }
  if (o.eta && c.kind != SamplerKind::kDdim && c.kind != SamplerKind::kTcd)
    return Status::Error("--eta is for --sampler ddim and tcd (its gamma) only");
  c.spacing = source.spacing.value_or(TimestepSpacing{});
  if (o.timestep_spacing == "respace") {
    c.spacing = TimestepSpacing{};
  } else if (o.timestep_spacing) {
    c.spacing.kind = *o.timestep_spacing;
  }
  if (!c.spacing.diffusers() && !o.timestep_spacing) c.spacing.kind = DefaultSpacing(c.kind);
  if (HasOneSpacing(c.kind)) {
    // Its class has no timestep_spacing, or ignores it: a pipeline's is ignored, as the class
    // ignores it.
    if (o.timestep_spacing && *o.timestep_spacing != DefaultSpacing(c.kind)) {
      return Errorf("--timestep-spacing: --sampler {} ({}) places its steps {} only", c.name,
                    SchedulerClassOf(c.kind), OneSpacingWords(c.kind));
    }
    c.spacing.kind = DefaultSpacing(c.kind);
  }
  const bool has_karras = TakesKarrasSigmas(c.kind);
  if (o.karras_sigmas.value_or(false) && !has_karras) {
    return Errorf("--karras-sigmas: Karras sigmas are for --sampler {}", KarrasSamplerNames());
  }
  c.spacing.karras = o.karras_sigmas.value_or(c.spacing.karras && has_karras);
  // sigma_min and sigma_max are EulerDiscreteScheduler's keys.
  if (c.kind != SamplerKind::kEuler || !c.spacing.karras)
    c.spacing.sigma_min = c.spacing.sigma_max = 0;
  if (o.steps_offset) c.spacing.steps_offset = *o.steps_offset;
  if (o.set_alpha_to_one) c.spacing.set_alpha_to_one = *o.set_alpha_to_one;
  if (Status s = c.spacing.Validate(); !s.ok()) {
    return s.WithContext(o.timestep_spacing || !source.spacing ? "--timestep-spacing"
                                                               : "the pipeline's scheduler");
  }
  return c;
}

// The solvers' flags: each solver's own solver types and algorithm types (none: no flag).
namespace {

struct SolverFlags {
  SamplerKind kind;
  std::vector<std::string> types, algorithms;
  bool final_sigmas;  // takes final_sigmas_type
};
const std::vector<SolverFlags>& Solvers() {
  static const std::vector<SolverFlags> solvers = {
      {SamplerKind::kDpmSolver, {"midpoint", "heun"}, {"dpmsolver++", "sde-dpmsolver++"}, true},
      {SamplerKind::kDpmSolverSinglestep, {"midpoint", "heun"}, {"dpmsolver++"}, true},
      {SamplerKind::kDeis, {"logrho"}, {"deis"}, false},
      {SamplerKind::kUniPc, {"bh1", "bh2"}, {}, false},
  };
  return solvers;
}

}  // namespace

// DPM-Solver++'s (multistep, singlestep), DEIS's or UniPC's options, as the chosen class's
// from_config takes them: the pipeline scheduler's keys (none from a checkpoint),
// --solver-order, --solver-type, --algorithm-type, --final-sigmas-type and --lower-order-final
// over them. Those flags with a sampler that has not the key are refused.
Status ChooseSolverOptions(const SampleOptions& o, const SampleSource& source, SamplerKind kind,
                           SamplerOptions& options) {
  const SolverFlags* solver = nullptr;
  std::vector<std::string> with_order, with_algorithm, with_final;
  for (const SolverFlags& s : Solvers()) {
    if (s.kind == kind) solver = &s;
    with_order.push_back(SamplerFlag(s.kind));
    if (!s.algorithms.empty()) with_algorithm.push_back(SamplerFlag(s.kind));
    if (s.final_sigmas) with_final.push_back(SamplerFlag(s.kind));
  }
  if ((o.solver_order || o.solver_type || o.lower_order_final) && !solver) {
    return Errorf("--solver-order, --solver-type and --lower-order-final are for --sampler {}",
                  fmt::join(with_order, ", "));
  }
  if (o.algorithm_type && (!solver || solver->algorithms.empty()))
    return Errorf("--algorithm-type is for --sampler {}", fmt::join(with_algorithm, ", "));
  if (o.final_sigmas_type && (!solver || !solver->final_sigmas))
    return Errorf("--final-sigmas-type is for --sampler {}", fmt::join(with_final, ", "));
  if (!solver) return Status::Ok();
  // The flags name the chosen solver's own values (a pipeline's config may hold another
  // class's, which from_config maps).
  const auto check = [&](const char* flag, const std::optional<std::string>& value,
                         const std::vector<std::string>& allowed) -> Status {
    if (!value || std::find(allowed.begin(), allowed.end(), *value) != allowed.end())
      return Status::Ok();
    return Errorf("{}: '{}' is not one of the {} solver's ({})", flag, *value, SamplerFlag(kind),
                  fmt::join(allowed, ", "));
  };
  DT_RETURN_IF_ERROR(check("--solver-type", o.solver_type, solver->types));
  DT_RETURN_IF_ERROR(check("--algorithm-type", o.algorithm_type, solver->algorithms));
  nlohmann::json config = source.scheduler_config;
  if (o.solver_order) config["solver_order"] = *o.solver_order;
  if (o.solver_type) config["solver_type"] = *o.solver_type;
  if (o.algorithm_type) config["algorithm_type"] = *o.algorithm_type;
  if (o.final_sigmas_type) config["final_sigmas_type"] = *o.final_sigmas_type;
  if (o.lower_order_final) config["lower_order_final"] = *o.lower_order_final;
  // An error names the flags given, else the pipeline's file.
  std::vector<std::string> given;
  for (const auto& [flag, set] : std::vector<std::pair<const char*, bool>>{
           {"--solver-order", o.solver_order.has_value()},
           {"--solver-type", o.solver_type.has_value()},
           {"--algorithm-type", o.algorithm_type.has_value()},
           {"--final-sigmas-type", o.final_sigmas_type.has_value()},
           {"--lower-order-final", o.lower_order_final.has_value()}}) {
    if (set) given.push_back(flag);
  }
  const std::string where =
      !given.empty() ? fmt::format("{}", fmt::join(given, ", ")) : SchedulerConfigName(source);
  const auto read = [&](auto parsed, auto& into) -> Status {
    if (!parsed.ok()) return parsed.status().WithContext(where);
    into = *parsed;
    return Status::Ok();
  };
  switch (kind) {
    case SamplerKind::kDeis:
      return read(DeisOptions::FromDiffusersScheduler(config), options.deis);
    case SamplerKind::kUniPc:
      return read(UniPcOptions::FromDiffusersScheduler(config), options.unipc);
    default:
      return read(DpmSolverOptions::FromDiffusersScheduler(
                      config, kind == SamplerKind::kDpmSolverSinglestep),
                  options.dpm);
  }
}

// Whether and how the x0 predictions are clipped: --clip-denoised, else a pipeline scheduler's
// clip_sample as the chosen class takes it from_config (ReadDiffusersClipping), clipped as
// diffusers clips; else as DiT's sampler does, pixels (DDPM, DDIM) clipped to [−1, 1] and
// latents not.
Status ChooseClipping(const SampleOptions& o, const SampleSource& source, SamplerKind kind,
                      bool latents, SamplerOptions& options) {
  if (!source.spacing) {  // no scheduler config: DiT's
    options.clip_denoised = o.clip_denoised.value_or(
        kind == SamplerKind::kDdpm || kind == SamplerKind::kDdim ? !latents : false);
    return Status::Ok();
  }
  const std::string where = SchedulerConfigName(source);
  Result<bool> defaulted = ReadDiffusersClipping(kind, source.scheduler_config, options);
  if (!defaulted.ok()) return defaulted.status().WithContext(where);
  if (o.clip_denoised) {
    options.clip_denoised = *o.clip_denoised;
  } else if (*defaulted) {
    spdlog::info(
        "{0} names no clip_sample: the x0 predictions are clipped to [-{1}, {1}], as "
        "diffusers' {2}.from_config clips them by default (--clip-denoised false not to)",
        where, options.clip_range, SchedulerClassOf(kind));
  }
  return Status::Ok();
}

// LCM's and TCD's options: the pipeline scheduler's keys (none from a checkpoint), with
// --original-inference-steps over them; the flag is refused with another sampler.
Status ChooseLcmOptions(const SampleOptions& o, const SampleSource& source, SamplerKind kind,
                        SamplerOptions& options) {
  if (kind != SamplerKind::kLcm && kind != SamplerKind::kTcd) {
    if (o.original_inference_steps)
      return Status::Error("--original-inference-steps is for --sampler lcm and tcd");
    return Status::Ok();
  }
  nlohmann::json config = source.scheduler_config;
  if (o.original_inference_steps) config["original_inference_steps"] = *o.original_inference_steps;
  Result<LcmOptions> lcm = LcmOptions::FromDiffusersScheduler(config);
  if (!lcm.ok()) {
    return lcm.status().WithContext(o.original_inference_steps
                                        ? std::string("--original-inference-steps")
                                        : SchedulerConfigName(source));
  }
  options.lcm = *lcm;
  return Status::Ok();
}

}  // namespace difftrain::launch
