#include "common/log.h"

#include <spdlog/spdlog.h>

namespace difftrain {

Status SetupLogging(const std::string& level) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  // from_str answers "off" for anything it does not know; only accept "off" when asked.
  if (parsed == spdlog::level::off && level != "off") {
    return Errorf("unknown log level '{}' (expected trace, debug, info, warn, error or off)",
                  level);
  }
  spdlog::set_level(parsed);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  return Status::Ok();
}

}  // namespace difftrain
