// Seconds a rank spends blocked in communication, by group and op: a Comm that forwards every op to
// the communicator it wraps and adds the time its caller waited (in the op's call and in Wait) to a
// CommTimes. The time an asynchronous op runs while the caller computes is not counted: it costs
// nothing. Exported as difftrain_rank_comm_seconds_total{group, op} (docs/metrics.md).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "model/parallel/comm.h"

namespace difftrain::parallel {

// Seconds by group ("dp", "tp", "world", …: the communicator's name up to '[') and op
// ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier").
// Thread-safe: ops may be issued and waited on from several threads.
class CommTimes {
 public:
  using Table = std::map<std::string, std::map<std::string, double>>;

  void Add(const std::string& group, const char* op, double seconds);
  // What was added since the last call, and starts over.
  Table Take();

 private:
  std::mutex mutex_;
  Table seconds_;
};

// `inner`, with the caller's waiting time added to `times` (which must outlive it).
std::unique_ptr<Comm> TimeComm(std::unique_ptr<Comm> inner, CommTimes& times);

}  // namespace difftrain::parallel
