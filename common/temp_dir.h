// Private temporary directories: new directories (mode 0700, made by mkdtemp) under
// $TMPDIR, or /tmp when it is unset or empty.
#pragma once

#include <string>

#include "common/status.h"

namespace difftrain {

// Creates TMPDIR/NAME-XXXXXX and returns its path.
Result<std::string> MakeTempDir(const std::string& name);

// A temporary directory that is removed, with everything in it, when the object goes away
// (unless Keep() was called: a failed test keeps its files for a closer look). Fails fast
// when no directory can be made.
class TempDir {
 public:
  explicit TempDir(const std::string& name = "difftrain");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

}  // namespace difftrain
