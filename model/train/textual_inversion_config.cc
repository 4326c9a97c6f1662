#include "model/train/textual_inversion_config.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace difftrain {

Status TextualInversionConfig::Validate() const {
  if (!enabled()) return Status::Ok();
  if (std::any_of(token.begin(), token.end(), [](unsigned char c) { return std::isspace(c); })) {
    return Errorf(
        "textual_inversion.token: '{}' holds white space; a token is one word, such as "
        "<cat-toy>",
        token);
  }
  if (initializer_token.empty()) {
    return Status::Error(
        "textual_inversion.initializer_token: required (a word the tokenizer makes one token of, "
        "whose embedding the new vectors start from, e.g. toy)");
  }
  if (vectors < 1) {
    return Errorf("textual_inversion.vectors: expected a count >= 1, found {}", vectors);
  }
  for (size_t i = 0; i < templates.size(); ++i) {
    const std::string& t = templates[i];
    const size_t at = t.find("{}");
    if (at == std::string::npos || t.find("{}", at + 2) != std::string::npos) {
      return Errorf(
          "textual_inversion.templates[{}]: '{}' should hold \"{{}}\" once, where the token goes",
          i, t);
    }
  }
  return Status::Ok();
}

nlohmann::json TextualInversionConfig::ToJson() const {
  return {{"token", token},
          {"initializer_token", initializer_token},
          {"vectors", vectors},
          {"text_encoder", text_encoder},
          {"templates", templates}};
}

}  // namespace difftrain
