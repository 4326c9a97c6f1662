// Reading a YAML mapping into typed fields with errors a user can act on.
//
// Every error names the file, the dotted field path, what was expected and what was found,
// with the line and column: "job.yaml:12:9: optimizer.lr: expected a number, found 'fast'".
// Keys the reader was never asked about are reported as unknown by Finish(), so a typo
// never silently falls back to a default.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/status.h"

namespace difftrain {

class YamlFields {
 public:
  // `node` must be a mapping (or null: an absent section); `path` is its dotted name.
  YamlFields(const std::string& file, const YAML::Node& node, std::string path);

  // Each reader leaves `out` unchanged when the key is absent. The first error is kept.
  YamlFields& Int(const std::string& key, int& out);
  YamlFields& Int64(const std::string& key, int64_t& out);
  YamlFields& Double(const std::string& key, double& out);
  YamlFields& Bool(const std::string& key, bool& out);
  YamlFields& String(const std::string& key, std::string& out);
  YamlFields& IntList(const std::string& key, std::vector<int>& out);
  YamlFields& StringList(const std::string& key, std::vector<std::string>& out);
  // A nested mapping; absent gives a null node that reads as "all defaults".
  YamlFields Section(const std::string& key);
  bool Has(const std::string& key) const;
  // The whole mapping, every key counted as read: for a section whose keys its reader checks
  // its own way (a UNet's diffusers config, model/unet/family.cc).
  const YAML::Node& TakeAll();

  // The first error of this reader, or an error naming every key nobody read.
  Status Finish() const;
  Status status() const { return status_; }
  // An error located at `key` (or at this mapping when the key is absent).
  Status ErrorAt(const std::string& key, const std::string& message) const;
  // "file:line:col" of `key` (of this mapping when the key is absent).
  std::string Location(const std::string& key) const;

  // The YAML document in `file`, or in `text` (whose errors name `file` as its source).
  static Result<YAML::Node> LoadFile(const std::string& file);
  static Result<YAML::Node> LoadText(const std::string& text, const std::string& file);
  // The whole text of `file`.
  static Result<std::string> ReadFile(const std::string& file);

 private:
  template <typename T>
  YamlFields& Read(const std::string& key, T& out, const char* expected);
  std::string Where(const YAML::Node& node) const;
  std::string FieldPath(const std::string& key) const;

  std::string file_;
  YAML::Node node_;
  std::string path_;
  std::set<std::string> read_;
  Status status_;
};

}  // namespace difftrain
