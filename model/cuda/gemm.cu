#include "model/cuda/gemm.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/cuda/activation.h"

// A failing cuBLASLt call is a broken invariant (bad shape, unsupported combination) or a lost
// device: print file:line with cuBLASLt's reason and abort, like DT_CUDA_CHECK.
#ifndef DT_CUBLAS_CHECK
#define DT_CUBLAS_CHECK(expr)                                             \
  do {                                                                    \
    const cublasStatus_t dt_cublas_status_ = (expr);                      \
    DT_CHECK(dt_cublas_status_ == CUBLAS_STATUS_SUCCESS, "{}: {}", #expr, \
             Lt().cublasLtGetStatusString(dt_cublas_status_));            \
  } while (0)
#endif

namespace difftrain::cuda {
namespace {

// cuBLASLt is opened when the first Gemm is made instead of being linked: the library maps
// close to a gigabyte of address space, which a process that trains on the CPU (a
// memory-limited `difftrain bench` run among them) must not carry.
// clang-format off
#define DT_CUBLASLT_FUNCTIONS(X)          \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)
// clang-format on

struct CublasLt {
#define DT_CUBLASLT_POINTER(name) decltype(&::name) name = nullptr;
  DT_CUBLASLT_FUNCTIONS(DT_CUBLASLT_POINTER)
#undef DT_CUBLASLT_POINTER
};

const CublasLt& Lt() {
  static const CublasLt api = [] {
    const std::string library = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    DT_CHECK(handle != nullptr, "cannot load {}: {}", library, dlerror());
    CublasLt loaded;
#define DT_CUBLASLT_LOAD(name)                                             \
  loaded.name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name)); \
  DT_CHECK(loaded.name != nullptr, "{} has no {}", library, #name);
    DT_CUBLASLT_FUNCTIONS(DT_CUBLASLT_LOAD)
#undef DT_CUBLASLT_LOAD
    return loaded;
  }();
  return api;
}

// The GEMMs of a Linear layer (the first element of Gemm::Key).
enum Kind : int { kForward = 0, kBackwardWeight = 1, kBackwardInput = 2 };
// Batched row-major products: kBatched + 2·trans_a + trans_b.
constexpr int kBatched = 3;
// The FP8 products (Gemm::ForwardFp8 ...), after the batched kinds.
enum Fp8Kind : int { kForwardFp8 = 7, kBackwardWeightFp8 = 8, kBackwardInputFp8 = 9 };
// The type of D (the second element of Gemm::Key).
enum OutType : int { kOutBf16 = 0, kOutFloat = 1 };

// Every pointer and every leading dimension in bytes is a multiple of this. The heuristic is told
// so (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES; the default assumes 256-byte pointers), so
// that a plan chosen with one set of pointers stays valid for any other 16-byte aligned set:
// the step's buffers are slices of arenas, not fresh cudaMallocs.
constexpr uint32_t kAlignment = 16;
// bf16 elements per kAlignment bytes: the leading dimensions (I and O) must be multiples of it.
constexpr int kBf16PerAlignment = kAlignment / sizeof(bf16);

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kAlignment == 0;
}

// out[n, o] += bias[o] over a row-major [N, O] fp32 matrix: the bias of the fp32-output forward,
// which cuBLASLt's epilogue cannot take in bf16 (see Gemm::Forward(float*, ...)).
__global__ void AddBiasKernel(float* out, const bf16* __restrict__ bias, size_t n, int O) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] += __bfloat162float(bias[i % O]);
}

// dst[i] += src[i]: a bias gradient the epilogue stored, into the accumulating arena.
__global__ void BiasGradientAddKernel(float* dst, const float* __restrict__ src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

// dbias[0 … n) += the bias gradient an epilogue stored in scratch.
void AddBiasGradient(float* dbias, const float* scratch, int n, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  BiasGradientAddKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(dbias, scratch, n);
  DT_CUDA_CHECK_LAUNCH();
}

void CheckShape(int N, int I, int O) {
  DT_CHECK(N > 0 && I > 0 && O > 0, "GEMM shape N={} I={} O={} must be positive", N, I, O);
  // cuBLASLt's tensor-core kernels need 16-byte aligned rows (leading dimensions); every ld below
  // is I or O (N is never one), and the GELU aux ld must be a multiple of 8 besides.
  DT_CHECK(I % kBf16PerAlignment == 0 && O % kBf16PerAlignment == 0,
           "GEMM shape N={} I={} O={}: I and O (the leading dimensions of the row-major "
           "matrices) must be multiples of {} so that every row is {}-byte aligned",
           N, I, O, kBf16PerAlignment, kAlignment);
}

// An FP8 operand's rows are 16-byte aligned when every dimension that is a leading one is a
// multiple of 16 (N too: the transposed operands' rows are N long).
void CheckFp8Shape(int N, int I, int O) {
  DT_CHECK(N > 0 && I > 0 && O > 0, "GEMM shape N={} I={} O={} must be positive", N, I, O);
  DT_CHECK(N % 16 == 0 && I % 16 == 0 && O % 16 == 0,
           "FP8 GEMM shape N={} I={} O={}: each must be a multiple of 16 (16-byte FP8 rows)", N, I,
           O);
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
  // The heuristic's algorithms, best first (algo is one of them), and what tuning found.
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  bool tuned = false;
  int chosen = 0, calls = 0;
  float heuristic_ms = 0, best_ms = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Teardown: statuses are ignored, as DeviceBuffer ignores cudaFree's.
    if (d != nullptr) Lt().cublasLtMatrixLayoutDestroy(d);
    if (c != nullptr) Lt().cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) Lt().cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) Lt().cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) Lt().cublasLtMatmulDescDestroy(desc);
  }
};

Gemm::Gemm(cudaStream_t stream, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace_bytes) {
  DT_CUBLAS_CHECK(Lt().cublasLtCreate(&handle_));
  // The switch for a machine where autotuning misbehaves, without a rebuild (docs/cuda.md).
  const char* autotune = std::getenv("DIFFTRAIN_GEMM_AUTOTUNE");
  if (autotune != nullptr && std::string(autotune) == "0") autotune_ = false;
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_ != nullptr) Lt().cublasLtDestroy(handle_);
}

// Builds the plan of a key: everything below is derived from (kind, out type, N, I, O,
// cuBLASLt epilogue) alone, so a key always names the same descriptors and algorithm.
//
// Row-major ↔ column-major: a row-major [R, C] matrix with row stride C is, read by cuBLASLt, the
// column-major [C, R] matrix (its transpose) with ld = C. cuBLASLt computes
// D[m, n] = op(A)[m, k] · op(B)[k, n] (+ epilogue), all column-major. So each row-major product
// is computed transposed: Xᵀ = (P·Q)ᵀ = Qᵀ·Pᵀ, where Qᵀ, Pᵀ are the row-major buffers as they are.
Gemm::Plan& Gemm::PlanFor(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end() && it->second != nullptr) return *it->second;
  return *MakePlan(key, /*required=*/true);
}

Gemm::Plan* Gemm::TryPlanFor(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  return MakePlan(key, /*required=*/false);
}

Gemm::Plan* Gemm::MakePlan(const Key& key, bool required) {
  const auto [kind, out_type, N, I, O, epilogue_int, batch] = key;
  const auto epilogue = static_cast<cublasLtEpilogue_t>(epilogue_int);
  const cudaDataType_t d_type = out_type == kOutFloat ? CUDA_R_32F : CUDA_R_16BF;

  // Column-major description: op(A) is m×k, op(B) is k×n, D is m×n; A is stored a_rows×a_cols.
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF;
  uint64_t m = 0, n = 0, a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  switch (kind) {
    case kForwardFp8:
      // kForward's layout, already "TN": A = w (E4M3), B = in (E4M3).
      a_type = b_type = CUDA_R_8F_E4M3;
      [[fallthrough]];
    case kForward:
      // out[N, O] = in[N, I] · w[O, I]ᵀ  ⇔  (column-major) outᵀ[O, N] = w[O, I] · inᵀ[I, N].
      //   A = w buffer: column-major [I, O], ld I (= wᵀ), transa = T → op(A) = w, m = O, k = I.
      //   B = in buffer: column-major [I, N], ld I (= inᵀ), transb = N → k = I, n = N.
      //   C = D = out buffer: column-major [O, N], ld O (= outᵀ). Bias (length m = O) is added
      //   down each column: bias[o] to every out[·, o]. Aux has D's shape: [O, N], ld O.
      trans_a = CUBLAS_OP_T;
      a_rows = I, a_cols = O, lda = I;
      b_rows = I, b_cols = N, ldb = I;
      m = O, n = N, ldd = O;
      break;
    case kBackwardWeight:
      // dw[O, I] += dout[N, O]ᵀ · in[N, I]  ⇔  dwᵀ[I, O] += inᵀ[I, N] · dout[N, O].
      //   A = in buffer: column-major [I, N], ld I (= inᵀ), transa = N → m = I, k = N.
      //   B = dout buffer: column-major [O, N], ld O (= doutᵀ), transb = T → op(B) = dout[N, O],
      //   k = N, n = O.
      //   C = D = dw buffer (fp32): column-major [I, O], ld I (= dwᵀ), beta = 1.
      trans_b = CUBLAS_OP_T;
      a_rows = I, a_cols = N, lda = I;
      b_rows = O, b_cols = N, ldb = O;
      m = I, n = O, ldd = I;
      break;
    case kBackwardInput:
      // din[N, I] = dout[N, O] · w[O, I]  ⇔  dinᵀ[I, N] = wᵀ[I, O] · doutᵀ[O, N].
      //   A = w buffer: column-major [I, O], ld I (= wᵀ), transa = N → m = I, k = O.
      //   B = dout buffer: column-major [O, N], ld O (= doutᵀ), transb = N → k = O, n = N.
      //   C = D = din buffer: column-major [I, N], ld I (= dinᵀ), beta = 0. The DGELU aux
      //   (gelu_pre, row-major [N, I]) has D's shape: column-major [I, N], ld I.
      a_rows = I, a_cols = O, lda = I;
      b_rows = O, b_cols = N, ldb = O;
      m = I, n = N, ldd = I;
      break;
    case kBackwardWeightFp8:
      // dwᵀ[I, O] (+)= inᵀ[I, N] · dout[N, O] with both operands given transposed:
      //   A = in_t buffer (row-major [I, N]): column-major [N, I], ld N, transa = T → m = I, k = N.
      //   B = dout_t buffer (row-major [O, N]): column-major [N, O], ld N, transb = N → n = O.
      a_type = CUDA_R_8F_E4M3, b_type = CUDA_R_8F_E5M2;
      trans_a = CUBLAS_OP_T;
      a_rows = N, a_cols = I, lda = N;
      b_rows = N, b_cols = O, ldb = N;
      m = I, n = O, ldd = I;
      break;
    case kBackwardInputFp8:
      // dinᵀ[I, N] = wᵀ[I, O] · doutᵀ[O, N] with w given transposed:
      //   A = w_t buffer (row-major [I, O]): column-major [O, I], ld O, transa = T → m = I, k = O.
      //   B = dout buffer (row-major [N, O]): column-major [O, N], ld O, transb = N → n = N.
      a_type = CUDA_R_8F_E4M3, b_type = CUDA_R_8F_E5M2;
      trans_a = CUBLAS_OP_T;
      a_rows = O, a_cols = I, lda = O;
      b_rows = O, b_cols = N, ldb = O;
      m = I, n = N, ldd = I;
      break;
    default: {
      DT_CHECK(kind >= kBatched && kind < kBatched + 4, "unknown GEMM kind {}", kind);
      // Row-major c[M, Nc] = op(a)[M, K] · op(b)[K, Nc] with (M, Nc, K) = (N, I, O) of the key,
      // computed as cᵀ = op(b)ᵀ · op(a)ᵀ: cuBLASLt's A is the b buffer, its B the a buffer.
      //   b untransposed: stored row-major [K, Nc] = column-major [Nc, K], ld Nc, op N.
      //   b transposed:   stored row-major [Nc, K] = column-major [K, Nc], ld K,  op T.
      //   a untransposed: stored row-major [M, K]  = column-major [K, M],  ld K,  op N.
      //   a transposed:   stored row-major [K, M]  = column-major [M, K],  ld M,  op T.
      //   D = c buffer: column-major [Nc, M], ld Nc.
      const bool ta = (kind - kBatched) / 2 != 0, tb = (kind - kBatched) % 2 != 0;
      const uint64_t M = N, Nc = I, K = O;
      trans_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
      a_rows = tb ? K : Nc, a_cols = tb ? Nc : K, lda = static_cast<int64_t>(a_rows);
      trans_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
      b_rows = ta ? M : K, b_cols = ta ? K : M, ldb = static_cast<int64_t>(b_rows);
      m = Nc, n = M, ldd = static_cast<int64_t>(Nc);
      break;
    }
  }

  auto plan = std::make_unique<Plan>();
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &trans_a, sizeof(trans_a)));
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &trans_b, sizeof(trans_b)));
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                      &epilogue, sizeof(epilogue)));
  // The heuristic does not dereference the bias and aux pointers but reads their alignment from
  // them: give it addresses aligned to exactly kAlignment (the weakest alignment a call may pass)
  // so the chosen algorithm serves every call. The real pointers are set before each matmul.
  const void* const kAlignedPlaceholder = reinterpret_cast<const void*>(uintptr_t{kAlignment});
  const bool has_bias =
      epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    // D is bf16 here, and the bias gradient would default to D's type: ask for fp32 sums (the
    // heuristic finds no algorithm where that is not supported, and the caller falls back).
    const int32_t bias_type = CUDA_R_32F;
    DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    DT_CUBLAS_CHECK(
        Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                            &kAlignedPlaceholder, sizeof(kAlignedPlaceholder)));
  }
  if (epilogue == CUBLASLT_EPILOGUE_BGRADB) {
    // The bias gradient it stores has C's type (fp32 here), the default.
    DT_CUBLAS_CHECK(
        Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                            &kAlignedPlaceholder, sizeof(kAlignedPlaceholder)));
  }
  const bool has_aux = epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                       epilogue == CUBLASLT_EPILOGUE_DGELU ||
                       epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  if (has_bias) {
    // Bias elements have D's type (bf16 here; see Forward(float*, ...) for fp32 D).
    const int32_t bias_type = CUDA_R_16BF;
    DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    DT_CUBLAS_CHECK(
        Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                            &kAlignedPlaceholder, sizeof(kAlignedPlaceholder)));
  }
  if (has_aux) {
    // The GELU input matrix: D's type (bf16, the default aux type) and D's shape; its ld must
    // be a multiple of 8 and at least D's row count (ldd is, by CheckShape).
    const int64_t aux_ld = ldd;
    DT_CHECK(aux_ld % 8 == 0 && aux_ld >= static_cast<int64_t>(m),
             "GELU aux ld {} must be a multiple of 8 and >= {}", aux_ld, m);
    DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    DT_CUBLAS_CHECK(
        Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                            &kAlignedPlaceholder, sizeof(kAlignedPlaceholder)));
  }

  if (kind == kForwardFp8) {
    // Transformer Engine's forward: no split accumulator (the backward's products keep it).
    const int8_t fast_accumulation = 1;
    DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                        &fast_accumulation,
                                                        sizeof(fast_accumulation)));
  }

  DT_CUBLAS_CHECK(Lt().cublasLtMatrixLayoutCreate(&plan->a, a_type, a_rows, a_cols, lda));
  DT_CUBLAS_CHECK(Lt().cublasLtMatrixLayoutCreate(&plan->b, b_type, b_rows, b_cols, ldb));
  DT_CUBLAS_CHECK(Lt().cublasLtMatrixLayoutCreate(&plan->c, d_type, m, n, ldd));
  DT_CUBLAS_CHECK(Lt().cublasLtMatrixLayoutCreate(&plan->d, d_type, m, n, ldd));
  if (batch > 1) {
    // Dense items: each layout's stride is its own matrix's size.
    const int32_t count = batch;
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {plan->a, static_cast<int64_t>(a_rows * a_cols)},
        {plan->b, static_cast<int64_t>(b_rows * b_cols)},
        {plan->c, static_cast<int64_t>(m * n)},
        {plan->d, static_cast<int64_t>(m * n)}};
    for (const auto& [layout, stride] : layouts) {
      DT_CUBLAS_CHECK(Lt().cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      DT_CUBLAS_CHECK(Lt().cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }

  cublasLtMatmulPreference_t preference = nullptr;
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulPreferenceCreate(&preference));
  const size_t max_workspace = workspace_.bytes();
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
  for (const cublasLtMatmulPreferenceAttributes_t attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    DT_CUBLAS_CHECK(Lt().cublasLtMatmulPreferenceSetAttribute(preference, attribute, &kAlignment,
                                                              sizeof(kAlignment)));
  }
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t status =
      Lt().cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->d,
                                          preference, kCandidates, results, &found);
  Lt().cublasLtMatmulPreferenceDestroy(preference);
  if (!required && (status != CUBLAS_STATUS_SUCCESS || found == 0)) {
    plans_.insert_or_assign(key, nullptr);
    return nullptr;
  }
  DT_CHECK(status == CUBLAS_STATUS_SUCCESS && found > 0,
           "cuBLASLt has no algorithm for GEMM kind {} (0 forward, 1 backward-weight, 2 "
           "backward-input, 3-6 batched, 7-9 their FP8), {} output, N={} I={} O={}, epilogue {}, "
           "batch {} "
           "(workspace {} bytes): {}",
           kind, out_type == kOutFloat ? "fp32" : "bf16", N, I, O, epilogue_int, batch,
           max_workspace,
           status == CUBLAS_STATUS_SUCCESS ? "no result" : Lt().cublasLtGetStatusString(status));
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates.push_back(results[i]);
  }
  DT_CHECK(!plan->candidates.empty(), "cuBLASLt offered no usable algorithm for GEMM kind {}",
           kind);
  plan->algo = plan->candidates.front().algo;
  plan->workspace_bytes = plan->candidates.front().workspaceSize;

  Plan* made = plan.get();
  plans_.insert_or_assign(key, std::move(plan));
  return made;
}

namespace {

// Sets the per-call epilogue pointers on a cached descriptor.
void SetEpiloguePointers(cublasLtMatmulDesc_t desc, const void* bias, const void* aux) {
  if (bias != nullptr) {
    DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
}

}  // namespace

void Gemm::Run(Plan& plan, const void* a, const void* b, float alpha, float beta, void* d) {
  DT_CUBLAS_CHECK(TryRun(plan, a, b, alpha, beta, d));
}

cublasStatus_t Gemm::TryRun(Plan& plan, const void* a, const void* b, float alpha, float beta,
                            void* d) {
  ++plan.calls;
  // (Timing runs the product several times: only where the output overwrites no input.)
  if (autotune_ && !plan.tuned && beta == 0.0f && d != a && d != b) Tune(plan, a, b, alpha, d);
  return Lt().cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.c, d,
                             plan.d, &plan.algo, workspace_.data(), plan.workspace_bytes, stream_);
}

void Gemm::Tune(Plan& plan, const void* a, const void* b, float alpha, void* d) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DT_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return;  // tuned at a later eager call
  plan.tuned = true;
  if (plan.candidates.size() < 2) return;
  cudaEvent_t start = nullptr, stop = nullptr;
  DT_CUDA_CHECK(cudaEventCreate(&start));
  DT_CUDA_CHECK(cudaEventCreate(&stop));
  const float beta = 0.0f;
  float best = 0;
  int best_index = -1;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const cublasLtMatmulHeuristicResult_t& c = plan.candidates[i];
    const auto run = [&] {
      return Lt().cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.c,
                                 d, plan.d, &c.algo, workspace_.data(), c.workspaceSize, stream_);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // the warm-up, and whether it runs at all
    DT_CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int r = 0; r < kTuneReps; ++r)
      DT_CUBLAS_CHECK(run());
    DT_CUDA_CHECK(cudaEventRecord(stop, stream_));
    DT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    ms /= kTuneReps;
    if (i == 0) plan.heuristic_ms = ms;
    if (best_index < 0 || ms < best) {
      best = ms;
      best_index = static_cast<int>(i);
    }
  }
  DT_CUDA_CHECK(cudaEventDestroy(start));
  DT_CUDA_CHECK(cudaEventDestroy(stop));
  if (best_index < 0) return;  // none ran: the call itself reports the failure
  if (best_index != 0 && plan.heuristic_ms == 0) plan.heuristic_ms = best;  // the first failed
  plan.chosen = best_index;
  plan.best_ms = best;
  plan.algo = plan.candidates[best_index].algo;
  plan.workspace_bytes = plan.candidates[best_index].workspaceSize;
}

GemmTuning Gemm::Tuning() const {
  GemmTuning t;
  for (const auto& [key, plan] : plans_) {
    if (plan == nullptr) continue;
    ++t.plans;
    if (!plan->tuned || plan->best_ms == 0) continue;
    ++t.tuned;
    t.changed += plan->chosen != 0;
    t.heuristic_ms += double(plan->heuristic_ms) * plan->calls;
    t.tuned_ms += double(plan->best_ms) * plan->calls;
  }
  return t;
}

void Gemm::Forward(bf16* out, const bf16* in, const bf16* w, const bf16* bias, int N, int I, int O,
                   Epilogue epilogue, bf16* aux) {
  CheckShape(N, I, O);
  DT_CHECK(Aligned(out) && Aligned(in) && Aligned(w), "GEMM pointers must be {}-byte aligned",
           kAlignment);
  cublasLtEpilogue_t lt_epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (epilogue) {
    case Epilogue::kNone:
      DT_CHECK(bias == nullptr && aux == nullptr, "Epilogue::kNone takes no bias and no aux");
      break;
    case Epilogue::kBias:
      DT_CHECK(bias != nullptr && aux == nullptr, "Epilogue::kBias takes a bias and no aux");
      lt_epilogue = CUBLASLT_EPILOGUE_BIAS;
      break;
    case Epilogue::kBiasGelu:
      DT_CHECK(bias != nullptr && aux != nullptr, "Epilogue::kBiasGelu takes a bias and an aux");
      lt_epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      break;
  }
  DT_CHECK(Aligned(bias) && Aligned(aux), "bias and aux must be {}-byte aligned", kAlignment);
  Plan& plan = PlanFor(Key{kForward, kOutBf16, N, I, O, static_cast<int>(lt_epilogue), 1});
  SetEpiloguePointers(plan.desc, bias, aux);
  const float alpha = 1.0f, beta = 0.0f;
  Run(plan, w, in, alpha, beta, out);
}

// fp32 D with bf16 A/B: cuBLASLt's bias vector has D's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
// "the same type as the elements of output matrix (Dtype)", the exceptions being IMMA and fp8
// kernels), i.e. fp32 here, and the bias we hold is bf16. So the GEMM runs without epilogue and
// AddBiasKernel adds the bias on the same stream (these are the small adaLN / final-layer GEMMs).
void Gemm::Forward(float* out, const bf16* in, const bf16* w, const bf16* bias, int N, int I, int O,
                   Epilogue epilogue) {
  CheckShape(N, I, O);
  DT_CHECK(Aligned(out) && Aligned(in) && Aligned(w), "GEMM pointers must be {}-byte aligned",
           kAlignment);
  DT_CHECK(epilogue != Epilogue::kBiasGelu, "the fp32-output forward has no GELU epilogue");
  DT_CHECK((epilogue == Epilogue::kBias) == (bias != nullptr),
           "a bias is given exactly with Epilogue::kBias");
  Plan& plan = PlanFor(Key{kForward, kOutFloat, N, I, O, CUBLASLT_EPILOGUE_DEFAULT, 1});
  const float alpha = 1.0f, beta = 0.0f;
  Run(plan, w, in, alpha, beta, out);
  if (bias != nullptr) {
    const size_t n = static_cast<size_t>(N) * O;
    constexpr unsigned kThreads = 256;
    AddBiasKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream_>>>(out, bias, n, O);
    DT_CUDA_CHECK_LAUNCH();
  }
}

void Gemm::BackwardWeight(float* dw, const bf16* dout, const bf16* in, int N, int I, int O,
                          bool accumulate) {
  CheckShape(N, I, O);
  DT_CHECK(Aligned(dw) && Aligned(dout) && Aligned(in), "GEMM pointers must be {}-byte aligned",
           kAlignment);
  Plan& plan = PlanFor(Key{kBackwardWeight, kOutFloat, N, I, O, CUBLASLT_EPILOGUE_DEFAULT, 1});
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;  // dw += ..., or dw = ...
  Run(plan, in, dout, alpha, beta, dw);
}

void Gemm::BackwardWeightAndBias(float* dw, float* dbias, const bf16* dout, const bf16* in, int N,
                                 int I, int O, float* scratch, bool accumulate) {
  CheckShape(N, I, O);
  DT_CHECK(Aligned(dw) && Aligned(dout) && Aligned(in) && Aligned(scratch),
           "GEMM pointers must be {}-byte aligned", kAlignment);
  Plan* plan = TryPlanFor(Key{kBackwardWeight, kOutFloat, N, I, O, CUBLASLT_EPILOGUE_BGRADB, 1});
  if (plan == nullptr) {
    BackwardWeight(dw, dout, in, N, I, O, accumulate);
    BiasGradient(dbias, dout, N, O, stream_);
    return;
  }
  // dwᵀ = inᵀ · dout: cuBLASLt's B is dout (op(B) = dout[N, O], k = N), so BGRADB's sums over
  // k are dout's column sums, one per column of D (O of them).
  SetEpiloguePointers(plan->desc, scratch, nullptr);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;  // dw += ..., or dw = ...
  Run(*plan, in, dout, alpha, beta, dw);
  AddBiasGradient(dbias, scratch, O, stream_);
}

bool Gemm::FusesBiasGradient(int N, int I, int O) {
  CheckShape(N, I, O);
  return TryPlanFor(Key{kBackwardWeight, kOutFloat, N, I, O, CUBLASLT_EPILOGUE_BGRADB, 1}) !=
         nullptr;
}

void Gemm::BackwardInput(bf16* din, const bf16* dout, const bf16* w, int N, int I, int O,
                         const bf16* gelu_pre) {
  CheckShape(N, I, O);
  DT_CHECK(Aligned(din) && Aligned(dout) && Aligned(w) && Aligned(gelu_pre),
           "GEMM pointers must be {}-byte aligned", kAlignment);
  // DGELU: D = (dout · w) ⊙ gelu'(aux), aux being the GELU input GELU_AUX_BIAS wrote.
  const cublasLtEpilogue_t lt_epilogue =
      gelu_pre != nullptr ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
  Plan& plan = PlanFor(Key{kBackwardInput, kOutBf16, N, I, O, static_cast<int>(lt_epilogue), 1});
  SetEpiloguePointers(plan.desc, nullptr, gelu_pre);
  const float alpha = 1.0f, beta = 0.0f;
  Run(plan, w, dout, alpha, beta, din);
}

void Gemm::BackwardInputGeluAndBias(bf16* din, float* dbias, const bf16* dout, const bf16* w, int N,
                                    int I, int O, const bf16* gelu_pre, float* scratch) {
  CheckShape(N, I, O);
  DT_CHECK(gelu_pre != nullptr, "BackwardInputGeluAndBias needs the GELU input");
  DT_CHECK(Aligned(din) && Aligned(dout) && Aligned(w) && Aligned(gelu_pre) && Aligned(scratch),
           "GEMM pointers must be {}-byte aligned", kAlignment);
  const Key key{kBackwardInput, kOutBf16, N, I, O, CUBLASLT_EPILOGUE_DGELU_BGRAD, 1};
  if (Plan* plan = TryPlanFor(key); plan != nullptr) {
    // dinᵀ[I, N] = wᵀ · doutᵀ: D has m = I rows (din's columns) and n = N columns (its rows),
    // and the BGRAD sums run along each row of D, over n: din's column sums, I of them.
    SetEpiloguePointers(plan->desc, scratch, gelu_pre);
    const float alpha = 1.0f, beta = 0.0f;
    if (TryRun(*plan, w, dout, alpha, beta, din) == CUBLAS_STATUS_SUCCESS) {
      AddBiasGradient(dbias, scratch, I, stream_);
      return;
    }
    // Offered by the heuristic, refused by the matmul (not seen yet): never again, and this
    // call (and every later one) the unfused way.
    plans_.insert_or_assign(key, nullptr);
  }
  BackwardInput(din, dout, w, N, I, O, gelu_pre);
  BiasGradient(dbias, din, N, I, stream_);
}

bool Gemm::FusesGeluBiasGradient(int N, int I, int O) {
  CheckShape(N, I, O);
  return TryPlanFor(Key{kBackwardInput, kOutBf16, N, I, O, CUBLASLT_EPILOGUE_DGELU_BGRAD, 1}) !=
         nullptr;
}

bool Gemm::RunFp8(Plan& plan, Fp8Operand a, Fp8Operand b, float beta, void* d) {
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.scale_inv, sizeof(a.scale_inv)));
  DT_CUBLAS_CHECK(Lt().cublasLtMatmulDescSetAttribute(
      plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.scale_inv, sizeof(b.scale_inv)));
  return TryRun(plan, a.data, b.data, /*alpha=*/1.0f, beta, d) == CUBLAS_STATUS_SUCCESS;
}

bool Gemm::ForwardFp8(bf16* out, Fp8Operand in, Fp8Operand w, const bf16* bias, int N, int I, int O,
                      Epilogue epilogue, bf16* aux) {
  CheckFp8Shape(N, I, O);
  DT_CHECK(Aligned(out) && Aligned(in.data) && Aligned(w.data) && Aligned(bias) && Aligned(aux),
           "GEMM pointers must be {}-byte aligned", kAlignment);
  DT_CHECK((epilogue != Epilogue::kNone) == (bias != nullptr) &&
               (epilogue == Epilogue::kBiasGelu) == (aux != nullptr),
           "ForwardFp8: a bias exactly with kBias or kBiasGelu, an aux exactly with kBiasGelu");
  const cublasLtEpilogue_t lt_epilogue = epilogue == Epilogue::kNone ? CUBLASLT_EPILOGUE_DEFAULT
                                         : epilogue == Epilogue::kBias
                                             ? CUBLASLT_EPILOGUE_BIAS
                                             : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const Key key{kForwardFp8, kOutBf16, N, I, O, static_cast<int>(lt_epilogue), 1};
  Plan* plan = TryPlanFor(key);
  if (plan == nullptr) return false;
  SetEpiloguePointers(plan->desc, bias, aux);
  if (RunFp8(*plan, w, in, /*beta=*/0.0f, out)) return true;
  plans_.insert_or_assign(key, nullptr);  // offered, then refused: never again
  return false;
}

bool Gemm::BackwardInputFp8(bf16* din, Fp8Operand dout, Fp8Operand w_t, int N, int I, int O,
                            const bf16* gelu_pre, float* dbias, float* scratch) {
  CheckFp8Shape(N, I, O);
  DT_CHECK(dbias == nullptr || (gelu_pre != nullptr && scratch != nullptr),
           "BackwardInputFp8: a bias gradient needs the GELU input and a scratch");
  DT_CHECK(Aligned(din) && Aligned(dout.data) && Aligned(w_t.data) && Aligned(gelu_pre) &&
               Aligned(scratch),
           "GEMM pointers must be {}-byte aligned", kAlignment);
  if (dbias != nullptr) {
    const Key fused{kBackwardInputFp8, kOutBf16, N, I, O, CUBLASLT_EPILOGUE_DGELU_BGRAD, 1};
    if (Plan* plan = TryPlanFor(fused); plan != nullptr) {
      SetEpiloguePointers(plan->desc, scratch, gelu_pre);
      if (RunFp8(*plan, w_t, dout, 0.0f, din)) {
        AddBiasGradient(dbias, scratch, I, stream_);
        return true;
      }
      plans_.insert_or_assign(fused, nullptr);
    }
  }
  const cublasLtEpilogue_t lt_epilogue =
      gelu_pre != nullptr ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
  const Key key{kBackwardInputFp8, kOutBf16, N, I, O, static_cast<int>(lt_epilogue), 1};
  Plan* plan = TryPlanFor(key);
  if (plan == nullptr) return false;
  SetEpiloguePointers(plan->desc, nullptr, gelu_pre);
  if (!RunFp8(*plan, w_t, dout, 0.0f, din)) {
    plans_.insert_or_assign(key, nullptr);
    return false;
  }
  if (dbias != nullptr) BiasGradient(dbias, din, N, I, stream_);
  return true;
}

bool Gemm::BackwardWeightFp8(float* dw, Fp8Operand dout_t, Fp8Operand in_t, int N, int I, int O,
                             bool accumulate) {
  CheckFp8Shape(N, I, O);
  DT_CHECK(Aligned(dw) && Aligned(dout_t.data) && Aligned(in_t.data),
           "GEMM pointers must be {}-byte aligned", kAlignment);
  const Key key{kBackwardWeightFp8, kOutFloat, N, I, O, CUBLASLT_EPILOGUE_DEFAULT, 1};
  Plan* plan = TryPlanFor(key);
  if (plan == nullptr) return false;
  if (RunFp8(*plan, in_t, dout_t, accumulate ? 1.0f : 0.0f, dw)) return true;
  plans_.insert_or_assign(key, nullptr);
  return false;
}

void Gemm::RunBatched(void* c, int out_type, const bf16* a, bool trans_a, const bf16* b,
                      bool trans_b, int m, int n, int k, int batch, float alpha) {
  DT_CHECK(m > 0 && n > 0 && k > 0 && batch > 0,
           "batched GEMM shape m={} n={} k={} batch={} must be positive", m, n, k, batch);
  DT_CHECK(m % kBf16PerAlignment == 0 && n % kBf16PerAlignment == 0 && k % kBf16PerAlignment == 0,
           "batched GEMM shape m={} n={} k={}: each must be a multiple of {} ({}-byte rows)", m, n,
           k, kBf16PerAlignment, kAlignment);
  DT_CHECK(Aligned(c) && Aligned(a) && Aligned(b), "GEMM pointers must be {}-byte aligned",
           kAlignment);
  const int kind = kBatched + 2 * int(trans_a) + int(trans_b);
  Plan& plan = PlanFor(Key{kind, out_type, m, n, k, CUBLASLT_EPILOGUE_DEFAULT, batch});
  const float beta = 0.0f;
  Run(plan, b, a, alpha, beta, c);
}

void Gemm::Batched(bf16* c, const bf16* a, bool trans_a, const bf16* b, bool trans_b, int m, int n,
                   int k, int batch, float alpha) {
  RunBatched(c, kOutBf16, a, trans_a, b, trans_b, m, n, k, batch, alpha);
}

void Gemm::Batched(float* c, const bf16* a, bool trans_a, const bf16* b, bool trans_b, int m, int n,
                   int k, int batch, float alpha) {
  RunBatched(c, kOutFloat, a, trans_a, b, trans_b, m, n, k, batch, alpha);
}

}  // namespace difftrain::cuda
