// libFuzzer target: the job-spec parser (TrainConfig::FromYamlFile with the cluster
// sections, and `parallel: auto` resolved as a launcher resolves it) on arbitrary text. It must
// return a value or an error, never crash, hang or throw. Built and run for a few seconds by `make
// test` when clang has -fsanitize=fuzzer.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "job/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/difftrain-job-spec-fuzz-" + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  difftrain::Result<difftrain::TrainConfig> config = difftrain::TrainConfig::FromYamlFile(path);
  if (config.ok()) {
    (void)difftrain::ResolveJob(*config);
    (void)config->ToJson();
  }
  return 0;
}
