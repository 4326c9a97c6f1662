// cuDNN's SDPA graphs for model/cuda/cudnn_attention.h. The frontend (header-only, fetched by
// scripts/cudnn_frontend.sh) builds each graph — q, k and v as [B, H, T, hd] views of the packed
// qkv, out and dO as views of [B, T, D], the statistics [B, H, T, 1] — validates it, asks
// cuDNN's heuristics for plans (mode A), keeps the first that builds, and executes it with the
// device pointers bound to the tensors' uids. cuDNN is opened with dlopen (the frontend's
// dynamic loading: every backend call goes through cudnn_frontend::cudnn_dlhandle), and the
// frontend's exceptions (a symbol or library it cannot find) become Status errors.
#include "model/cuda/cudnn_attention.h"

#include <cmath>
#include <cstdint>

#include "model/cuda/device_buffer.h"

#if DIFFTRAIN_HAVE_CUDNN_FRONTEND
#include <dlfcn.h>

#include <cudnn_frontend.h>

#include <exception>
#include <mutex>
#include <unordered_map>
#include <vector>

// The frontend's dynamic loading reads cuDNN's symbols from this handle (it declares it).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace difftrain::cuda {
namespace {

// A shape the attention is asked for, and what it refuses whatever the build (named first).
struct Shape {
  int B = 0, T = 0, D = 0, H = 0;
  bool operator==(const Shape&) const = default;
  int64_t hd() const { return H > 0 ? D / H : 0; }
  std::string Describe() const {
    return fmt::format("B={} T={} D={} H={} (head dim {})", B, T, D, H, hd());
  }
};

Status Refuses(const Shape& s) {
  if (s.B < 1 || s.T < 1 || s.H < 1 || s.D % s.H != 0) {
    return Errorf("cuDNN attention: no shape {}", s.Describe());
  }
  if (!CudnnAttentionTakes(static_cast<int>(s.hd()))) {
    return Errorf("cuDNN attention at {}: the head dim must be a multiple of 8 up to 128",
                  s.Describe());
  }
  return Status::Ok();
}

}  // namespace

bool CudnnAttentionTakes(int head_dim) {
  return head_dim > 0 && head_dim % 8 == 0 && head_dim <= 128;
}

CudnnAttention* CudnnAttentionSet::Get(int B, int T, int D, int H) {
  std::unique_ptr<CudnnAttention>& attention = shapes_[{B, T, D, H}];
  if (attention == nullptr) attention = std::make_unique<CudnnAttention>();
  return attention.get();
}

Status CudnnAttentionSet::Prepare() {
  for (const auto& [shape, attention] : shapes_) {
    const auto [B, T, D, H] = shape;
    if (Status s = attention->Prepare(B, T, D, H); !s.ok()) {
      return s.WithContext(fmt::format("cuDNN attention at B={} T={} D={} H={}", B, T, D, H));
    }
  }
  return Status::Ok();
}

size_t CudnnAttentionSet::workspace_bytes() const {
  size_t bytes = 0;
  for (const auto& [shape, attention] : shapes_)
    bytes += attention->workspace_bytes();
  return bytes;
}

#if DIFFTRAIN_HAVE_CUDNN_FRONTEND
namespace {

namespace fe = cudnn_frontend;
using GraphPtr = std::shared_ptr<fe::graph::Graph>;

// The uids the graphs' tensors are bound by.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// Opens libcudnn.so.9 once; the error, if it could not, every time after.
Status OpenCudnn() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    void* handle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = fmt::format(
          "cannot load libcudnn.so.9 ({}): install cuDNN 9 or put its lib folder "
          "on LD_LIBRARY_PATH",
          why != nullptr ? why : "not found");
      return;
    }
    cudnn_frontend::cudnn_dlhandle = handle;
    try {
      const int64_t version = fe::detail::get_backend_version();
      if (version / 10000 != 9) error = fmt::format("libcudnn.so.9 reports version {}", version);
    } catch (const std::exception& e) {
      error = fmt::format("libcudnn.so.9: {}", e.what());
    }
  });
  return error.empty() ? Status::Ok() : Errorf("cuDNN: {}", error);
}

// [B, H, T, hd] views, set on `t`: of the packed qkv [B, T, 3·D] (q, k or v, dq, dk or dv: the
// pointer bound to the uid says which), of out and dout [B, T, D], and the statistics [B, H, T, 1].
fe::graph::Tensor_attributes& PackedView(fe::graph::Tensor_attributes& t, const char* name, Uid uid,
                                         const Shape& s) {
  return t.set_name(name)
      .set_uid(uid)
      .set_dim({s.B, s.H, s.T, s.hd()})
      .set_stride({int64_t{s.T} * 3 * s.D, s.hd(), 3 * int64_t{s.D}, 1});
}
fe::graph::Tensor_attributes& RowsView(fe::graph::Tensor_attributes& t, const char* name, Uid uid,
                                       const Shape& s) {
  return t.set_name(name)
      .set_uid(uid)
      .set_dim({s.B, s.H, s.T, s.hd()})
      .set_stride({int64_t{s.T} * s.D, s.hd(), s.D, 1});
}
fe::graph::Tensor_attributes& StatsView(fe::graph::Tensor_attributes& t, const Shape& s) {
  return t.set_name("stats")
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({s.B, s.H, s.T, 1})
      .set_stride({int64_t{s.H} * s.T, s.T, 1, 1});
}

// The graph's inputs: q, k, v.
struct Qkv {
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v;
};
Qkv QkvInputs(fe::graph::Graph& g, const Shape& s) {
  fe::graph::Tensor_attributes q, k, v;
  return {g.tensor(PackedView(q, "q", kQ, s)), g.tensor(PackedView(k, "k", kK, s)),
          g.tensor(PackedView(v, "v", kV, s))};
}

GraphPtr NewGraph(int sm) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm > 0) g->set_sm_version(sm);
  return g;
}

float Scale(const Shape& s) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd())));
}

// out, stats = SDPA(q, k, v), the statistics kept for the backward.
GraphPtr ForwardGraph(const Shape& s, int sm) {
  GraphPtr g = NewGraph(sm);
  const Qkv in = QkvInputs(*g, s);
  auto options =
      fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(
          Scale(s));
  auto [o, stats] = g->sdpa(in.q, in.k, in.v, options);
  RowsView(*o, "out", kO, s).set_output(true);
  StatsView(*stats, s).set_output(true);
  return g;
}

// dq, dk, dv (views of the packed dqkv) from dout, given q, k, v, out and the statistics.
GraphPtr BackwardGraph(const Shape& s, int sm) {
  GraphPtr g = NewGraph(sm);
  const Qkv in = QkvInputs(*g, s);
  fe::graph::Tensor_attributes o, dout, stats;
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(Scale(s))
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(in.q, in.k, in.v, g->tensor(RowsView(o, "out", kO, s)),
                                       g->tensor(RowsView(dout, "dout", kDO, s)),
                                       g->tensor(StatsView(stats, s)), options);
  PackedView(*dq, "dq", kDQ, s).set_output(true);
  PackedView(*dk, "dk", kDK, s).set_output(true);
  PackedView(*dv, "dv", kDV, s).set_output(true);
  return g;
}

// Runs f (frontend calls returning error_t), turning a bad result or an exception into an error
// naming `what` and the shape.
template <class F>
Status Frontend(const char* what, const Shape& s, F&& f) {
  try {
    fe::error_t e = f();
    if (e.is_bad()) {
      return Errorf("cuDNN {} of attention at {}: {}", what, s.Describe(), e.get_message());
    }
  } catch (const std::exception& e) {
    return Errorf("cuDNN {} of attention at {}: {}", what, s.Describe(), e.what());
  }
  return Status::Ok();
}

Status Validate(const GraphPtr& g, const char* what, const Shape& s) {
  return Frontend(what, s, [&] { return g->validate(); });
}

Status Build(const GraphPtr& g, cudnnHandle_t handle, const char* what, const Shape& s) {
  DT_RETURN_IF_ERROR(Validate(g, what, s));
  DT_RETURN_IF_ERROR(Frontend(what, s, [&] { return g->build_operation_graph(handle); }));
  DT_RETURN_IF_ERROR(
      Frontend(what, s, [&] { return g->create_execution_plans({fe::HeurMode_t::A}); }));
  DT_RETURN_IF_ERROR(Frontend(what, s, [&] { return g->check_support(); }));
  return Frontend(what, s,
                  [&] { return g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); });
}

}  // namespace

struct CudnnAttention::Impl {
  cudnnHandle_t handle = nullptr;
  Shape shape;
  GraphPtr forward, backward;
  DeviceBuffer<unsigned char> workspace;
  int version = 0;

  ~Impl() {
    forward.reset();
    backward.reset();
    if (handle != nullptr) fe::detail::destroy_handle(handle);  // teardown: status ignored
  }
};

Status CudnnAttentionAvailable() {
  return OpenCudnn();
}

Status CudnnAttentionValidate(int B, int T, int D, int H, int sm) {
  const Shape s{B, T, D, H};
  DT_RETURN_IF_ERROR(Refuses(s));
  DT_RETURN_IF_ERROR(OpenCudnn());
  DT_RETURN_IF_ERROR(Validate(ForwardGraph(s, sm), "forward graph", s));
  return Validate(BackwardGraph(s, sm), "backward graph", s);
}

CudnnAttention::CudnnAttention() : impl_(std::make_unique<Impl>()) {}
CudnnAttention::~CudnnAttention() = default;

Status CudnnAttention::Prepare(int B, int T, int D, int H) {
  const Shape s{B, T, D, H};
  if (impl_->forward != nullptr && impl_->shape == s) return Status::Ok();
  DT_RETURN_IF_ERROR(Refuses(s));
  DT_RETURN_IF_ERROR(OpenCudnn());
  if (impl_->handle == nullptr) {
    try {
      const cudnnStatus_t status = fe::detail::create_handle(&impl_->handle);
      if (status != CUDNN_STATUS_SUCCESS) {
        impl_->handle = nullptr;
        return Errorf("cuDNN: cudnnCreate failed ({}): is there a GPU?",
                      fe::detail::get_error_string(status));
      }
      impl_->version = static_cast<int>(fe::detail::get_backend_version());
    } catch (const std::exception& e) {
      return Errorf("cuDNN: cudnnCreate: {}", e.what());
    }
  }
  impl_->forward.reset();
  impl_->backward.reset();
  impl_->workspace = DeviceBuffer<unsigned char>();
  GraphPtr forward = ForwardGraph(s, 0), backward = BackwardGraph(s, 0);
  DT_RETURN_IF_ERROR(Build(forward, impl_->handle, "forward", s));
  DT_RETURN_IF_ERROR(Build(backward, impl_->handle, "backward", s));
  int64_t forward_bytes = 0, backward_bytes = 0;
  DT_RETURN_IF_ERROR(
      Frontend("forward workspace", s, [&] { return forward->get_workspace_size(forward_bytes); }));
  DT_RETURN_IF_ERROR(Frontend("backward workspace", s,
                              [&] { return backward->get_workspace_size(backward_bytes); }));
  const size_t bytes = static_cast<size_t>(std::max<int64_t>({forward_bytes, backward_bytes, 1}));
  Result<DeviceBuffer<unsigned char>> workspace = DeviceBuffer<unsigned char>::TryAllocate(bytes);
  if (!workspace.ok()) {
    return Errorf("cuDNN attention at {}: its workspace: {}", s.Describe(),
                  workspace.status().message());
  }
  impl_->workspace = std::move(workspace).value();
  impl_->forward = std::move(forward);
  impl_->backward = std::move(backward);
  impl_->shape = s;
  return Status::Ok();
}

size_t CudnnAttention::workspace_bytes() const {
  return impl_->forward != nullptr ? impl_->workspace.bytes() : 0;
}

int CudnnAttention::version() const {
  return impl_->version;
}

namespace {

void Execute(const fe::graph::Graph& g, cudnnHandle_t handle,
             std::unordered_map<int64_t, void*>& pointers, void* workspace, cudaStream_t stream,
             const char* what) {
  // A prepared plan that fails here is a bug or a broken installation: fail fast, as kernels do.
  try {
    const cudnnStatus_t status = fe::detail::set_stream(handle, stream);
    DT_CHECK(status == CUDNN_STATUS_SUCCESS, "cudnnSetStream: {}",
             fe::detail::get_error_string(status));
    fe::error_t e = g.execute(handle, pointers, workspace);
    DT_CHECK(e.is_good(), "cuDNN attention {}: {}", what, e.get_message());
  } catch (const std::exception& e) {
    DT_CHECK(false, "cuDNN attention {}: {}", what, e.what());
  }
}

// The bf16 pointers bound to a tensor (the graphs read them; cuDNN takes void*).
void* Bind(const bf16* p) {
  return const_cast<bf16*>(p);
}

}  // namespace

void CudnnAttention::Forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int D, int H,
                             cudaStream_t stream) {
  DT_CHECK(impl_->forward != nullptr && impl_->shape == (Shape{B, T, D, H}),
           "CudnnAttention::Forward at B={} T={} D={} H={} before Prepare of that shape", B, T, D,
           H);
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, Bind(qkv)}, {kK, Bind(qkv + D)}, {kV, Bind(qkv + 2 * D)}, {kO, out}, {kStats, lse}};
  Execute(*impl_->forward, impl_->handle, pointers, impl_->workspace.data(), stream, "forward");
}

void CudnnAttention::Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, int B, int T, int D, int H, cudaStream_t stream) {
  DT_CHECK(impl_->backward != nullptr && impl_->shape == (Shape{B, T, D, H}),
           "CudnnAttention::Backward at B={} T={} D={} H={} before Prepare of that shape", B, T, D,
           H);
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, Bind(qkv)}, {kK, Bind(qkv + D)}, {kV, Bind(qkv + 2 * D)},
      {kO, Bind(out)}, {kDO, Bind(dout)},   {kStats, const_cast<float*>(lse)},
      {kDQ, dqkv},     {kDK, dqkv + D},     {kDV, dqkv + 2 * D}};
  Execute(*impl_->backward, impl_->handle, pointers, impl_->workspace.data(), stream, "backward");
}

#else  // no cuDNN frontend in this build

namespace {
constexpr const char* kNotBuilt =
    "cuDNN attention: this build has no cuDNN frontend (CMake found no cudnn.h, or "
    "scripts/cudnn_frontend.sh could not fetch it from PyPI when the build was configured)";
}  // namespace

struct CudnnAttention::Impl {};

Status CudnnAttentionAvailable() {
  return Errorf("{}", kNotBuilt);
}
Status CudnnAttentionValidate(int B, int T, int D, int H, int) {
  DT_RETURN_IF_ERROR(Refuses({B, T, D, H}));
  return Errorf("{}", kNotBuilt);
}
CudnnAttention::CudnnAttention() : impl_(std::make_unique<Impl>()) {}
CudnnAttention::~CudnnAttention() = default;
Status CudnnAttention::Prepare(int B, int T, int D, int H) {
  DT_RETURN_IF_ERROR(Refuses({B, T, D, H}));
  return Errorf("{}", kNotBuilt);
}
size_t CudnnAttention::workspace_bytes() const {
  return 0;
}
int CudnnAttention::version() const {
  return 0;
}
void CudnnAttention::Forward(bf16*, float*, const bf16*, int, int, int, int, cudaStream_t) {
  DT_CHECK(false, "{}", kNotBuilt);
}
void CudnnAttention::Backward(bf16*, const bf16*, const bf16*, const bf16*, const float*, int, int,
                              int, int, cudaStream_t) {
  DT_CHECK(false, "{}", kNotBuilt);
}

#endif

}  // namespace difftrain::cuda
