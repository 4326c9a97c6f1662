#include "common/cluster_config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace difftrain {
namespace {

Result<ClusterConfig> Read(const std::string& yaml) {
  YamlFields top("job.yaml", YAML::Load(yaml), "");
  ClusterConfig config;
  DT_RETURN_IF_ERROR(ReadClusterConfig(top, config));
  return config;
}

TEST(ClusterConfigTest, StopGraceAndHangSecondsHaveDefaults) {
  Result<ClusterConfig> c = Read("restart: {max_restarts: 1}\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->restart.stop_grace_seconds, 60);
  EXPECT_EQ(c->restart.hang_seconds, 0);  // automatic
}

TEST(ClusterConfigTest, ReadsStopGraceAndHangSeconds) {
  Result<ClusterConfig> c = Read("restart: {stop_grace_seconds: 5, hang_seconds: 30}\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->restart.stop_grace_seconds, 5);
  EXPECT_EQ(c->restart.hang_seconds, 30);
}

TEST(ClusterConfigTest, RefusesNegativeDeadlinesNamingTheField) {
  Result<ClusterConfig> grace = Read("restart: {stop_grace_seconds: -1}\n");
  ASSERT_FALSE(grace.ok());
  EXPECT_NE(grace.status().message().find("stop_grace_seconds"), std::string::npos)
      << grace.status().message();
  Result<ClusterConfig> hang = Read("restart: {hang_seconds: -3}\n");
  ASSERT_FALSE(hang.ok());
  EXPECT_NE(hang.status().message().find("hang_seconds"), std::string::npos)
      << hang.status().message();
}

}  // namespace
}  // namespace difftrain
