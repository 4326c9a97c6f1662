// The Linear layers' GEMMs through cuBLASLt: bf16 inputs, fp32 accumulation, PyTorch's
// layout (weight [O, I] row-major, out = in · weightᵀ + bias), with the bias and GELU
// (tanh) applied in the GEMM's epilogue where cuBLASLt fuses them.
//
// One Gemm per stream: it owns the cuBLASLt handle, a workspace, and the matmul plans
// (descriptors and the chosen algorithm) of every shape it has seen, so that after the
// first step no call allocates or queries a heuristic (a CUDA graph can capture it).
#pragma once

#include <cublasLt.h>

#include <map>
#include <memory>
#include <tuple>

#include "model/cuda/common.h"
#include "model/cuda/device_buffer.h"

namespace difftrain::cuda {

enum class Epilogue {
  kNone,      // out = in · wᵀ
  kBias,      // out = in · wᵀ + bias
  kBiasGelu,  // pre = in · wᵀ + bias (written to `aux`), out = gelu_tanh(pre)
};

// What autotuning found, summed over a Gemm's plans (Gemm::Tuning): for the plans it timed, the
// milliseconds their calls so far would take with cuBLASLt's first choice and with the fastest
// candidate (a plan's time × its calls: right after a model's first step, one step's).
struct GemmTuning {
  int plans = 0, tuned = 0, changed = 0;  // plans; of them timed; of those not on the first choice
  double heuristic_ms = 0, tuned_ms = 0;
};

// An FP8 operand (model/cuda/fp8.h): E4M3 or E5M2 bytes, and the device scalar their product
// is multiplied by (their tensor's scale_inv).
struct Fp8Operand {
  const uint8_t* data;
  const float* scale_inv;
};

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream, size_t workspace_bytes = size_t(32) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  cudaStream_t stream() const { return stream_; }

  // Autotuning (on by default): a plan asks cuBLASLt's heuristic for up to kCandidates
  // algorithms, and on its first call that writes its output whole (β = 0: every forward and
  // input gradient, and weight gradients that do not accumulate) outside a CUDA graph capture,
  // times each on the call's own operands (a warm-up, then kTuneReps runs between CUDA events)
  // and keeps the fastest; the call then runs with it. Any algorithm the heuristic offers
  // computes the same product, so this changes speed, not results beyond the accumulation
  // order. Off: the heuristic's first choice, as before; DIFFTRAIN_GEMM_AUTOTUNE=0 in the
  // environment turns it off in every Gemm made after (set_autotune(true) turns it back on).
  static constexpr int kCandidates = 8;
  static constexpr int kTuneReps = 3;
  void set_autotune(bool on) { autotune_ = on; }
  GemmTuning Tuning() const;

  // out[N, O] = epilogue(in[N, I] · w[O, I]ᵀ): bf16 out, or fp32 out (used where the result
  // feeds fp32 state: the adaLN modulation vectors, the final layer's output). bias [O] is
  // bf16; aux [N, O] (bf16) receives the pre-activation with kBiasGelu and is otherwise
  // unused (null).
  void Forward(bf16* out, const bf16* in, const bf16* w, const bf16* bias, int N, int I, int O,
               Epilogue epilogue, bf16* aux = nullptr);
  void Forward(float* out, const bf16* in, const bf16* w, const bf16* bias, int N, int I, int O,
               Epilogue epilogue);

  // dw[O, I] += dout[N, O]ᵀ · in[N, I] in fp32 (the gradient arena accumulates micro-batches);
  // with accumulate false, dw = … (β = 0: dw is neither read nor need be initialised).
  void BackwardWeight(float* dw, const bf16* dout, const bf16* in, int N, int I, int O,
                      bool accumulate = true);
  // BackwardWeight, and dbias[O] += the column sums of dout (the layer's bias gradient): in the
  // GEMM's epilogue (cuBLASLt's BGRADB, which reduces dout over the product's k = N and stores
  // the sums, into `scratch` [O] fp32, then added to dbias) where cuBLASLt has an algorithm for
  // it, else as BackwardWeight followed by BiasGradient (model/cuda/activation.h). On an H100
  // cuBLASLt ran the epilogue as a reduction kernel of its own after the product
  // (globalKernelBgradAB_v2, reading dout again), about as fast as BiasGradient: it saves a
  // launch, not the read (docs/benchmarks.md).
  // accumulate: dw's, as in BackwardWeight; the bias gradient is always added.
  void BackwardWeightAndBias(float* dw, float* dbias, const bf16* dout, const bf16* in, int N,
                             int I, int O, float* scratch, bool accumulate = true);
  // Whether BackwardWeightAndBias at this shape uses the epilogue (asks cuBLASLt once).
  bool FusesBiasGradient(int N, int I, int O);

  // din[N, I] = dout[N, O] · w[O, I]   (written, not added).
  // With gelu_pre non-null (the aux of a kBiasGelu forward, [N, I]) the result is multiplied
  // by gelu_tanh'(gelu_pre) in the epilogue: the gradient of fc1's pre-activation straight
  // from fc2's output gradient.
  void BackwardInput(bf16* din, const bf16* dout, const bf16* w, int N, int I, int O,
                     const bf16* gelu_pre = nullptr);
  // BackwardInput with gelu_pre, and dbias[I] += the column sums of din (the gradient of the
  // GELU input: fc1's bias gradient): in the same GEMM's epilogue (cuBLASLt's DGELU_BGRAD, which
  // reduces the epilogue's fp32 result over the product's n = N and stores the sums into
  // `scratch` [I] fp32, then added to dbias) where cuBLASLt has an algorithm for it, else as
  // BackwardInput followed by BiasGradient over din. Unlike BGRADB the reduction runs on values
  // the epilogue already holds, so no second read of a matrix is needed.
  void BackwardInputGeluAndBias(bf16* din, float* dbias, const bf16* dout, const bf16* w, int N,
                                int I, int O, const bf16* gelu_pre, float* scratch);
  // Whether BackwardInputGeluAndBias at this shape uses the epilogue (asks cuBLASLt once).
  bool FusesGeluBiasGradient(int N, int I, int O);

  // FP8 products (compute capability ≥ 8.9; model/cuda/fp8.h says how a model gets its
  // operands): fp32 accumulation, each output multiplied by its two operands' scale_inv,
  // cuBLASLt's required "TN" layout — so the backward's operands come transposed. N, I and O
  // must be multiples of 16 (16-byte FP8 rows). Each returns false, and computes nothing, where
  // cuBLASLt has no algorithm for it (the caller runs the bf16 product instead).
  // Forward: out[N, O] = epilogue(in[N, I] · w[O, I]ᵀ), both E4M3, with cuBLASLt's fast
  // accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM), as Transformer Engine's forward.
  bool ForwardFp8(bf16* out, Fp8Operand in, Fp8Operand w, const bf16* bias, int N, int I, int O,
                  Epilogue epilogue, bf16* aux = nullptr);
  // Input gradient: din[N, I] = dout[N, O] · w[O, I] from dout (E5M2) and w_t [I, O] (E4M3, w
  // transposed); times gelu'(gelu_pre) where gelu_pre is given (DGELU), and with dbias (which
  // needs gelu_pre) dbias[I] += din's column sums — in the epilogue (DGELU_BGRAD, through
  // scratch [I]) where cuBLASLt has it, else BiasGradient over din.
  bool BackwardInputFp8(bf16* din, Fp8Operand dout, Fp8Operand w_t, int N, int I, int O,
                        const bf16* gelu_pre = nullptr, float* dbias = nullptr,
                        float* scratch = nullptr);
  // Weight gradient: dw[O, I] (+)= dout[N, O]ᵀ · in[N, I] from dout_t [O, N] (E5M2) and in_t
  // [I, N] (E4M3), both transposed; accumulate as BackwardWeight's.
  bool BackwardWeightFp8(float* dw, Fp8Operand dout_t, Fp8Operand in_t, int N, int I, int O,
                         bool accumulate = true);

  // `batch` row-major products side by side, for attention's per-head matrices: for each item
  // i, c_i[m, n] = alpha · op(a_i)[m, k] · op(b_i)[k, n] (written, not added), where the items
  // follow one another densely (a_i = a + i·m·k, b_i = b + i·k·n, c_i = c + i·m·n) and op(x)
  // is x, or xᵀ with trans (then x_i is stored [k, m] for a, [n, k] for b). m, n and k must be
  // multiples of 8 (16-byte rows, fp32 c too).
  void Batched(bf16* c, const bf16* a, bool trans_a, const bf16* b, bool trans_b, int m, int n,
               int k, int batch, float alpha = 1.0f);
  void Batched(float* c, const bf16* a, bool trans_a, const bf16* b, bool trans_b, int m, int n,
               int k, int batch, float alpha = 1.0f);

 private:
  struct Plan;
  // (kind, out type, N, I, O, epilogue, batch) → a plan made on first use. Batched products
  // keep (m, n, k) in (N, I, O) and their transposes in the kind.
  using Key = std::tuple<int, int, int, int, int, int, int>;
  void RunBatched(void* c, int out_type, const bf16* a, bool trans_a, const bf16* b, bool trans_b,
                  int m, int n, int k, int batch, float alpha);
  Plan& PlanFor(const Key& key);
  // The plan of a key, or null (remembered) when cuBLASLt has no algorithm for it.
  Plan* TryPlanFor(const Key& key);
  Plan* MakePlan(const Key& key, bool required);
  // cublasLtMatmul of a plan (its descriptor's epilogue pointers already set): D = C = d,
  // cuBLASLt's A = a and B = b; autotuned first where the plan is due (Tune).
  void Run(Plan& plan, const void* a, const void* b, float alpha, float beta, void* d);
  // An FP8 plan's call: A's and B's scale pointers set, then TryRun; false where it fails.
  bool RunFp8(Plan& plan, Fp8Operand a, Fp8Operand b, float beta, void* d);
  // Run, returning cuBLASLt's status instead of failing on an error (an epilogue the heuristic
  // offered but the matmul refuses: its caller falls back).
  cublasStatus_t TryRun(Plan& plan, const void* a, const void* b, float alpha, float beta, void* d);
  void Tune(Plan& plan, const void* a, const void* b, float alpha, void* d);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  bool autotune_ = true;
};

}  // namespace difftrain::cuda
