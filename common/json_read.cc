#include "common/json_read.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

namespace difftrain {

using json = nlohmann::json;

int JsonInt(const json& value, std::string_view what) {
  constexpr int64_t kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() <= uint64_t(kMax)) return static_cast<int>(value.get<uint64_t>());
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= kMin && v <= kMax) return static_cast<int>(v);
  } else if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::isfinite(v) && v == std::trunc(v) && v >= double(kMin) && v <= double(kMax))
      return static_cast<int>(v);
  } else {
    throw json::type_error::create(
        302, fmt::format("{}: type must be number, but is {}", what, value.type_name()), nullptr);
  }
  throw json::out_of_range::create(
      406, fmt::format("{}: {} is not an integer in [{}, {}]", what, value.dump(), kMin, kMax),
      nullptr);
}

int JsonIntOr(const json& object, const char* key, int fallback) {
  const auto it = object.find(key);
  return it == object.end() ? fallback : JsonInt(*it, key);
}

std::vector<int> JsonInts(const json& value, std::string_view what) {
  if (!value.is_array()) {
    throw json::type_error::create(
        302, fmt::format("{}: type must be array, but is {}", what, value.type_name()), nullptr);
  }
  std::vector<int> out;
  out.reserve(value.size());
  for (const json& v : value)
    out.push_back(JsonInt(v, what));
  return out;
}

std::string JsonStringOr(const json& object, const char* key, std::string fallback) {
  if (!object.is_object()) return fallback;
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

}  // namespace difftrain
