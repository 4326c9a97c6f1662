// How much host memory this process may still allocate: the machine's available memory and,
// where the process runs in a memory cgroup with a limit (Slurm's --mem under task/cgroup, a
// Kubernetes pod's limits.memory, `podman run --memory`), what that limit leaves. An arena
// beyond it would not fail to allocate (Linux overcommits) but get the rank OOM-killed while
// it is filled; Buffer (buffer.h) refuses it instead, and the trainer says which limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace difftrain {

// The machine's physical memory in bytes (0 where the system does not say).
size_t PhysicalMemoryBytes();

// A memory cgroup's limit and what its processes use of it.
struct CgroupMemory {
  int version = 0;    // 1 or 2
  std::string path;   // as /proc/self/cgroup names it: "/slurm/uid_0/job_7/step_0"
  size_t limit = 0;   // memory.max (v2) or memory.limit_in_bytes (v1)
  size_t in_use = 0;  // usage less inactive file pages (reclaimable), as the kubelet counts
  size_t headroom() const { return limit > in_use ? limit - in_use : 0; }
};

struct HostMemory {
  size_t physical = 0;   // bytes; 0 where unknown
  size_t available = 0;  // /proc/meminfo's MemAvailable; 0 where unknown
  // The tightest limit among this process's cgroup and its ancestors, where one is set
  // below the machine's memory.
  std::optional<CgroupMemory> cgroup;

  // The memory this process and its children may hold at most: the machine's, or its cgroup's
  // limit where that is less (0 where unknown).
  size_t capacity() const;
  // Whether capacity() is the cgroup's limit, not the machine's memory.
  bool LimitedByCgroup() const { return cgroup && capacity() == cgroup->limit; }
  // The bytes one more allocation may take: the least of what the machine has available and
  // what the cgroup's limit leaves (SIZE_MAX where nothing is known).
  size_t headroom() const;
  // For error messages: "the 3.1 GiB left of this process's cgroup memory limit of 4.0 GiB
  // (cgroup v1 /slurm/job_7)" or "the 21.3 GiB available of this machine's 23.5 GiB".
  std::string Describe() const;
  // What capacity() is, for messages: "the 4.00 GiB memory limit of cgroup /kubepods/pod1
  // (v2)" or "this machine's 23.54 GiB".
  std::string DescribeCapacity() const;
};

// How many processes the kernel's OOM killer has killed since boot, on the whole machine (its
// own and every memory cgroup's; /proc/vmstat's oom_kill, Linux 4.13 and later), or -1 where
// it does not say. A process that died of SIGKILL while this rose was most likely one of them.
int64_t OomKillCount(const std::string& proc = "/proc");

// Reads it now. The roots are parameters so that a test can lay out another kernel's files;
// a file that is missing or unreadable leaves its field unknown.
HostMemory ReadHostMemory(const std::string& proc = "/proc",
                          const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace difftrain
