#include "worker/store_client.h"

#include <atomic>
#include <mutex>
#include <vector>

#include <zmq.hpp>

#include "common/curve.h"
#include "common/wire.h"

namespace difftrain::worker {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using wire::Message;
using wire::MessageType;

// How long past its own timeout a request waits for the controller's answer.
constexpr milliseconds kReplyGrace(30'000);

// Thread-safe: several threads of a rank (the trainer, a roll call's publisher) use the
// store at once. Each request takes an idle DEALER socket from a pool (opening one when
// none is idle), so a blocking get never holds up a set from another thread.
class ZmqStore final : public parallel::Store {
 public:
  ZmqStore(std::string address, CurveKeys keys)
      : context_(1), address_(std::move(address)), keys_(std::move(keys)) {}

  ~ZmqStore() override {
    idle_.clear();
    context_.close();
  }

  Status Set(const std::string& key, std::vector<char> value) override {
    DT_ASSIGN_OR_RETURN(Message reply,
                        Request(MessageType::kStoreSet, {{"key", key}},
                                std::string(value.begin(), value.end()), milliseconds(0)));
    return Check(reply, "set", key);
  }

  Result<std::vector<char>> Get(const std::string& key, milliseconds timeout) override {
    DT_ASSIGN_OR_RETURN(Message reply,
                        Request(MessageType::kStoreGet,
                                {{"key", key}, {"timeout_ms", timeout.count()}}, "", timeout));
    if (!reply.header["ok"].get<bool>() && reply.header["error"] == "timed out") {
      return Errorf("store key '{}' did not appear within {} ms", key, timeout.count());
    }
    DT_RETURN_IF_ERROR(Check(reply, "get", key));
    return std::vector<char>(reply.payload.begin(), reply.payload.end());
  }

  Status Wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      const auto left = std::max(milliseconds(0),
                                 std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      Result<std::vector<char>> value = Get(key, left);
      if (!value.ok()) missing.push_back(key);
    }
    if (missing.empty()) return Status::Ok();
    std::string names;
    for (const std::string& k : missing)
      names += (names.empty() ? "" : ", ") + k;
    return Errorf("store keys still missing after {} ms: {}", timeout.count(), names);
  }

  Result<int64_t> Add(const std::string& key, int64_t delta) override {
    DT_ASSIGN_OR_RETURN(
        Message reply,
        Request(MessageType::kStoreAdd, {{"key", key}, {"delta", delta}}, "", milliseconds(0)));
    DT_RETURN_IF_ERROR(Check(reply, "add", key));
    return reply.header["number"].get<int64_t>();
  }

 private:
  static Status Check(const Message& reply, const char* op, const std::string& key) {
    if (reply.header["ok"].get<bool>()) return Status::Ok();
    return Errorf("store {} '{}': {}", op, key, reply.header["error"].get<std::string>());
  }

  std::unique_ptr<zmq::socket_t> TakeSocket() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        std::unique_ptr<zmq::socket_t> s = std::move(idle_.back());
        idle_.pop_back();
        return s;
      }
    }
    auto s = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    s->set(zmq::sockopt::linger, 0);
    MakeCurveClient(*s, keys_);
    s->connect(address_);
    return s;
  }

  void ReturnSocket(std::unique_ptr<zmq::socket_t> s) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(s));
  }

  Result<Message> Request(MessageType type, nlohmann::json header, std::string payload,
                          milliseconds timeout) {
    const int64_t id = next_id_.fetch_add(1);
    header["id"] = id;
    std::unique_ptr<zmq::socket_t> s = TakeSocket();
    const std::string frame = wire::Encode({type, std::move(header), std::move(payload)});
    s->send(zmq::buffer(frame), zmq::send_flags::none);
    const Clock::time_point deadline = Clock::now() + timeout + kReplyGrace;
    while (true) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      zmq::pollitem_t item{s->handle(), 0, ZMQ_POLLIN, 0};
      if (left <= 0) {
        // The socket may still receive the late answer: drop it rather than reuse it.
        return Errorf("the controller's store at {} did not answer a {} within {} ms", address_,
                      wire::TypeName(type), (timeout + kReplyGrace).count());
      }
      if (PollIgnoringSignals(&item, 1, milliseconds(left)) == 0) continue;
      zmq::message_t msg;
      if (!s->recv(msg, zmq::recv_flags::dontwait)) continue;
      Result<Message> reply = wire::Decode(msg.to_string_view());
      if (!reply.ok() || reply->type != MessageType::kStoreReply ||
          reply->header["id"].get<int64_t>() != id) {
        continue;  // not the answer to this request
      }
      ReturnSocket(std::move(s));
      return reply;
    }
  }

  zmq::context_t context_;
  const std::string address_;
  const CurveKeys keys_;
  std::atomic<int64_t> next_id_{1};
  std::mutex mu_;
  std::vector<std::unique_ptr<zmq::socket_t>> idle_;
};

}  // namespace

Result<std::unique_ptr<parallel::Store>> OpenStore(const std::string& address,
                                                   const std::string& keys_dir) {
  if (address.rfind("tcp://", 0) == 0 || address.rfind("ipc://", 0) == 0) {
    if (keys_dir.empty()) {
      return Errorf("the store {} needs the job's keys (DIFFTRAIN_KEYS)", address);
    }
    DT_ASSIGN_OR_RETURN(CurveKeys keys, ReadKeys(keys_dir));
    return std::unique_ptr<parallel::Store>(std::make_unique<ZmqStore>(address, std::move(keys)));
  }
  DT_ASSIGN_OR_RETURN(parallel::FileStore store, parallel::FileStore::Open(address));
  return std::unique_ptr<parallel::Store>(std::make_unique<parallel::FileStore>(std::move(store)));
}

}  // namespace difftrain::worker
