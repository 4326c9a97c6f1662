#include "model/latte/family.h"

#include "model/dit/family.h"

namespace difftrain {

const ModelFamily& LatteFamily() {
  static const std::unique_ptr<ModelFamily> family =
      MakeTransformerFamily({"latte", "Latte", "latte", "Latte-S/2", /*video=*/true});
  return *family;
}

}  // namespace difftrain
