#include "model/train/peak_flops.h"

#include <gtest/gtest.h>

namespace difftrain {
namespace {

TEST(PeakFlopsTest, GpuTableByDeviceName) {
  EXPECT_EQ(GpuPeakFlops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(GpuPeakFlops("NVIDIA H200"), 989e12);
  EXPECT_EQ(GpuPeakFlops("NVIDIA H20"), 148e12);
  EXPECT_EQ(GpuPeakFlops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(GpuPeakFlops("NVIDIA GeForce RTX 4090"), 0);
}

TEST(PeakFlopsTest, SgemmPeakIsMeasured) {
  const PeakFlops peak = MeasureSgemmPeak(256, 3);
  EXPECT_GT(peak.flops_per_second, 1e8);
  EXPECT_NE(peak.source.find("sgemm 256^3"), std::string::npos) << peak.source;
}

}  // namespace
}  // namespace difftrain
