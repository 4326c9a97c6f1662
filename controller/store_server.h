// The rendezvous store the controller serves to the ranks (model/parallel/store.h over
// the wire): set, blocking get, add. A get of a missing key waits in the server, not in
// a polling client, so thousands of ranks waiting cost nothing until the key is set.
// Wait(keys) is a get of each key on the client side.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/wire.h"

namespace difftrain::controller {

// A message for one peer (a ROUTER routing id).
struct Outgoing {
  std::string peer;
  wire::Message message;
};

class StoreServer {
 public:
  using Clock = std::chrono::steady_clock;

  // Everything the store may hold, values and keys: a rank that writes more gets errors,
  // the controller keeps its memory.
  static constexpr size_t kMaxBytes = size_t{1} << 30;

  explicit StoreServer(size_t max_bytes = kMaxBytes) : max_bytes_(max_bytes) {}

  // Handles a store-set / store-get / store-add from `peer`; replies go to `out`, now or
  // (a get of a missing key) when the key is set or the get times out.
  void Handle(const std::string& peer, const wire::Message& request, Clock::time_point now,
              std::vector<Outgoing>& out);
  // Sets a key only the controller writes (under kControllerPrefix): ranks read it, and a
  // rank's set or add of such a key is refused.
  void Publish(const std::string& key, std::string value, std::vector<Outgoing>& out);
  static constexpr std::string_view kControllerPrefix = "controller/";

  // Answers the gets whose timeout has passed.
  void Expire(Clock::time_point now, std::vector<Outgoing>& out);

  size_t keys() const { return values_.size(); }
  size_t waiting() const { return waiters_.size(); }

 private:
  struct Waiter {
    std::string peer;
    int64_t id;
    Clock::time_point deadline;
  };

  static wire::Message Reply(int64_t id, bool ok, std::string error, int64_t number = 0,
                             std::string value = "");
  void Set(const std::string& key, std::string value, std::vector<Outgoing>& out);

  std::unordered_map<std::string, std::string> values_;
  std::unordered_multimap<std::string, Waiter> waiters_;
  std::multimap<Clock::time_point, std::string> deadlines_;  // deadline -> key with waiters
  size_t max_bytes_;
  size_t bytes_ = 0;
};

}  // namespace difftrain::controller
