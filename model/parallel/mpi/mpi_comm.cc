#include "model/parallel/mpi/mpi_comm.h"

#include <climits>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "model/parallel/group_membership.h"
#include "model/parallel/mpi/mpi_request.h"
#include "model/parallel/roll_call.h"

namespace difftrain::parallel {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

int Count(size_t n) {
  DT_CHECK(n <= static_cast<size_t>(INT_MAX), "{} floats in one MPI op (at most {})", n, INT_MAX);
  return static_cast<int>(n);
}

class MpiComm;

// One started op: its request, and what to do once it completes (scale an average).
struct PendingOp {
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what;  // "all_reduce #3 (1024 floats)", for messages
  int64_t seq = 0;   // the collective's number in the roll call; 0 for send/recv
  MpiClock::time_point start;
  std::function<void()> finish;
  std::vector<float> scratch;  // a copy of an input that overlaps the output
};

class MpiWork final : public CommWork {
 public:
  MpiWork(MpiComm* comm, std::unique_ptr<PendingOp> op) : comm_(comm), op_(std::move(op)) {}
  explicit MpiWork(Status status) : status_(std::move(status)) {}
  ~MpiWork() override { (void)Wait(); }
  Status Wait() override;

 private:
  MpiComm* comm_ = nullptr;
  std::unique_ptr<PendingOp> op_;
  std::optional<Status> status_;
};

class MpiComm final : public Comm {
 public:
  MpiComm(Store& store, const std::string& prefix, int rank, int size,
          std::vector<int> global_ranks, milliseconds timeout)
      : m_(store, prefix, rank, size, std::move(global_ranks), timeout),
        roll_call_(m_.store, m_.name, rank, m_.global_ranks, timeout) {}

  ~MpiComm() override {
    // A communicator with an op that never completed is left to the process's end: freeing
    // it would wait for that op.
    if (comm_ != MPI_COMM_NULL && !failure()) MPI_Comm_free(&comm_);
  }

  RollCall& roll_call() { return roll_call_; }
  void set_comm(MPI_Comm comm) { comm_ = comm; }

  int rank() const override { return m_.rank; }
  int size() const override { return m_.size; }
  const std::string& name() const override { return m_.name; }

  std::unique_ptr<CommWork> AllReduceAsync(float* data, size_t n, ReduceOp op) override {
    if (n == 0) return Done();
    return Start("all_reduce", n, Averaging(data, n, op), [&](PendingOp& p) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, Count(n), MPI_FLOAT, MPI_SUM, comm_, &p.request);
    });
  }

  std::unique_ptr<CommWork> ReduceScatterAsync(const float* in, float* out, size_t n_per_rank,
                                               ReduceOp op) override {
    if (n_per_rank == 0) return Done();
    CheckReduceScatterBuffers(in, out, n_per_rank);
    const size_t total = n_per_rank * static_cast<size_t>(m_.size);
    return Start("reduce_scatter", n_per_rank, Averaging(out, n_per_rank, op), [&](PendingOp& p) {
      // MPI allows no overlap of input and output but MPI_IN_PLACE, whose layout differs.
      const float* source = in;
      if (out < in + total && in < out + n_per_rank) {
        p.scratch.assign(in, in + total);
        source = p.scratch.data();
      }
      return MPI_Ireduce_scatter_block(source, out, Count(n_per_rank), MPI_FLOAT, MPI_SUM, comm_,
                                       &p.request);
    });
  }

  std::unique_ptr<CommWork> AllGatherAsync(const float* in, float* out,
                                           size_t n_per_rank) override {
    if (n_per_rank == 0) return Done();
    CheckAllGatherBuffers(in, out, n_per_rank);
    const bool in_place = in == out + static_cast<size_t>(m_.rank) * n_per_rank;
    return Start("all_gather", n_per_rank, nullptr, [&](PendingOp& p) {
      const int count = Count(n_per_rank);
      return MPI_Iallgather(in_place ? MPI_IN_PLACE : in, count, MPI_FLOAT, out, count, MPI_FLOAT,
                            comm_, &p.request);
    });
  }

  std::unique_ptr<CommWork> BroadcastAsync(float* data, size_t n, int root) override {
    CheckRoot(root);
    if (n == 0) return Done();
    return Start("broadcast", n, nullptr, [&](PendingOp& p) {
      return MPI_Ibcast(data, Count(n), MPI_FLOAT, root, comm_, &p.request);
    });
  }

  std::unique_ptr<CommWork> SendAsync(const float* data, size_t n, int dst) override {
    // MPI never writes a send buffer; MPI_Isend just takes a void*.
    return PointToPoint(/*send=*/true, const_cast<float*>(data), n, dst);
  }

  std::unique_ptr<CommWork> RecvAsync(float* data, size_t n, int src) override {
    return PointToPoint(/*send=*/false, data, n, src);
  }

  std::unique_ptr<CommWork> BarrierAsync() override {
    return Start("barrier", 0, nullptr,
                 [&](PendingOp& p) { return MPI_Ibarrier(comm_, &p.request); });
  }

  // Called by MpiWork when its op completes or runs out of time.
  Status Finished(PendingOp& op, bool completed) {
    if (completed) {
      if (op.finish) op.finish();
      if (op.seq > 0) roll_call_.Completed(op.seq);
      return Status::Ok();
    }
    const auto elapsed = duration_cast<milliseconds>(MpiClock::now() - op.start);
    const std::string missing =
        op.seq > 0 ? roll_call_.Diagnose(op.seq, op.start) : "the peer did not take part";
    Status status = Errorf(
        "{}: {} failed on rank {} after {} ms (timeout {} ms); {}; cause: MPI did not "
        "complete it in time",
        m_.name, op.what, m_.global_ranks[m_.rank], elapsed.count(), m_.timeout.count(), missing);
    Fail(status);
    return status;
  }

  milliseconds timeout() const { return m_.timeout; }

 private:
  static std::unique_ptr<CommWork> Done() { return std::make_unique<MpiWork>(Status::Ok()); }

  std::function<void()> Averaging(float* data, size_t n, ReduceOp op) const {
    if (op != ReduceOp::kAvg) return nullptr;
    const float scale = 1.0f / static_cast<float>(m_.size);
    return [data, n, scale] {
      for (size_t i = 0; i < n; ++i)
        data[i] *= scale;
    };
  }

  // MPI matches the sends and receives of a pair of ranks in the order they were posted,
  // which is Comm's rule.
  std::unique_ptr<CommWork> PointToPoint(bool send, float* data, size_t n, int peer) {
    CheckPeer(peer);
    if (n == 0) return Done();
    const std::string op =
        fmt::format("{} rank {}", send ? "send to" : "recv from", m_.global_ranks[peer]);
    return Start(
        op, n, nullptr,
        [&](PendingOp& p) {
          return send ? MPI_Isend(data, Count(n), MPI_FLOAT, peer, 0, comm_, &p.request)
                      : MPI_Irecv(data, Count(n), MPI_FLOAT, peer, 0, comm_, &p.request);
        },
        /*collective=*/false);
  }

  // Starts an op with `post` (an MPI_I… call that fills the pending op's request) unless the
  // communicator failed earlier.
  std::unique_ptr<CommWork> Start(const std::string& op, size_t n, std::function<void()> finish,
                                  const std::function<int(PendingOp&)>& post,
                                  bool collective = true) {
    if (std::optional<Status> failed = failure()) {
      return std::make_unique<MpiWork>(Errorf("{}: {} not run: the communicator failed earlier: {}",
                                              m_.name, op, failed->message()));
    }
    auto pending = std::make_unique<PendingOp>();
    pending->seq = collective ? ++collective_seq_ : 0;
    pending->what = pending->seq > 0 ? fmt::format("{} #{}", op, pending->seq) : op;
    if (n > 0) pending->what += fmt::format(" ({} floats)", n);
    pending->start = MpiClock::now();
    pending->finish = std::move(finish);
    if (pending->seq > 0) roll_call_.Entered(pending->seq);
    DT_MPI(post(*pending));
    return std::make_unique<MpiWork>(this, std::move(pending));
  }

  std::optional<Status> failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  void Fail(const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) failure_ = status;
  }

  GroupMembership m_;
  RollCall roll_call_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // set once the members have met
  int64_t collective_seq_ = 0;     // ops are issued from one thread at a time
  mutable std::mutex mu_;
  std::optional<Status> failure_;
};

Status MpiWork::Wait() {
  if (!status_) {
    const bool completed = WaitUntil(op_->request, op_->start + comm_->timeout());
    status_ = comm_->Finished(*op_, completed);
  }
  return *status_;
}

}  // namespace

Result<std::unique_ptr<Comm>> CreateMpiComm(MPI_Comm world, Store& store, const std::string& prefix,
                                            int rank, int size, std::vector<int> global_ranks,
                                            milliseconds timeout) {
  CheckMembership(rank, size, global_ranks, timeout);
  const std::vector<int> members = global_ranks;
  auto comm =
      std::make_unique<MpiComm>(store, prefix, rank, size, std::move(global_ranks), timeout);
  // MPI_Comm_create_group has no deadline: it starts only once every member is known to be
  // here.
  DT_RETURN_IF_ERROR(comm->roll_call().Arrive());
  MPI_Group world_group, group;
  DT_MPI(MPI_Comm_group(world, &world_group));
  DT_MPI(MPI_Group_incl(world_group, size, members.data(), &group));
  MPI_Comm made = MPI_COMM_NULL;
  DT_MPI(MPI_Comm_create_group(world, group, /*tag=*/0, &made));
  DT_MPI(MPI_Group_free(&group));
  DT_MPI(MPI_Group_free(&world_group));
  int made_rank = -1;
  DT_MPI(MPI_Comm_rank(made, &made_rank));
  DT_CHECK(made_rank == rank, "{}: MPI made rank {} of rank {}", prefix, made_rank, rank);
  comm->set_comm(made);
  return std::unique_ptr<Comm>(std::move(comm));
}

}  // namespace difftrain::parallel
