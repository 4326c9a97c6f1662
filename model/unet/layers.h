// The UNet's layers on the CPU (model/unet/unet.h): one class per node kind of the plan
// (model/unet/plan.h), each with forward and backward side by side. A layer is built for one
// micro-batch size: it takes the offsets of what it keeps for backward from the slot's space
// (with activation recomputation, from a workspace that all layers share and whose contents
// backward makes again) and of its temporaries from the scratch space, which all layers share.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "model/family/model.h"
#include "model/unet/config.h"
#include "model/unet/plan.h"

namespace difftrain {

// Hands out consecutive ranges of an arena, as offsets in floats.
struct Space {
  size_t used = 0;
  size_t Take(size_t n) {
    const size_t offset = used;
    used += n;
    return offset;
  }
};

// Where one micro-batch's tensors are while a layer runs.
struct UNetRun {
  int B = 0;
  float* P = nullptr;                                  // parameters
  float* G = nullptr;                                  // their gradients (`+=`)
  float* acts = nullptr;                               // the micro-batch's slot (its values)
  float* work = nullptr;                               // the layers' activations
  float* scratch = nullptr;                            // the layers' temporaries
  const std::vector<size_t>* value_offsets = nullptr;  // in acts
  const std::vector<size_t>* grad_offsets = nullptr;   // in scratch (value 0 has none)
  const float* context = nullptr;                      // [B, L, D_text]
  float* dcontext = nullptr;         // its gradient (`+=`; textual inversion), or null: none
  const float* temb_silu = nullptr;  // SiLU(time embedding) [B, E]
  float* dtemb_silu = nullptr;       // its gradient (`+=`)
  // Forward again inside backward (activation recomputation): only what the layer's backward
  // reads, not its output value, which is already there.
  bool recomputing = false;
  // The parameters whose gradients are not wanted (Model::SkipGradients); null: none.
  const GradientSkips* skipped = nullptr;

  // Where the gradient of the parameters [offset, offset + n) goes (a layer's weight, or one
  // fused matrix of several, as q, k and v); null when all of them are skipped.
  float* Grad(size_t offset, size_t n) const {
    return skipped != nullptr && skipped->Skips(offset, n) ? nullptr : G + offset;
  }
  float* value(int id) const { return acts + (*value_offsets)[id]; }
  float* grad(int id) const { return id == 0 ? nullptr : scratch + (*grad_offsets)[id]; }
  float* A(size_t offset) const { return work + offset; }
  float* S(size_t offset) const { return scratch + offset; }
};

class UNetLayer {
 public:
  virtual ~UNetLayer() = default;
  // With r.recomputing, stops once what Backward reads is made.
  virtual void Forward(const UNetRun& r) = 0;
  // Adds into the gradients of the layer's inputs and parameters.
  virtual void Backward(const UNetRun& r) = 0;
  // The offset of the layer's first parameter: the layers' parameters follow one another.
  size_t first_param = 0;
};

// The layer of `node` for micro-batches of B, its activations taken from `acts` (the slot's
// space, or with recomputation the workspace's) and its temporaries from `scratch` (which
// starts at the layers' shared scratch).
std::unique_ptr<UNetLayer> MakeUNetLayer(const UNetConfig& c, const UNetPlan& plan,
                                         const UNetNode& node, int B, Space& acts, Space& scratch);

}  // namespace difftrain
