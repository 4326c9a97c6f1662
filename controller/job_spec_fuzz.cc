// libFuzzer target: the job-spec parser (TrainConfig::FromYamlText, the parser behind
// FromYamlFile, with the cluster sections, and `parallel: auto` resolved as a launcher resolves
// it) on arbitrary text. It must return a value or an error, never crash, hang or throw. Built
// and run for a few seconds by `make test` when clang has -fsanitize=fuzzer.
//
// The input is parsed from memory and the device is looked up once: a temporary file written
// and read back for every input cost a truncate, a discard and a writeback on ext4, and
// dominated the run (284 executions per second with the disk shared, docs/benchmarks.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include "job/job_spec.h"
#include "model/train/planner.h"

// ASan records the stack of every allocation in its stack depot, which is never freed: the
// parser's recursion gives ever new stacks, and the depot grew the process past 900 MB in
// 600,000 executions (about 2 GB, the run's limit, by 10 million) and took a fifth of the time.
// A report still shows the faulting access's stack; for the allocation's and the free's, rerun
// the input with ASAN_OPTIONS=malloc_context_size=30 (the environment wins over this default).
extern "C" const char* __asan_default_options() {
  return "malloc_context_size=0";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const difftrain::PlanDevice device = difftrain::LocalPlanDevice();
  const std::string text(reinterpret_cast<const char*>(data), size);
  difftrain::Result<difftrain::TrainConfig> config =
      difftrain::TrainConfig::FromYamlText(text, "job.yaml");
  if (config.ok()) {
    (void)difftrain::ResolveJob(*config, device);
    (void)config->ToJson();
  }
  return 0;
}
