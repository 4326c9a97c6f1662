// Communicators: one per process group (tp, cp, dp, pp, ...) in every rank of the group.
//
// A Comm moves float32 buffers between the ranks of its group. Ranks given to it (root,
// dst, src) are group ranks, 0..size()-1; error messages name global ranks. Collectives
// (everything but Send/Recv) must be issued by every rank of the group, in the same
// order, with the same element counts, reduce op and root: a collective is matched with
// its peers by its position in that sequence. Ops on one Comm run one at a time, in
// issue order; the asynchronous forms return at once so that the caller computes while
// the op runs (a gradient bucket reduces while backward continues).
//
// Failure: an op that does not complete within the communicator's timeout returns an
// error naming the group, the op and the ranks that did not take part; it never hangs.
// After any error the communicator is broken and every later op returns that error at
// once: recovery is a restart of all ranks with new communicators, never a retry.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace difftrain::parallel {

enum class ReduceOp {
  kSum,
  kAvg,  // the sum divided by the group size
};

// The handle of an asynchronous op. Until Wait returns, the op may still read or write
// the buffers it was given, so the handle's destructor waits too.
class CommWork {
 public:
  virtual ~CommWork() = default;
  // Blocks until the op has finished and returns its Status (the same on every call).
  virtual Status Wait() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group as it appears in messages, e.g. "dp[0,2]" (see GroupName).
  virtual const std::string& name() const = 0;

  // data[0..n) becomes the reduction of every rank's data.
  virtual std::unique_ptr<CommWork> AllReduceAsync(float* data, size_t n, ReduceOp op) = 0;
  // in holds size()·n_per_rank elements; out[0..n_per_rank) becomes the reduction of
  // chunk rank() of every rank's in. out may be in + rank()·n_per_rank.
  virtual std::unique_ptr<CommWork> ReduceScatterAsync(const float* in, float* out,
                                                       size_t n_per_rank, ReduceOp op) = 0;
  // out holds size()·n_per_rank elements; chunk q of out becomes rank q's in. in may be
  // out + rank()·n_per_rank (in place).
  virtual std::unique_ptr<CommWork> AllGatherAsync(const float* in, float* out,
                                                   size_t n_per_rank) = 0;
  // data[0..n) becomes rank root's data.
  virtual std::unique_ptr<CommWork> BroadcastAsync(float* data, size_t n, int root) = 0;
  // Point to point: a Send to dst matches the Recv from this rank that dst issues in the
  // same position among its Recvs from this rank, and the two must agree on n. Posting
  // does not wait for the peer, so both halves of an exchange can be in flight together.
  virtual std::unique_ptr<CommWork> SendAsync(const float* data, size_t n, int dst) = 0;
  virtual std::unique_ptr<CommWork> RecvAsync(float* data, size_t n, int src) = 0;
  // Returns once every rank of the group has entered the barrier.
  virtual std::unique_ptr<CommWork> BarrierAsync() = 0;

  // The blocking forms: the op, then Wait.
  Status AllReduce(float* data, size_t n, ReduceOp op) {
    return AllReduceAsync(data, n, op)->Wait();
  }
  Status ReduceScatter(const float* in, float* out, size_t n_per_rank, ReduceOp op) {
    return ReduceScatterAsync(in, out, n_per_rank, op)->Wait();
  }
  Status AllGather(const float* in, float* out, size_t n_per_rank) {
    return AllGatherAsync(in, out, n_per_rank)->Wait();
  }
  Status Broadcast(float* data, size_t n, int root) {
    return BroadcastAsync(data, n, root)->Wait();
  }
  Status Send(const float* data, size_t n, int dst) { return SendAsync(data, n, dst)->Wait(); }
  Status Recv(float* data, size_t n, int src) { return RecvAsync(data, n, src)->Wait(); }
  Status Barrier() { return BarrierAsync()->Wait(); }

 protected:
  // For the backends: fail fast on arguments the ops above do not allow.
  void CheckReduceScatterBuffers(const float* in, const float* out, size_t n_per_rank) const;
  void CheckAllGatherBuffers(const float* in, const float* out, size_t n_per_rank) const;
  void CheckRoot(int root) const;
  void CheckPeer(int peer) const;  // a group rank other than this one
};

// For the backends' Create functions: fail fast on a membership that cannot be.
void CheckMembership(int rank, int size, const std::vector<int>& global_ranks,
                     std::chrono::milliseconds timeout);

// The name of a group: its token and its global ranks, "dp[0,2]". Long arithmetic
// progressions are shortened to their first two and last member, "dp[0,8,..,1016]",
// which still names exactly one set. Being unique within a job attempt and readable,
// the name is both the last component of a communicator's store prefix
// ("job/attempt/dp[0,2]") and the group in its error messages.
std::string GroupName(std::string_view token, const std::vector<int>& global_ranks);

}  // namespace difftrain::parallel
