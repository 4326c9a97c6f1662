// Runs the built `difftrain topology` the way a user does.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/testing/run_command.h"

namespace {

using difftrain::testing::CommandResult;
using difftrain::testing::RunDifftrain;

TEST(TopologyCommandTest, PrintsTheExampleGroups) {
  const CommandResult result = RunDifftrain("topology --tp 2 --cp 2 --dp 2 --pp 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::ordered_json groups = nlohmann::ordered_json::parse(result.output);
  std::vector<std::string> keys;
  for (const auto& [key, value] : groups.items())
    keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-pp"}));
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(groups["tp"].get<Groups>(),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(groups["dp"].get<Groups>(),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(groups["dp-cp"].get<Groups>(),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
}

TEST(TopologyCommandTest, KeepsTheOrderOfRequestedGroups) {
  const CommandResult result =
      RunDifftrain("topology --tp 2 --dp 2 --order pp-dp-cp-tp --groups tp-pp,tp");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(nlohmann::ordered_json::parse(result.output).dump(),
            R"({"tp-pp":[[0,2],[1,3]],"tp":[[0,2],[1,3]]})");
}

TEST(TopologyCommandTest, BadSizeExitsTwoAndNamesTheFlag) {
  const CommandResult result = RunDifftrain("topology --tp 2 --cp 0 --dp 2 --pp 2");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(result.output, "difftrain topology: --cp must be >= 1, got 0\n");
}

TEST(TopologyCommandTest, BadOrderAndTokenExitTwo) {
  const CommandResult order = RunDifftrain("topology --order tp-dp-pp");
  EXPECT_EQ(order.exit_code, 2);
  EXPECT_NE(order.output.find("order 'tp-dp-pp' must name each of tp, cp, dp, pp exactly once"),
            std::string::npos);
  const CommandResult token = RunDifftrain("topology --groups tp,ep");
  EXPECT_EQ(token.exit_code, 2);
  EXPECT_NE(token.output.find("group token 'ep'"), std::string::npos) << token.output;
}

TEST(TopologyCommandTest, HelpDescribesTheOptions) {
  const CommandResult result = RunDifftrain("topology --help");
  EXPECT_EQ(result.exit_code, 0);
  for (const char* option : {"--tp", "--cp", "--dp", "--pp", "--order", "--groups"}) {
    EXPECT_NE(result.output.find(option), std::string::npos) << option;
  }
}

}  // namespace
