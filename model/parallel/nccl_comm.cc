#ifdef DIFFTRAIN_HAVE_CUDA

#include "model/parallel/nccl_comm.h"

#include <nccl.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/check.h"
#include "model/cuda/common.h"
#include "model/parallel/roll_call.h"

namespace difftrain::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

constexpr char kUniqueIdKey[] = "nccl/unique_id";

// How long a waiting host thread sleeps between polls of an op it waits for.
constexpr auto kPollInterval = std::chrono::microseconds(50);

ncclRedOp_t ToNccl(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : ncclAvg;
}

// NCCL rejecting a call as invalid is our bug; every other failure (network, peers,
// system) is the job's and becomes a Status.
void CheckUsage(ncclResult_t result, const std::string& what) {
  DT_CHECK(result != ncclInvalidArgument && result != ncclInvalidUsage, "{}: {}: {}", what,
           ncclGetErrorString(result), ncclGetLastError(nullptr));
}

std::string Cause(ncclResult_t result) {
  return fmt::format("{} ({})", ncclGetErrorString(result), ncclGetLastError(nullptr));
}

class CudaEvent {
 public:
  CudaEvent() { DT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Makes `device` current for a scope: a handle may be waited for on a thread whose
// current device is another one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    DT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) DT_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceScope() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  int device_ = 0;
};

// One op as its handle sees it.
struct OpRecord {
  std::string what;  // "all_reduce #3 (1024 floats)", "send of 16 floats to rank 1 on rank 0"
  int64_t seq = 0;   // the collective's number; 0 for send/recv
  bool launched = false;
  std::shared_ptr<CudaEvent> done;  // recorded after the op; one per group of sends/recvs
  Clock::time_point start;
  std::optional<Status> result;
};

class NcclComm final : public Comm {
 public:
  NcclComm(Store& store, const std::string& prefix, int rank, int size,
           std::vector<int> global_ranks, milliseconds timeout, cudaStream_t compute_stream)
      : store_(store, prefix),
        name_(prefix.substr(prefix.rfind('/') + 1)),
        rank_(rank),
        size_(size),
        global_ranks_(std::move(global_ranks)),
        timeout_(timeout),
        compute_stream_(compute_stream),
        roll_call_(store_, name_, rank, global_ranks_, timeout) {
    DT_CUDA_CHECK(cudaGetDevice(&device_));
  }

  ~NcclComm() override;

  Status Connect();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::unique_ptr<CommWork> AllReduceAsync(float* data, size_t n, ReduceOp op) override;
  std::unique_ptr<CommWork> ReduceScatterAsync(const float* in, float* out, size_t n_per_rank,
                                               ReduceOp op) override;
  std::unique_ptr<CommWork> AllGatherAsync(const float* in, float* out, size_t n_per_rank) override;
  std::unique_ptr<CommWork> BroadcastAsync(float* data, size_t n, int root) override;
  std::unique_ptr<CommWork> SendAsync(const float* data, size_t n, int dst) override;
  std::unique_ptr<CommWork> RecvAsync(float* data, size_t n, int src) override;
  std::unique_ptr<CommWork> BarrierAsync() override;

  // For the handles.
  Status WaitFor(OpRecord& record);
  void Release() { --live_handles_; }

 private:
  using Launch = std::function<ncclResult_t(cudaStream_t)>;
  struct Transfer {
    bool send;
    float* data;
    size_t n;
    int peer;
    std::shared_ptr<OpRecord> record;
  };

  std::unique_ptr<CommWork> Handle(std::shared_ptr<OpRecord> record);
  std::unique_ptr<CommWork> Finished(Status status);
  std::unique_ptr<CommWork> Collective(const std::string& op, size_t n, const Launch& launch);
  std::unique_ptr<CommWork> PointToPoint(bool send, const float* data, size_t n, int peer);
  void LaunchTransfersLocked();
  void WaitForInputsLocked();
  ncclResult_t SettleLocked(ncclResult_t launched, Clock::time_point deadline);
  void AbortLocked(OpRecord& record, const std::string& cause);
  Status NotRun(const std::string& what) const;

  PrefixStore store_;
  const std::string name_;
  const int rank_;
  const int size_;
  const std::vector<int> global_ranks_;
  const milliseconds timeout_;
  const cudaStream_t compute_stream_;
  int device_ = 0;
  RollCall roll_call_;
  std::atomic<int> live_handles_{0};

  // NCCL calls on one communicator must not interleave: everything below is used under mu_.
  std::mutex mu_;
  ncclComm_t comm_ = nullptr;  // null once aborted
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;
  float* barrier_scratch_ = nullptr;  // NCCL has no barrier: a one-float all-reduce
  std::optional<Status> failure_;
  int64_t seq_ = 0;
  std::vector<Transfer> transfers_;  // sends/recvs not launched yet
};

class NcclWork final : public CommWork {
 public:
  NcclWork(NcclComm* comm, std::shared_ptr<OpRecord> record)
      : comm_(comm), record_(std::move(record)) {}
  ~NcclWork() override {
    (void)comm_->WaitFor(*record_);
    comm_->Release();
  }
  Status Wait() override { return comm_->WaitFor(*record_); }

 private:
  NcclComm* comm_;
  std::shared_ptr<OpRecord> record_;
};

NcclComm::~NcclComm() {
  DT_CHECK(live_handles_ == 0, "{}: {} op handles outlived their NCCL communicator", name_,
           live_handles_.load());
  DeviceScope device(device_);
  if (comm_ != nullptr) {
    // Finalizing waits for the peers; if they are gone it would not end, so give up after
    // the timeout and abort instead.
    const ncclResult_t finalized = SettleLocked(ncclCommFinalize(comm_), Clock::now() + timeout_);
    if (finalized == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
  if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Status NcclComm::Connect() {
  DT_RETURN_IF_ERROR(roll_call_.Arrive());
  const std::string context = fmt::format("{}: rendezvous of rank {}", name_, global_ranks_[rank_]);
  ncclUniqueId id;
  if (rank_ == 0) {
    // The id names a bootstrap socket in this process, which lives as long as the rank.
    const ncclResult_t created = ncclGetUniqueId(&id);
    if (created != ncclSuccess) {
      return Errorf("{}: creating the NCCL unique id: {}", context, Cause(created));
    }
    DT_RETURN_IF_ERROR(
        store_.Set(kUniqueIdKey, std::vector<char>(id.internal, id.internal + sizeof(id.internal)))
            .WithContext(context));
  } else {
    Result<std::vector<char>> bytes = store_.Get(kUniqueIdKey, timeout_);
    if (!bytes.ok()) return bytes.status().WithContext(context);
    if (bytes->size() != sizeof(id.internal)) {
      return Errorf("{}: the NCCL unique id has {} bytes, expected {}", context, bytes->size(),
                    sizeof(id.internal));
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }

  std::lock_guard<std::mutex> lock(mu_);
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DT_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
  DT_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));
  DT_CUDA_CHECK(cudaMemset(barrier_scratch_, 0, sizeof(float)));
  // Non-blocking initialisation, so that a rank that never connects costs a timeout and
  // an abort instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const Clock::time_point deadline = Clock::now() + timeout_;
  ncclResult_t result = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  CheckUsage(result, context);
  if (comm_ != nullptr) result = SettleLocked(result, deadline);
  if (result == ncclSuccess) return Status::Ok();
  const std::string cause =
      result == ncclInProgress
          ? fmt::format("NCCL initialisation did not finish within {} ms", timeout_.count())
          : Cause(result);
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  return Errorf("{}: {}", context, cause);
}

// A non-blocking communicator answers ncclInProgress while a call is still running; this
// polls until the call is done, failed, or `deadline` passed (ncclInProgress then).
ncclResult_t NcclComm::SettleLocked(ncclResult_t launched, Clock::time_point deadline) {
  if (launched != ncclInProgress) return launched;
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    if (queried != ncclSuccess) return queried;
    if (state != ncclInProgress || Clock::now() >= deadline) return state;
    std::this_thread::sleep_for(kPollInterval);
  }
}

// The op's inputs come from the caller's stream: the communicator's stream waits for them.
void NcclComm::WaitForInputsLocked() {
  DT_CUDA_CHECK(cudaEventRecord(inputs_ready_, compute_stream_));
  DT_CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
}

void NcclComm::AbortLocked(OpRecord& record, const std::string& cause) {
  ncclCommAbort(comm_);
  comm_ = nullptr;
  const int me = global_ranks_[rank_];
  const auto elapsed = duration_cast<milliseconds>(Clock::now() - record.start).count();
  Status error = record.seq > 0
                     ? Errorf("{}: {} failed on rank {} after {} ms (timeout {} ms); {}; cause: {}",
                              name_, record.what, me, elapsed, timeout_.count(),
                              roll_call_.Diagnose(record.seq, record.start), cause)
                     : Errorf("{}: {} failed after {} ms: {}", name_, record.what, elapsed, cause);
  failure_ = error;
  record.result = std::move(error);
}

Status NcclComm::NotRun(const std::string& what) const {
  return Errorf("{}: {} not run: the communicator failed earlier: {}", name_, what,
                failure_->message());
}

std::unique_ptr<CommWork> NcclComm::Handle(std::shared_ptr<OpRecord> record) {
  ++live_handles_;
  return std::make_unique<NcclWork>(this, std::move(record));
}

std::unique_ptr<CommWork> NcclComm::Finished(Status status) {
  auto record = std::make_shared<OpRecord>();
  record->result = std::move(status);
  return Handle(std::move(record));
}

std::unique_ptr<CommWork> NcclComm::Collective(const std::string& op, size_t n,
                                               const Launch& launch) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceScope device(device_);
  // Ops run in issue order: sends and receives issued before this go first.
  LaunchTransfersLocked();
  auto record = std::make_shared<OpRecord>();
  record->seq = ++seq_;
  record->what = n > 0 ? fmt::format("{} #{} ({} floats)", op, record->seq, n)
                       : fmt::format("{} #{}", op, record->seq);
  if (failure_) return Finished(NotRun(record->what));
  record->start = Clock::now();
  roll_call_.Entered(record->seq);
  WaitForInputsLocked();
  const ncclResult_t result = SettleLocked(launch(stream_), record->start + timeout_);
  CheckUsage(result, record->what);
  if (result != ncclSuccess) {
    AbortLocked(*record, result == ncclInProgress ? "the launch did not finish" : Cause(result));
    return Handle(std::move(record));
  }
  record->done = std::make_shared<CudaEvent>();
  DT_CUDA_CHECK(cudaEventRecord(record->done->get(), stream_));
  record->launched = true;
  return Handle(std::move(record));
}

// Launches the pending sends and receives as one NCCL group: within a group they
// progress together, so the two halves of an exchange cannot wait for each other.
void NcclComm::LaunchTransfersLocked() {
  if (transfers_.empty()) return;
  std::vector<Transfer> batch = std::move(transfers_);
  transfers_.clear();
  if (failure_) {
    for (Transfer& t : batch)
      t.record->result = NotRun(t.record->what);
    return;
  }
  const Clock::time_point start = Clock::now();
  for (Transfer& t : batch)
    t.record->start = start;
  WaitForInputsLocked();
  ncclResult_t result = ncclGroupStart();
  for (const Transfer& t : batch) {
    const ncclResult_t posted = t.send ? ncclSend(t.data, t.n, ncclFloat32, t.peer, comm_, stream_)
                                       : ncclRecv(t.data, t.n, ncclFloat32, t.peer, comm_, stream_);
    if (result == ncclSuccess) result = posted;
  }
  const ncclResult_t ended = ncclGroupEnd();  // always, to close the group
  if (result == ncclSuccess) result = ended;
  result = SettleLocked(result, start + timeout_);
  CheckUsage(result, batch.front().record->what);
  if (result != ncclSuccess) {
    AbortLocked(*batch.front().record,
                result == ncclInProgress ? "the launch did not finish" : Cause(result));
    for (Transfer& t : batch) {
      if (!t.record->result) t.record->result = NotRun(t.record->what);
    }
    return;
  }
  auto done = std::make_shared<CudaEvent>();
  DT_CUDA_CHECK(cudaEventRecord(done->get(), stream_));
  for (Transfer& t : batch) {
    t.record->done = done;
    t.record->launched = true;
  }
}

Status NcclComm::WaitFor(OpRecord& record) {
  std::unique_lock<std::mutex> lock(mu_);
  DeviceScope device(device_);
  if (!record.result && !record.launched) LaunchTransfersLocked();
  while (!record.result) {
    if (failure_) {
      // Another op failed and aborted the communicator while this one was in flight.
      record.result = Errorf("{}: {} aborted: the communicator failed: {}", name_, record.what,
                             failure_->message());
      break;
    }
    const cudaError_t query = cudaEventQuery(record.done->get());
    if (query == cudaSuccess) {
      if (record.seq > 0) roll_call_.Completed(record.seq);
      record.result = Status::Ok();
      break;
    }
    DT_CHECK(query == cudaErrorNotReady, "{}: waiting for {}: {}", name_, record.what,
             cudaGetErrorString(query));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    if (queried != ncclSuccess) state = queried;
    if (state != ncclSuccess && state != ncclInProgress) {
      AbortLocked(record, Cause(state));
    } else if (Clock::now() >= record.start + timeout_) {
      AbortLocked(record, fmt::format("not finished after {} ms", timeout_.count()));
    } else {
      // Let other threads issue ops on this communicator meanwhile.
      lock.unlock();
      std::this_thread::sleep_for(kPollInterval);
      lock.lock();
    }
  }
  return *record.result;
}

std::unique_ptr<CommWork> NcclComm::PointToPoint(bool send, const float* data, size_t n, int peer) {
  CheckPeer(peer);
  if (n == 0) return Finished(Status::Ok());
  auto record = std::make_shared<OpRecord>();
  record->what = fmt::format("{} of {} floats {} rank {} on rank {}", send ? "send" : "recv", n,
                             send ? "to" : "from", global_ranks_[peer], global_ranks_[rank_]);
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_) return Finished(NotRun(record->what));
  // NCCL never writes a send buffer; one list holds both directions.
  transfers_.push_back({send, const_cast<float*>(data), n, peer, record});
  return Handle(std::move(record));
}

std::unique_ptr<CommWork> NcclComm::AllReduceAsync(float* data, size_t n, ReduceOp op) {
  if (n == 0) return Finished(Status::Ok());
  return Collective("all_reduce", n, [this, data, n, op](cudaStream_t stream) {
    return ncclAllReduce(data, data, n, ncclFloat32, ToNccl(op), comm_, stream);
  });
}

std::unique_ptr<CommWork> NcclComm::ReduceScatterAsync(const float* in, float* out,
                                                       size_t n_per_rank, ReduceOp op) {
  CheckReduceScatterBuffers(in, out, n_per_rank);
  if (n_per_rank == 0) return Finished(Status::Ok());
  return Collective("reduce_scatter", n_per_rank, [=, this](cudaStream_t stream) {
    return ncclReduceScatter(in, out, n_per_rank, ncclFloat32, ToNccl(op), comm_, stream);
  });
}

std::unique_ptr<CommWork> NcclComm::AllGatherAsync(const float* in, float* out, size_t n_per_rank) {
  CheckAllGatherBuffers(in, out, n_per_rank);
  if (n_per_rank == 0) return Finished(Status::Ok());
  return Collective("all_gather", n_per_rank, [=, this](cudaStream_t stream) {
    return ncclAllGather(in, out, n_per_rank, ncclFloat32, comm_, stream);
  });
}

std::unique_ptr<CommWork> NcclComm::BroadcastAsync(float* data, size_t n, int root) {
  CheckRoot(root);
  if (n == 0) return Finished(Status::Ok());
  return Collective("broadcast", n, [=, this](cudaStream_t stream) {
    return ncclBroadcast(data, data, n, ncclFloat32, root, comm_, stream);
  });
}

std::unique_ptr<CommWork> NcclComm::BarrierAsync() {
  return Collective("barrier", 0, [this](cudaStream_t stream) {
    return ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_,
                         stream);
  });
}

std::unique_ptr<CommWork> NcclComm::SendAsync(const float* data, size_t n, int dst) {
  return PointToPoint(/*send=*/true, data, n, dst);
}

std::unique_ptr<CommWork> NcclComm::RecvAsync(float* data, size_t n, int src) {
  return PointToPoint(/*send=*/false, data, n, src);
}

}  // namespace

Result<std::unique_ptr<Comm>> CreateNcclComm(Store& store, const std::string& prefix, int rank,
                                             int size, std::vector<int> global_ranks,
                                             milliseconds timeout, cudaStream_t compute_stream) {
  CheckMembership(rank, size, global_ranks, timeout);
  auto comm = std::make_unique<NcclComm>(store, prefix, rank, size, std::move(global_ranks),
                                         timeout, compute_stream);
  DT_RETURN_IF_ERROR(comm->Connect());
  return std::unique_ptr<Comm>(std::move(comm));
}

}  // namespace difftrain::parallel

#endif  // DIFFTRAIN_HAVE_CUDA
