// The headers most fuzz-target sources include, precompiled once per optimization level with
// the code of their inline functions and templates in an object of their own (clang's
// -fpch-codegen, -fpch-instantiate-templates; cmake/fuzzers.cmake): each source then neither
// parses them again nor compiles their code again at -O0 under the sanitizers, about half of
// its compile. Only libraries and the standard library here, never the project's headers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// <filesystem> stays out: its inline functions call one of libstdc++'s that the shared library
// does not export (std::filesystem::path::_List::type), so code generated for all of them
// cannot link. nlohmann/json would include it for its conversions of paths, which no fuzzed
// source uses.
#define JSON_HAS_FILESYSTEM 0
#define JSON_HAS_EXPERIMENTAL_FILESYSTEM 0

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
