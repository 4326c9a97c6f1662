#include "common/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/gauge.h>

#include "tests/testing/http.h"

namespace difftrain {
namespace {

TEST(MetricsEndpointTest, ServesTheRegistryAtMetricsOnly) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Gauge& gauge =
      prometheus::BuildGauge().Name("difftrain_test").Help("a test").Register(*registry).Add({});
  const int port = testing::FreePort();
  Result<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(port, registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().message();
  EXPECT_EQ((*endpoint)->port(), port);
  gauge.Set(7);
  Result<std::string> body = testing::HttpGet(port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status().message();
  EXPECT_NE(body->find("difftrain_test 7"), std::string::npos) << *body;
  Result<std::string> other = testing::HttpGet(port, "/");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("404"), std::string::npos) << other.status().message();
  // A second endpoint cannot take the port.
  Result<std::unique_ptr<MetricsEndpoint>> taken = MetricsEndpoint::Start(port, registry);
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.status().message().find("serving metrics on port"), std::string::npos);
  endpoint->reset();
  EXPECT_FALSE(testing::HttpGet(port, "/metrics").ok());
}

TEST(MetricsEndpointTest, RefusesPortsOutsideTheRange) {
  auto registry = std::make_shared<prometheus::Registry>();
  EXPECT_FALSE(MetricsEndpoint::Start(0, registry).ok());
  EXPECT_FALSE(MetricsEndpoint::Start(65536, registry).ok());
}

}  // namespace
}  // namespace difftrain
