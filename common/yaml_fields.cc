#include "common/yaml_fields.h"

#include <fstream>
#include <sstream>

namespace difftrain {

YamlFields::YamlFields(const std::string& file, const YAML::Node& node, std::string path)
    : file_(file), node_(node), path_(std::move(path)) {
  if (node_ && !node_.IsNull() && !node_.IsMap()) {
    status_ = Errorf("{}: {}: expected a mapping of fields", Where(node_), path_);
  }
}

std::string YamlFields::Where(const YAML::Node& node) const {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return file_;
  return fmt::format("{}:{}:{}", file_, mark.line + 1, mark.column + 1);
}

std::string YamlFields::FieldPath(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

const YAML::Node& YamlFields::TakeAll() {
  if (node_.IsMap()) {
    for (const auto& kv : node_)
      read_.insert(kv.first.as<std::string>());
  }
  return node_;
}

bool YamlFields::Has(const std::string& key) const {
  return node_ && node_.IsMap() && node_[key];
}

Status YamlFields::ErrorAt(const std::string& key, const std::string& message) const {
  const YAML::Node where = Has(key) ? node_[key] : node_;
  return Errorf("{}: {}: {}", Where(where), FieldPath(key), message);
}

std::string YamlFields::Location(const std::string& key) const {
  return Where(Has(key) ? node_[key] : node_);
}

template <typename T>
YamlFields& YamlFields::Read(const std::string& key, T& out, const char* expected) {
  read_.insert(key);
  if (!status_.ok() || !Has(key)) return *this;
  const YAML::Node value = node_[key];
  try {
    if (!value.IsScalar()) throw YAML::BadConversion(value.Mark());
    out = value.as<T>();
  } catch (const YAML::Exception&) {
    const std::string found = value.IsScalar()     ? "'" + value.Scalar() + "'"
                              : value.IsMap()      ? "a mapping"
                              : value.IsSequence() ? "a list"
                                                   : "nothing";
    status_ =
        Errorf("{}: {}: expected {}, found {}", Where(value), FieldPath(key), expected, found);
  }
  return *this;
}

YamlFields& YamlFields::Int(const std::string& key, int& out) {
  return Read(key, out, "an integer");
}
YamlFields& YamlFields::Int64(const std::string& key, int64_t& out) {
  return Read(key, out, "an integer");
}
YamlFields& YamlFields::Double(const std::string& key, double& out) {
  return Read(key, out, "a number");
}
YamlFields& YamlFields::Bool(const std::string& key, bool& out) {
  return Read(key, out, "true or false");
}
YamlFields& YamlFields::String(const std::string& key, std::string& out) {
  return Read(key, out, "a string");
}

YamlFields& YamlFields::IntList(const std::string& key, std::vector<int>& out) {
  read_.insert(key);
  if (!status_.ok() || !Has(key)) return *this;
  const YAML::Node value = node_[key];
  std::vector<int> list;
  try {
    if (!value.IsSequence()) throw YAML::BadConversion(value.Mark());
    for (const YAML::Node& item : value)
      list.push_back(item.as<int>());
  } catch (const YAML::Exception&) {
    status_ = Errorf("{}: {}: expected a list of integers", Where(value), FieldPath(key));
    return *this;
  }
  out = std::move(list);
  return *this;
}

YamlFields& YamlFields::StringList(const std::string& key, std::vector<std::string>& out) {
  read_.insert(key);
  if (!status_.ok() || !Has(key)) return *this;
  const YAML::Node value = node_[key];
  std::vector<std::string> list;
  bool scalars = value.IsSequence();
  for (size_t i = 0; scalars && i < value.size(); ++i) {
    scalars = value[i].IsScalar();
    if (scalars) list.push_back(value[i].Scalar());
  }
  if (!scalars) {
    status_ = Errorf("{}: {}: expected a list of names", Where(value), FieldPath(key));
    return *this;
  }
  out = std::move(list);
  return *this;
}

YamlFields YamlFields::Section(const std::string& key) {
  read_.insert(key);
  YAML::Node child = Has(key) ? node_[key] : YAML::Node();
  YamlFields section(file_, child, FieldPath(key));
  if (!status_.ok()) section.status_ = status_;
  return section;
}

Status YamlFields::Finish() const {
  DT_RETURN_IF_ERROR(status_);
  if (!node_ || !node_.IsMap()) return Status::Ok();
  for (const auto& entry : node_) {
    // A key that is a list, a mapping or empty ("? [a]: 1", "?\n:") names no field.
    if (!entry.first.IsScalar()) {
      return Errorf("{}: {}: expected a field name, found {}", Where(entry.first),
                    path_.empty() ? "(top level)" : path_,
                    entry.first.IsMap()        ? "a mapping"
                    : entry.first.IsSequence() ? "a list"
                                               : "nothing");
    }
    const std::string key = entry.first.Scalar();
    if (!read_.contains(key)) {
      std::string known;
      for (const std::string& k : read_)
        known += (known.empty() ? "" : ", ") + k;
      return Errorf("{}: {}: unknown field (known fields here: {})", Where(entry.first),
                    FieldPath(key), known);
    }
  }
  return Status::Ok();
}

Result<std::string> YamlFields::ReadFile(const std::string& file) {
  std::ifstream in(file);
  if (!in) return Errorf("cannot open '{}'", file);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Errorf("cannot read '{}'", file);
  return text.str();
}

Result<YAML::Node> YamlFields::LoadFile(const std::string& file) {
  DT_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
  return LoadText(text, file);
}

Result<YAML::Node> YamlFields::LoadText(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Errorf("{}:{}:{}: invalid YAML: {}", file, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

}  // namespace difftrain
