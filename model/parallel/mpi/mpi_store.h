// The rendezvous store (model/parallel/store.h) of an MPI job: rank 0 keeps the keys and a
// thread of its own answers the other ranks' requests, which travel as MPI messages on a
// communicator of the store's own. Replaces the controller's store when there is no
// controller (mpirun, srun --mpi=pmix); needs MPI_THREAD_MULTIPLE.
#pragma once

#include <mpi.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "model/parallel/store.h"

namespace difftrain::parallel {

class MpiStore final : public Store {
 public:
  // Collective over `world` (it duplicates it). Rank 0 starts serving at once.
  explicit MpiStore(MPI_Comm world);
  // Stops serving. Every rank must be done with the store (see Close).
  ~MpiStore() override;

  // Waits (at most until `deadline`) until every rank has called Close, so that rank 0 stops
  // serving only once nobody needs it. False when some rank did not come in time.
  bool Close(std::chrono::steady_clock::time_point deadline);

  Status Set(const std::string& key, std::vector<char> value) override;
  Result<std::vector<char>> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  enum class Op : char { kSet = 's', kGet = 'g', kAdd = 'a' };
  // One request's answer: whether the key exists, and its value (the new counter for kAdd).
  struct Answer {
    bool found = false;
    std::vector<char> value;
  };

  // On rank 0 straight from the keys, elsewhere a round trip to rank 0.
  Answer Request(Op op, const std::string& key, const std::vector<char>& value);
  Answer Apply(Op op, const std::string& key, const std::vector<char>& value);
  void Serve();
  // The value of `key`, polling until `deadline`.
  std::optional<std::vector<char>> Poll(const std::string& key,
                                        std::chrono::steady_clock::time_point deadline);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::mutex keys_mu_;  // rank 0: the keys, read by the serving thread and this rank's calls
  std::map<std::string, std::vector<char>> keys_;
  std::mutex request_mu_;  // one round trip at a time, so that answers match requests
  std::atomic<bool> stopping_{false};
  std::thread server_;  // rank 0 only
};

}  // namespace difftrain::parallel
