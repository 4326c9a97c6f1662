#include "model/latte/family.h"

#include "model/dit/family.h"

namespace difftrain {

const ModelFamily& LatteFamily() {
  // No GPU step yet: train.device cuda refuses a Latte job by name.
  static const std::unique_ptr<ModelFamily> family =
      MakeTransformerFamily({"latte", "Latte", "latte", "Latte-S/2", /*video=*/true, nullptr});
  return *family;
}

}  // namespace difftrain
