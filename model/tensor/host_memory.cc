#include "model/tensor/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace difftrain {
namespace {

namespace fs = std::filesystem;

constexpr double kGiB = double(1ull << 30);

// The first line of a file, or nothing where it cannot be read.
std::optional<std::string> FirstLine(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<size_t> ParseBytes(const std::string& text) {
  size_t value = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const size_t digit = size_t(text[i] - '0');
    if (value > (SIZE_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  if (i == 0) return std::nullopt;
  return value;
}

// The value of `key` in a "key value" file (memory.stat), or in /proc/meminfo's "Key: N kB".
std::optional<size_t> KeyedValue(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  std::string name, value;
  while (in >> name >> value) {
    if (name == key || name == key + ":") return ParseBytes(value);
    in.ignore(SIZE_MAX, '\n');
  }
  return std::nullopt;
}

// The limit of one cgroup directory, where it sets one below `physical`.
std::optional<CgroupMemory> LimitAt(const fs::path& dir, int version, const std::string& path,
                                    size_t physical) {
  const char* limit_file = version == 2 ? "memory.max" : "memory.limit_in_bytes";
  const char* usage_file = version == 2 ? "memory.current" : "memory.usage_in_bytes";
  const std::optional<std::string> limit_text = FirstLine(dir / limit_file);
  if (!limit_text || *limit_text == "max") return std::nullopt;
  const std::optional<size_t> limit = ParseBytes(*limit_text);
  // cgroup v1 writes "no limit" as the largest page count it keeps (9223372036854771712).
  if (!limit || (physical > 0 && *limit >= physical)) return std::nullopt;
  CgroupMemory m;
  m.version = version;
  m.path = path;
  m.limit = *limit;
  const size_t usage = ParseBytes(FirstLine(dir / usage_file).value_or("")).value_or(0);
  // Inactive file pages are reclaimed before the OOM killer acts: the working set is the rest.
  std::optional<size_t> inactive =
      KeyedValue(dir / "memory.stat", version == 2 ? "inactive_file" : "total_inactive_file");
  if (!inactive && version == 1) inactive = KeyedValue(dir / "memory.stat", "inactive_file");
  m.in_use = usage - std::min(usage, inactive.value_or(0));
  return m;
}

// "/a/b/c", "/a/b", "/a", "/": a cgroup and its ancestors, leaf first.
std::vector<std::string> SelfAndAncestors(std::string path) {
  std::vector<std::string> out;
  if (path.empty() || path[0] != '/') path = "/" + path;
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  for (;;) {
    out.push_back(path);
    if (path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return out;
}

bool HasController(const std::string& list, const std::string& controller) {
  std::stringstream in(list);
  for (std::string c; std::getline(in, c, ',');)
    if (c == controller) return true;
  return false;
}

}  // namespace

size_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

size_t HostMemory::capacity() const {
  if (!cgroup) return physical;
  return physical > 0 ? std::min(physical, cgroup->limit) : cgroup->limit;
}

size_t HostMemory::headroom() const {
  size_t room = available > 0 ? available : physical > 0 ? physical : SIZE_MAX;
  if (cgroup) room = std::min(room, cgroup->headroom());
  return room;
}

std::string HostMemory::Describe() const {
  if (cgroup && (available == 0 || cgroup->headroom() <= available)) {
    return fmt::format(
        "the {:.2f} GiB left of the {:.2f} GiB memory limit of this process's cgroup {} (v{}; "
        "{:.2f} GiB of it in use)",
        cgroup->headroom() / kGiB, cgroup->limit / kGiB, cgroup->path, cgroup->version,
        cgroup->in_use / kGiB);
  }
  if (available > 0) {
    return fmt::format("the {:.2f} GiB available of this machine's {:.2f} GiB", available / kGiB,
                       physical / kGiB);
  }
  return fmt::format("this machine's {:.2f} GiB", physical / kGiB);
}

int64_t OomKillCount(const std::string& proc) {
  const std::optional<size_t> n = KeyedValue(fs::path(proc) / "vmstat", "oom_kill");
  return n ? static_cast<int64_t>(*n) : -1;
}

std::string HostMemory::DescribeCapacity() const {
  if (LimitedByCgroup()) {
    return fmt::format("the {:.2f} GiB memory limit of cgroup {} (v{})", cgroup->limit / kGiB,
                       cgroup->path, cgroup->version);
  }
  return fmt::format("this machine's {:.2f} GiB", physical / kGiB);
}

HostMemory ReadHostMemory(const std::string& proc, const std::string& cgroup_root) {
  HostMemory m;
  m.physical = PhysicalMemoryBytes();
  if (std::optional<size_t> kib = KeyedValue(fs::path(proc) / "meminfo", "MemAvailable")) {
    m.available = *kib * 1024;
  }
  // /proc/self/cgroup: "ID:controllers:path" a line; cgroup v2's one line is "0::path".
  // Its files are at the v2 mount (cgroup_root, or cgroup_root/unified beside v1 mounts) or
  // the v1 memory controller's (cgroup_root/memory). Inside a container the path may name a
  // cgroup above the container's mount: then only the mount's own root exists, which is the
  // container's cgroup.
  std::ifstream lines(fs::path(proc) / "self" / "cgroup");
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::vector<std::pair<fs::path, int>> mounts;
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      mounts = {{cgroup_root, 2}, {fs::path(cgroup_root) / "unified", 2}};
    } else if (HasController(controllers, "memory")) {
      mounts = {{fs::path(cgroup_root) / "memory", 1}};
    }
    for (const auto& [mount, version] : mounts) {
      for (const std::string& p : SelfAndAncestors(path)) {
        const fs::path dir = mount / p.substr(1);
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) continue;
        std::optional<CgroupMemory> limit = LimitAt(dir, version, p, m.physical);
        if (limit && (!m.cgroup || limit->headroom() < m.cgroup->headroom())) m.cgroup = limit;
      }
    }
  }
  return m;
}

}  // namespace difftrain
