// Rendering the Helm chart (k8s/difftrain) in tests, without Helm: tests/k8s/prepare.sh
// builds tests/k8s/render (Go's text/template + sprig, Helm's engine) and RenderChart runs
// it like `helm template`, returning the manifests as parsed YAML documents.
#pragma once

#include <sys/file.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "tests/testing/run_command.h"

namespace difftrain::k8s {

inline const std::filesystem::path kSourceDir = DIFFTRAIN_SOURCE_DIR;
inline const std::filesystem::path kChartDir = kSourceDir / "k8s/difftrain";
inline const std::filesystem::path kValuesDir = kSourceDir / "tests/k8s/values";
// Next to the difftrain binary, so each build directory has its own renderer.
inline const std::filesystem::path kToolsDir =
    std::filesystem::path(DIFFTRAIN_BINARY).parent_path() / "k8s-tools";

// Builds the renderer once per test process (installing Go through install-deps.sh where
// it is missing); test processes running at once take turns through a lock file.
// Returns the prepare script's output on failure, "" on success.
inline std::string PrepareTools() {
  static const std::string error = [] {
    std::filesystem::create_directories(kToolsDir);
    const testing::CommandResult result =
        testing::RunCommand("flock " + testing::ShellQuote((kToolsDir / "lock").string()) + " " +
                            testing::ShellQuote((kSourceDir / "tests/k8s/prepare.sh").string()) +
                            " " + testing::ShellQuote(kToolsDir.string()));
    return result.exit_code == 0 ? std::string() : "prepare.sh failed:\n" + result.output;
  }();
  return error;
}

struct Rendered {
  int exit_code = -1;
  std::string text;  // the manifests, or the renderer's error
  std::vector<YAML::Node> objects;

  // The object of `kind` named `name`; a null node when there is none.
  YAML::Node Find(const std::string& kind, const std::string& name) const {
    for (const YAML::Node& o : objects) {
      if (o["kind"].as<std::string>() == kind && o["metadata"]["name"].as<std::string>() == name) {
        return o;
      }
    }
    return YAML::Node(YAML::NodeType::Undefined);
  }
  int Count(const std::string& kind) const {
    int n = 0;
    for (const YAML::Node& o : objects)
      n += o["kind"].as<std::string>() == kind;
    return n;
  }
};

// Renders `chart` with release `release` and the given helm-render arguments (-f FILE,
// --set K=V, --set-file K=PATH). Values files are named relative to tests/k8s/values.
inline Rendered RenderChart(const std::vector<std::string>& args,
                            const std::string& release = "dit",
                            const std::filesystem::path& chart = kChartDir) {
  Rendered rendered;
  if (std::string error = PrepareTools(); !error.empty()) {
    rendered.text = error;
    return rendered;
  }
  std::string command = testing::ShellQuote((kToolsDir / "helm-render").string()) + " --release " +
                        testing::ShellQuote(release);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (i > 0 && args[i - 1] == "-f" && arg.find('/') == std::string::npos) {
      arg = (kValuesDir / arg).string();
    }
    command += " " + testing::ShellQuote(arg);
  }
  // stderr is merged: on success the renderer prints nothing there.
  const testing::CommandResult result =
      testing::RunCommand(command + " " + testing::ShellQuote(chart.string()));
  rendered.exit_code = result.exit_code;
  rendered.text = result.output;
  if (result.exit_code == 0) {
    for (const YAML::Node& doc : YAML::LoadAll(result.output)) {
      if (doc.IsMap()) rendered.objects.push_back(doc);
    }
  }
  return rendered;
}

// The container named `name` of a Job's pod template (init containers included).
inline YAML::Node Container(const YAML::Node& job, const std::string& name, bool init = false) {
  for (const YAML::Node& c :
       job["spec"]["template"]["spec"][init ? "initContainers" : "containers"]) {
    if (c["name"].as<std::string>() == name) return c;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

inline std::vector<std::string> Strings(const YAML::Node& list) {
  std::vector<std::string> out;
  for (const YAML::Node& item : list)
    out.push_back(item.as<std::string>());
  return out;
}

// The named entry of a list of {name: ...} maps (env, volumes, volumeMounts, ports).
inline YAML::Node Named(const YAML::Node& list, const std::string& name) {
  for (const YAML::Node& item : list) {
    if (item["name"] && item["name"].as<std::string>() == name) return item;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

}  // namespace difftrain::k8s
