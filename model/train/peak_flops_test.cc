#include "model/train/peak_flops.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

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

// DIFFTRAIN_CPU_PEAK_GFLOPS as the test found it (ctest sets it), put back at the end.
class CpuPeakFlopsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv(kVariable)) saved_ = v;
  }
  void TearDown() override {
    if (saved_) {
      setenv(kVariable, saved_->c_str(), 1);
    } else {
      unsetenv(kVariable);
    }
  }
  static constexpr const char* kVariable = "DIFFTRAIN_CPU_PEAK_GFLOPS";
  std::optional<std::string> saved_;
};

TEST_F(CpuPeakFlopsTest, TheEnvironmentsFigureElseAMeasurement) {
  setenv(kVariable, "12.5", 1);
  Result<PeakFlops> peak = CpuPeakFlops();
  ASSERT_TRUE(peak.ok()) << peak.status().message();
  EXPECT_EQ(peak->flops_per_second, 12.5e9);
  EXPECT_EQ(peak->source, "DIFFTRAIN_CPU_PEAK_GFLOPS");
  for (const char* empty_or_unset : {"", static_cast<const char*>(nullptr)}) {
    if (empty_or_unset) {
      setenv(kVariable, empty_or_unset, 1);
    } else {
      unsetenv(kVariable);
    }
    peak = CpuPeakFlops();
    ASSERT_TRUE(peak.ok()) << peak.status().message();
    EXPECT_GT(peak->flops_per_second, 1e8);
    EXPECT_NE(peak->source.find("sgemm 1024^3"), std::string::npos) << peak->source;
  }
}

TEST_F(CpuPeakFlopsTest, AFigureThatIsNotAPositiveNumberIsRefusedByName) {
  for (const char* bad : {"0", "-3", "fast", "12x", "1e400", "nan"}) {
    setenv(kVariable, bad, 1);
    const Result<PeakFlops> peak = CpuPeakFlops();
    ASSERT_FALSE(peak.ok()) << bad;
    EXPECT_FALSE(CpuPeakFlopsGiven().ok()) << bad;
    EXPECT_EQ(peak.status().message(), std::string("DIFFTRAIN_CPU_PEAK_GFLOPS='") + bad +
                                           "': expected a positive number of GFLOP/s");
  }
}

}  // namespace
}  // namespace difftrain
