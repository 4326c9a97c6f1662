// Fail-fast checks for broken invariants and programming errors (never for user input:
// that is what Status is for). A failed check prints file:line and the message, then aborts.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace difftrain::detail {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* cond,
                                     const std::string& message) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, cond, message.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace difftrain::detail

// DT_CHECK(n > 0, "batch {} must be positive", n);
#define DT_CHECK(cond, ...)                                                                       \
  do {                                                                                            \
    if (!(cond)) [[unlikely]]                                                                     \
      ::difftrain::detail::CheckFailed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
