#include "model/parallel/gloo_comm.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/check.h"
#include "model/parallel/roll_call.h"

namespace difftrain::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

// Gloo's collectives use slot prefixes 0x01-0x08; our own transfers keep clear of them.
constexpr uint8_t kSendRecvSlotPrefix = 0x40;
constexpr uint8_t kReduceScatterSlotPrefix = 0x41;

milliseconds Since(Clock::time_point start) {
  return duration_cast<milliseconds>(Clock::now() - start);
}

// Gloo reads a zero timeout as "none", so an expired deadline still waits one millisecond.
milliseconds Remaining(Clock::time_point deadline) {
  return std::max(milliseconds(1), duration_cast<milliseconds>(deadline - Clock::now()));
}

// Lets Gloo's rendezvous use our Store. Gloo reports store failures by exception.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(parallel::Store& store, milliseconds timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(key, data));
  }
  // Gloo's connectFullMesh calls get without waiting for the key first: Get blocks.
  std::vector<char> get(const std::string& key) override {
    Result<std::vector<char>> value = store_.Get(key, timeout_);
    Check(value.status());
    return std::move(value).value();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    Check(store_.Wait(keys, timeout));
  }

 private:
  static void Check(const Status& status) {
    if (!status.ok()) throw gloo::IoException(status.message());
  }

  parallel::Store& store_;
  milliseconds timeout_;
};

// The first error of a communicator. Shared with the handles of send/recv ops, which
// finish on the waiting thread and may outlive the communicator.
class Health {
 public:
  void Fail(const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) failure_ = status;
  }
  std::optional<Status> failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  mutable std::mutex mu_;
  std::optional<Status> failure_;
};

// The completion of one op, shared by its handle and by whoever finishes the op: the
// background thread for collectives, the waiting thread for send/recv.
class OpState {
 public:
  void Finish(Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(status);
    }
    cv_.notify_all();
  }
  // The op is posted; `finish` waits for it on the thread that calls Wait.
  void FinishInWaiter(std::function<Status()> finish) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiter_finish_ = std::move(finish);
    }
    cv_.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return status_.has_value() || waiter_finish_ != nullptr; });
    if (!status_) {
      std::function<Status()> finish = std::move(waiter_finish_);
      waiter_finish_ = nullptr;
      lock.unlock();
      Status status = finish();
      lock.lock();
      status_ = std::move(status);
      cv_.notify_all();
    }
    return *status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Status> status_;
  std::function<Status()> waiter_finish_;
};

class GlooWork final : public CommWork {
 public:
  explicit GlooWork(std::shared_ptr<OpState> state) : state_(std::move(state)) {}
  ~GlooWork() override { (void)state_->Wait(); }
  Status Wait() override { return state_->Wait(); }

 private:
  std::shared_ptr<OpState> state_;
};

// Gloo writes to its sockets without MSG_NOSIGNAL, so when a peer dies the next write
// would kill this process with SIGPIPE instead of failing the op with EPIPE, and a
// single lost rank would take its neighbours down before they could report it. Unless
// the process has its own handler, SIGPIPE is ignored from the first communicator on.
void IgnoreSigpipe() {
  struct sigaction current;
  ::sigaction(SIGPIPE, nullptr, &current);
  if (current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

std::unique_ptr<CommWork> Done() {
  auto state = std::make_shared<OpState>();
  state->Finish(Status::Ok());
  return std::make_unique<GlooWork>(std::move(state));
}

void Scale(float* data, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) {
    data[i] *= factor;
  }
}

class GlooComm final : public Comm {
 public:
  GlooComm(Store& store, const std::string& prefix, int rank, int size,
           std::vector<int> global_ranks, milliseconds timeout)
      : store_(store, prefix),
        name_(prefix.substr(prefix.rfind('/') + 1)),
        rank_(rank),
        size_(size),
        global_ranks_(std::move(global_ranks)),
        timeout_(timeout),
        roll_call_(store_, name_, rank, global_ranks_, timeout),
        sends_to_(size, 0),
        recvs_from_(size, 0),
        thread_([this] { Loop(); }) {}

  ~GlooComm() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Status Connect(const std::string& hostname);

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

 private:
  using Run = std::function<void(OpState&)>;
  // A collective's transfer; `tag` is the same on every rank. Throws Gloo's exceptions.
  using Body = std::function<void(uint32_t tag)>;
  struct Task {
    std::string op;
    std::shared_ptr<OpState> state;
    Run run;
  };

  std::unique_ptr<CommWork> Enqueue(std::string op, Run run);
  std::unique_ptr<CommWork> EnqueueCollective(std::string op, size_t n, Body body);
  std::unique_ptr<CommWork> EnqueuePointToPoint(bool send, float* data, size_t n, int peer);
  void Loop();
  Status RunCollective(const std::string& op, size_t n, const Body& body);
  void RingReduceScatter(const float* in, float* out, size_t n_per_rank, uint32_t tag);

  PrefixStore store_;
  const std::string name_;
  const int rank_;
  const int size_;
  const std::vector<int> global_ranks_;
  const milliseconds timeout_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  RollCall roll_call_;

  // Used only by the background thread, which runs one op at a time.
  int64_t collective_seq_ = 0;
  std::vector<uint32_t> sends_to_;    // per peer: sends posted, for matching slots
  std::vector<uint32_t> recvs_from_;  // per peer: receives posted
  std::vector<float> scratch_;        // the ring reduce-scatter's accumulator

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: it starts running in the constructor
};

Status GlooComm::Connect(const std::string& hostname) {
  // Every rank must be there before Gloo starts connecting: Gloo's own timeout error
  // would say neither which group it was nor which ranks never came.
  DT_RETURN_IF_ERROR(roll_call_.Arrive());
  const int me = global_ranks_[rank_];
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout_);
    PrefixStore gloo_keys(store_, "gloo");
    GlooStore adapter(gloo_keys, timeout_);
    context->connectFullMesh(adapter, device);
    // connectFullMesh can return on one rank while a peer is still finishing its
    // handshake; had this rank then closed its sockets, the peer's creation would fail.
    // After a barrier every pair is up on both sides. Tag 0: collectives count from 1.
    gloo::BarrierOptions connected(context);
    connected.setTag(0);
    connected.setTimeout(timeout_);
    gloo::barrier(connected);
    context_ = std::move(context);
  } catch (const gloo::Exception& e) {
    return Errorf("{}: rendezvous of rank {} on '{}': {}", name_, me, hostname, e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return Errorf("{}: rendezvous of rank {} on '{}': {}", name_, me, hostname, e.what());
  }
  return Status::Ok();
}

std::unique_ptr<CommWork> GlooComm::Enqueue(std::string op, Run run) {
  auto state = std::make_shared<OpState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(op), state, std::move(run)});
  }
  cv_.notify_all();
  return std::make_unique<GlooWork>(std::move(state));
}

void GlooComm::Loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        task.state->Finish(Errorf("{}: {} not run: the communicator was closed", name_, task.op));
        continue;
      }
    }
    if (std::optional<Status> failure = health_->failure()) {
      task.state->Finish(Errorf("{}: {} not run: the communicator failed earlier: {}", name_,
                                task.op, failure->message()));
      continue;
    }
    task.run(*task.state);
  }
}

std::unique_ptr<CommWork> GlooComm::EnqueueCollective(std::string op, size_t n, Body body) {
  return Enqueue(op, [this, op, n, body = std::move(body)](OpState& state) {
    Status status = RunCollective(op, n, body);
    if (!status.ok()) health_->Fail(status);
    state.Finish(std::move(status));
  });
}

// Every rank publishes which collectives it has entered and completed, so that when one
// fails the survivors can tell the ranks that never came from those that came and
// vanished, and both from those that merely finished first.
Status GlooComm::RunCollective(const std::string& op, size_t n, const Body& body) {
  const int64_t seq = ++collective_seq_;
  const std::string what =
      n > 0 ? fmt::format("{} #{} ({} floats)", op, seq, n) : fmt::format("{} #{}", op, seq);
  roll_call_.Entered(seq);
  const Clock::time_point start = Clock::now();
  std::string cause;
  try {
    body(static_cast<uint32_t>(seq));
    roll_call_.Completed(seq);
    return Status::Ok();
  } catch (const gloo::Exception& e) {
    cause = e.what();
  } catch (const gloo::EnforceNotMet& e) {
    cause = e.what();
  }
  const milliseconds elapsed = Since(start);
  return Errorf("{}: {} failed on rank {} after {} ms (timeout {} ms); {}; cause: {}", name_, what,
                global_ranks_[rank_], elapsed.count(), timeout_.count(),
                roll_call_.Diagnose(seq, start), cause);
}

std::unique_ptr<CommWork> GlooComm::AllReduceAsync(float* data, size_t n, ReduceOp op) {
  if (n == 0) return Done();
  return EnqueueCollective("all_reduce", n, [this, data, n, op](uint32_t tag) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setReduceFunction(
        [](void* c, const void* a, const void* b, size_t k) { gloo::sum<float>(c, a, b, k); });
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
    if (op == ReduceOp::kAvg) Scale(data, n, 1.0f / static_cast<float>(size_));
  });
}

std::unique_ptr<CommWork> GlooComm::ReduceScatterAsync(const float* in, float* out,
                                                       size_t n_per_rank, ReduceOp op) {
  if (n_per_rank == 0) return Done();
  CheckReduceScatterBuffers(in, out, n_per_rank);
  return EnqueueCollective("reduce_scatter", n_per_rank,
                           [this, in, out, n_per_rank, op](uint32_t tag) {
                             RingReduceScatter(in, out, n_per_rank, tag);
                             if (op == ReduceOp::kAvg) {
                               Scale(out, n_per_rank, 1.0f / static_cast<float>(size_));
                             }
                           });
}

// The bandwidth-optimal ring: in step s every rank adds the chunk its left neighbour
// sends into its accumulator and passes chunk (rank - s - 1) on to the right; after
// size-1 steps chunk `rank` holds the sum of every rank's chunk. Gloo's options API has
// no reduce-scatter, and an all-reduce would move twice the data.
void GlooComm::RingReduceScatter(const float* in, float* out, size_t n, uint32_t tag) {
  const size_t bytes = n * sizeof(float);
  // The accumulator (a copy of in), then room for one incoming chunk.
  scratch_.resize(n * size_ + n);
  std::copy(in, in + n * size_, scratch_.begin());
  float* acc = scratch_.data();
  float* incoming = acc + n * size_;
  if (size_ > 1) {
    std::unique_ptr<gloo::transport::UnboundBuffer> acc_buffer =
        context_->createUnboundBuffer(acc, n * size_ * sizeof(float));
    std::unique_ptr<gloo::transport::UnboundBuffer> incoming_buffer =
        context_->createUnboundBuffer(incoming, bytes);
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    const int right = (rank_ + 1) % size_;
    const int left = (rank_ + size_ - 1) % size_;
    const Clock::time_point deadline = Clock::now() + timeout_;
    for (int step = 0; step < size_ - 1; ++step) {
      const size_t send_chunk = static_cast<size_t>((rank_ - step - 1 + 2 * size_) % size_);
      const size_t recv_chunk = static_cast<size_t>((rank_ - step - 2 + 2 * size_) % size_);
      incoming_buffer->recv(left, slot);
      acc_buffer->send(right, slot, send_chunk * bytes, bytes);
      incoming_buffer->waitRecv(Remaining(deadline));
      float* target = acc + recv_chunk * n;
      for (size_t i = 0; i < n; ++i)
        target[i] += incoming[i];
      acc_buffer->waitSend(Remaining(deadline));
    }
  }
  std::memcpy(out, acc + static_cast<size_t>(rank_) * n, bytes);
}

std::unique_ptr<CommWork> GlooComm::AllGatherAsync(const float* in, float* out, size_t n_per_rank) {
  if (n_per_rank == 0) return Done();
  const float* own = out + static_cast<size_t>(rank_) * n_per_rank;
  CheckAllGatherBuffers(in, out, n_per_rank);
  return EnqueueCollective("all_gather", n_per_rank,
                           [this, in, out, n_per_rank, own](uint32_t tag) {
                             if (size_ == 1) {  // Gloo's ring would wait for sends never made.
                               std::memmove(out, in, n_per_rank * sizeof(float));
                               return;
                             }
                             gloo::AllgatherOptions opts(context_);
                             // Gloo never writes the input; its API just takes it non-const.
                             if (in != own) opts.setInput(const_cast<float*>(in), n_per_rank);
                             opts.setOutput(out, n_per_rank * size_);
                             opts.setTag(tag);
                             opts.setTimeout(timeout_);
                             gloo::allgather(opts);
                           });
}

std::unique_ptr<CommWork> GlooComm::BroadcastAsync(float* data, size_t n, int root) {
  CheckRoot(root);
  if (n == 0) return Done();
  return EnqueueCollective("broadcast", n, [this, data, n, root](uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, n);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

std::unique_ptr<CommWork> GlooComm::BarrierAsync() {
  return EnqueueCollective("barrier", 0, [this](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

std::unique_ptr<CommWork> GlooComm::SendAsync(const float* data, size_t n, int dst) {
  // Gloo never writes a send buffer; its API just takes it non-const.
  return EnqueuePointToPoint(/*send=*/true, const_cast<float*>(data), n, dst);
}

std::unique_ptr<CommWork> GlooComm::RecvAsync(float* data, size_t n, int src) {
  return EnqueuePointToPoint(/*send=*/false, data, n, src);
}

// The background thread only posts the transfer, in issue order, and the handle's Wait
// waits for it: so a rank can have a send and a receive in flight at once (a pipeline
// stage exchanging with both neighbours) without either blocking the queue.
std::unique_ptr<CommWork> GlooComm::EnqueuePointToPoint(bool send, float* data, size_t n,
                                                        int peer) {
  CheckPeer(peer);
  if (n == 0) return Done();
  const std::string op = send ? "send" : "recv";
  return Enqueue(op, [this, send, data, n, peer, op](OpState& state) {
    const std::string what =
        fmt::format("{}: {} of {} floats {} rank {} on rank {}", name_, op, n, send ? "to" : "from",
                    global_ranks_[peer], global_ranks_[rank_]);
    const Clock::time_point start = Clock::now();
    auto fail = [what, start, health = health_](const std::exception& e) {
      Status status = Errorf("{} failed after {} ms: {}", what, Since(start).count(), e.what());
      health->Fail(status);
      return status;
    };
    std::shared_ptr<gloo::transport::UnboundBuffer> buffer;
    try {
      buffer = context_->createUnboundBuffer(data, n * sizeof(float));
      if (send) {
        buffer->send(peer, gloo::Slot::build(kSendRecvSlotPrefix, sends_to_[peer]++));
      } else {
        buffer->recv(peer, gloo::Slot::build(kSendRecvSlotPrefix, recvs_from_[peer]++));
      }
    } catch (const gloo::Exception& e) {
      state.Finish(fail(e));
      return;
    } catch (const gloo::EnforceNotMet& e) {
      state.Finish(fail(e));
      return;
    }
    const Clock::time_point deadline = start + timeout_;
    state.FinishInWaiter([send, buffer, deadline, fail]() -> Status {
      try {
        if (send) {
          buffer->waitSend(Remaining(deadline));
        } else {
          buffer->waitRecv(Remaining(deadline));
        }
      } catch (const gloo::Exception& e) {
        return fail(e);
      } catch (const gloo::EnforceNotMet& e) {
        return fail(e);
      }
      return Status::Ok();
    });
  });
}

}  // namespace

Result<std::unique_ptr<Comm>> CreateGlooComm(Store& store, const std::string& prefix, int rank,
                                             int size, std::vector<int> global_ranks,
                                             milliseconds timeout, const std::string& hostname) {
  CheckMembership(rank, size, global_ranks, timeout);
  IgnoreSigpipe();
  auto comm =
      std::make_unique<GlooComm>(store, prefix, rank, size, std::move(global_ranks), timeout);
  DT_RETURN_IF_ERROR(comm->Connect(hostname));
  return std::unique_ptr<Comm>(std::move(comm));
}

}  // namespace difftrain::parallel
