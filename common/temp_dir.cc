#include "common/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/check.h"

namespace difftrain {

Result<std::string> MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/" + name + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    return Errorf("creating a directory '{}': {}", pattern, std::strerror(errno));
  }
  return pattern;
}

TempDir::TempDir(const std::string& name) {
  Result<std::string> made = MakeTempDir(name);
  DT_CHECK(made.ok(), "{}", made.status().message());
  path_ = *made;
}

TempDir::~TempDir() {
  if (keep_) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace difftrain
