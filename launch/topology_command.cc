// `difftrain topology`: prints the rank groups of a tp/cp/dp/pp layout as JSON, so a user can
// see which ranks share a communicator before launching a job (docs/parallelism.md).
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/topology.h"
#include "launch/command.h"

namespace difftrain::launch {
namespace {

struct TopologyOptions {
  int tp = 1;
  int cp = 1;
  int dp = 1;
  int pp = 1;
  std::string order{kDefaultParallelOrder};
  std::vector<std::string> groups{kParallelGroupTokens.begin(), kParallelGroupTokens.end()};
};

// Keys stay in the order asked; a token asked twice is printed once.
Result<nlohmann::ordered_json> GroupsJson(const Topology& topology,
                                          const std::vector<std::string>& tokens) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (const std::string& token : tokens) {
    DT_ASSIGN_OR_RETURN(RankGroups groups, topology.GetRanks(token));
    json[token] = std::move(groups);
  }
  return json;
}

// One group per line: nlohmann's pretty form puts every rank on a line of its own, which
// buries the grouping a reader is looking for.
std::string FormatGroups(const nlohmann::ordered_json& json) {
  std::string out = "{";
  const char* token_separator = "\n";
  for (const auto& [token, groups] : json.items()) {
    out += fmt::format("{}  {}: [", token_separator, nlohmann::json(token).dump());
    const char* group_separator = "\n";
    for (const nlohmann::ordered_json& group : groups) {
      out += fmt::format("{}    {}", group_separator, group.dump());
      group_separator = ",\n";
    }
    out += "\n  ]";
    token_separator = ",\n";
  }
  return out + "\n}\n";
}

int RunTopology(const TopologyOptions& options) {
  Result<Topology> topology =
      Topology::Create(options.tp, options.cp, options.dp, options.pp, options.order);
  if (!topology.ok()) return ReportBadInput("topology", topology.status().message());
  Result<nlohmann::ordered_json> json = GroupsJson(*topology, options.groups);
  if (!json.ok()) return ReportBadInput("topology", json.status().message());
  std::cout << FormatGroups(*json);
  return kExitOk;
}

std::function<int()> SetupTopology(CLI::App& app) {
  auto options = std::make_shared<TopologyOptions>();
  app.add_option("--tp", options->tp, "tensor parallel size")->capture_default_str();
  app.add_option("--cp", options->cp, "context parallel size")->capture_default_str();
  app.add_option("--dp", options->dp, "data parallel size")->capture_default_str();
  app.add_option("--pp", options->pp, "pipeline parallel size")->capture_default_str();
  app.add_option("--order", options->order,
                 "the four axes joined by '-', the first varying fastest across global ranks "
                 "(Megatron-Core's order)")
      ->capture_default_str();
  app.add_option("--groups", options->groups,
                 "comma-separated group tokens: an axis or '-'-joined axes, e.g. tp,dp-cp")
      ->delimiter(',')
      ->capture_default_str();
  app.footer(
      "Prints a JSON object: each group token maps to its groups, each a list of global ranks.\n"
      "Example: difftrain topology --tp 2 --cp 2 --dp 2 --pp 2 --groups tp,dp-cp");
  return [options] { return RunTopology(*options); };
}

DIFFTRAIN_COMMAND(kTopologyCommand,
                  {"topology", "print the rank groups of a tp/cp/dp/pp layout as JSON",
                   SetupTopology});

}  // namespace
}  // namespace difftrain::launch
