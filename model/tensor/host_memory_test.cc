// ReadHostMemory against the files of the layouts it meets: cgroup v2 (a Kubernetes pod's
// nesting), v1 beside other controllers (Slurm's job and step cgroups), a container whose
// cgroup path is not under its own mount, and no limit. This machine's kernel has only one of
// them, so the others are laid out in a directory as their kernels write them; a real limit
// is tested end to end by tests/integration/memory_limit_test.cc.
#include "model/tensor/host_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "model/tensor/buffer.h"

namespace difftrain {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMiB = size_t(1) << 20;

class HostMemoryTest : public ::testing::Test {
 protected:
  void Write(const std::string& relative, const std::string& text) {
    const fs::path file = fs::path(tmp_.path()) / relative;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  std::string proc() const { return tmp_.path() + "/proc"; }
  std::string cgroup() const { return tmp_.path() + "/cgroup"; }
  // MemAvailable of the laid-out /proc/meminfo.
  void Available(size_t bytes) {
    Write("proc/meminfo", "MemTotal:       99999999 kB\nMemFree:          1 kB\nMemAvailable:   " +
                              std::to_string(bytes / 1024) + " kB\n");
  }

  TempDir tmp_;
};

TEST_F(HostMemoryTest, CgroupV2TakesTheTightestAncestorLessReclaimableFiles) {
  Available(16 * 1024 * kMiB);
  Write("proc/self/cgroup", "0::/kubepods/burstable/pod1/container\n");
  // The container sets no limit of its own; the pod's is 4 GiB, of which 1.5 GiB is charged,
  // 0.5 GiB of it inactive page cache; the QoS class above sets a looser one.
  Write("cgroup/kubepods/burstable/pod1/container/memory.max", "max\n");
  Write("cgroup/kubepods/burstable/pod1/memory.max", std::to_string(4096 * kMiB) + "\n");
  Write("cgroup/kubepods/burstable/pod1/memory.current", std::to_string(1536 * kMiB) + "\n");
  Write("cgroup/kubepods/burstable/pod1/memory.stat",
        "anon 1\nfile 2\nactive_file 7\ninactive_file " + std::to_string(512 * kMiB) + "\n");
  Write("cgroup/kubepods/burstable/memory.max", std::to_string(8192 * kMiB) + "\n");
  Write("cgroup/kubepods/burstable/memory.current", std::to_string(1536 * kMiB) + "\n");
  const HostMemory m = ReadHostMemory(proc(), cgroup());
  ASSERT_TRUE(m.cgroup.has_value());
  EXPECT_EQ(m.cgroup->version, 2);
  EXPECT_EQ(m.cgroup->path, "/kubepods/burstable/pod1");
  EXPECT_EQ(m.cgroup->limit, 4096 * kMiB);
  EXPECT_EQ(m.cgroup->in_use, 1024 * kMiB);
  EXPECT_EQ(m.headroom(), 3072 * kMiB);
  EXPECT_EQ(m.capacity(), std::min(m.physical, 4096 * kMiB));
  if (m.physical > 4096 * kMiB) {
    EXPECT_EQ(m.DescribeCapacity(),
              "the 4.00 GiB memory limit of cgroup /kubepods/burstable/pod1 (v2)");
  }
  EXPECT_EQ(m.Describe(),
            "the 3.00 GiB left of the 4.00 GiB memory limit of this process's cgroup "
            "/kubepods/burstable/pod1 (v2; 1.00 GiB of it in use)");
}

TEST_F(HostMemoryTest, CgroupV1MemoryControllerBesideOthers) {
  Available(16 * 1024 * kMiB);
  Write("proc/self/cgroup",
        "12:pids:/slurm/uid_0/job_7/step_0\n"
        "4:cpuset,memory:/slurm/uid_0/job_7/step_0\n"
        "0::/\n");
  // Slurm's task/cgroup limits the job; the step's "no limit" is v1's largest page count.
  Write("cgroup/memory/slurm/uid_0/job_7/step_0/memory.limit_in_bytes", "9223372036854771712\n");
  Write("cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes", std::to_string(2048 * kMiB));
  Write("cgroup/memory/slurm/uid_0/job_7/memory.usage_in_bytes", std::to_string(300 * kMiB));
  Write("cgroup/memory/slurm/uid_0/job_7/memory.stat",
        "cache 5\ninactive_file 1\ntotal_inactive_file " + std::to_string(100 * kMiB) + "\n");
  // v1's root: no limit.
  Write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  const HostMemory m = ReadHostMemory(proc(), cgroup());
  ASSERT_TRUE(m.cgroup.has_value());
  EXPECT_EQ(m.cgroup->version, 1);
  EXPECT_EQ(m.cgroup->path, "/slurm/uid_0/job_7");
  EXPECT_EQ(m.cgroup->in_use, 200 * kMiB);
  EXPECT_EQ(m.headroom(), 1848 * kMiB);
}

TEST_F(HostMemoryTest, AContainersOwnCgroupIsItsMountsRoot) {
  Available(16 * 1024 * kMiB);
  // Without a cgroup namespace the path is the host's; the container sees its own cgroup as
  // the mount's root.
  Write("proc/self/cgroup", "0::/system.slice/libpod-abc.scope/container\n");
  Write("cgroup/memory.max", std::to_string(512 * kMiB) + "\n");
  Write("cgroup/memory.current", std::to_string(12 * kMiB) + "\n");
  const HostMemory m = ReadHostMemory(proc(), cgroup());
  ASSERT_TRUE(m.cgroup.has_value());
  EXPECT_EQ(m.cgroup->path, "/");
  EXPECT_EQ(m.headroom(), 500 * kMiB);
}

TEST_F(HostMemoryTest, WithoutALimitTheMachinesAvailableMemory) {
  Available(3 * 1024 * kMiB);
  Write("proc/self/cgroup", "0::/user.slice\n");
  Write("cgroup/user.slice/memory.max", "max\n");
  const HostMemory m = ReadHostMemory(proc(), cgroup());
  EXPECT_FALSE(m.cgroup.has_value());
  EXPECT_EQ(m.headroom(), 3 * 1024 * kMiB);
  EXPECT_EQ(m.capacity(), m.physical);
  EXPECT_NE(m.DescribeCapacity().find("this machine's"), std::string::npos) << m.DescribeCapacity();
  EXPECT_NE(m.Describe().find("the 3.00 GiB available of this machine's"), std::string::npos)
      << m.Describe();
}

TEST_F(HostMemoryTest, ALimitAboveWhatTheMachineHasLeftIsNotTheBound) {
  Available(1024 * kMiB);
  Write("proc/self/cgroup", "0::/job\n");
  Write("cgroup/job/memory.max", std::to_string(2048 * kMiB) + "\n");
  Write("cgroup/job/memory.current", "0\n");
  const HostMemory m = ReadHostMemory(proc(), cgroup());
  EXPECT_EQ(m.headroom(), 1024 * kMiB);
  EXPECT_NE(m.Describe().find("available of this machine's"), std::string::npos) << m.Describe();
}

TEST_F(HostMemoryTest, OomKillCountIsVmstatsOomKill) {
  EXPECT_EQ(OomKillCount(proc()), -1) << "no vmstat: unknown";
  Write("proc/vmstat", "nr_free_pages 12\noom_kill_total 9\noom_kill 7\nworkingset 3\n");
  EXPECT_EQ(OomKillCount(proc()), 7);
}

TEST_F(HostMemoryTest, UnreadableFilesLeaveTheFieldsUnknown) {
  const HostMemory m = ReadHostMemory(proc(), cgroup());
  EXPECT_EQ(m.available, 0u);
  EXPECT_FALSE(m.cgroup.has_value());
  EXPECT_EQ(m.headroom(), m.physical > 0 ? m.physical : SIZE_MAX);
}

// This machine's own files: whatever its limits, what may be allocated is at most what it has.
TEST(HostMemoryOfThisMachineTest, HeadroomIsAtMostThePhysicalMemory) {
  const HostMemory m = ReadHostMemory();
  ASSERT_GT(m.physical, 0u);
  EXPECT_GT(m.available, 0u);
  EXPECT_LE(m.headroom(), m.physical);
}

TEST(HostMemoryOfThisMachineTest, ABufferBeyondTheHeadroomIsRefused) {
  const size_t room = ReadHostMemory().headroom();
  EXPECT_THROW(Buffer<char>(room + (size_t(1) << 30)), std::bad_alloc);
  EXPECT_EQ(Buffer<char>(Buffer<char>::kCheckedBytes).size(), Buffer<char>::kCheckedBytes);
}

}  // namespace
}  // namespace difftrain
