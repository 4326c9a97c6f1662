// DeviceBuffer::TryAllocate turns the runtime's refusal into an error instead of stopping the
// process. Both refusals are real here: on a machine without a GPU every allocation is
// refused; on one with a GPU, a request larger than any GPU's memory is.
#include "model/cuda/device_buffer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/cuda/testing.h"

namespace difftrain::cuda {
namespace {

using ::testing::HasSubstr;

TEST(DeviceBufferTest, TryAllocateReportsARefusal) {
  const bool has_gpu = testing::NoGpuReason().empty();
  const size_t n = has_gpu ? size_t{1} << 50 : 1;  // 4 PiB of floats, or any request at all
  Result<DeviceBuffer<float>> refused = DeviceBuffer<float>::TryAllocate(n);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("allocating "));
  if (!has_gpu) return;
  EXPECT_THAT(refused.status().message(), HasSubstr("out of memory"));
  // The refusal is not sticky: the next allocation and launch work.
  Result<DeviceBuffer<float>> small = DeviceBuffer<float>::TryAllocate(1024);
  ASSERT_TRUE(small.ok()) << small.status().message();
  EXPECT_EQ(small->size(), 1024u);
  EXPECT_NE(small->data(), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(DeviceBufferTest, NothingAllocatesNothing) {
  Result<DeviceBuffer<float>> empty = DeviceBuffer<float>::TryAllocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->bytes(), 0u);
}

}  // namespace
}  // namespace difftrain::cuda
