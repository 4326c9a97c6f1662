#include "controller/store_server.h"

#include <charconv>

namespace difftrain::controller {

using wire::Message;
using wire::MessageType;

Message StoreServer::Reply(int64_t id, bool ok, std::string error, int64_t number,
                           std::string value) {
  Message m{MessageType::kStoreReply,
            {{"id", id}, {"ok", ok}, {"error", std::move(error)}, {"number", number}},
            std::move(value)};
  return m;
}

void StoreServer::Set(const std::string& key, std::string value, std::vector<Outgoing>& out) {
  auto [it, inserted] = values_.try_emplace(key);
  if (!inserted) bytes_ -= it->second.size();
  if (inserted) bytes_ += key.size();
  bytes_ += value.size();
  it->second = std::move(value);
  auto [first, last] = waiters_.equal_range(key);
  for (auto w = first; w != last; ++w) {
    out.push_back({w->second.peer, Reply(w->second.id, true, "", 0, it->second)});
  }
  waiters_.erase(first, last);
}

void StoreServer::Publish(const std::string& key, std::string value, std::vector<Outgoing>& out) {
  Set(key, std::move(value), out);
}

void StoreServer::Handle(const std::string& peer, const Message& request, Clock::time_point now,
                         std::vector<Outgoing>& out) {
  const int64_t id = request.header["id"].get<int64_t>();
  const std::string& key = request.header["key"].get_ref<const std::string&>();
  if (request.type != MessageType::kStoreGet && key.starts_with(kControllerPrefix)) {
    out.push_back({peer, Reply(id, false, fmt::format("'{}' is the controller's key", key))});
    return;
  }
  switch (request.type) {
    case MessageType::kStoreSet: {
      auto it = values_.find(key);
      const size_t old = it == values_.end() ? 0 : it->second.size() + key.size();
      if (bytes_ - old + key.size() + request.payload.size() > max_bytes_) {
        out.push_back(
            {peer, Reply(id, false, fmt::format("the store is full ({} bytes)", max_bytes_))});
        return;
      }
      Set(key, request.payload, out);
      out.push_back({peer, Reply(id, true, "")});
      return;
    }
    case MessageType::kStoreGet: {
      auto it = values_.find(key);
      if (it != values_.end()) {
        out.push_back({peer, Reply(id, true, "", 0, it->second)});
        return;
      }
      const auto timeout = std::chrono::milliseconds(request.header["timeout_ms"].get<int64_t>());
      if (timeout.count() == 0) {
        out.push_back({peer, Reply(id, false, "no such key")});
        return;
      }
      waiters_.emplace(key, Waiter{peer, id, now + timeout});
      deadlines_.emplace(now + timeout, key);
      return;
    }
    case MessageType::kStoreAdd: {
      int64_t value = 0;
      auto it = values_.find(key);
      if (it != values_.end()) {
        const std::string& s = it->second;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
        if (ec != std::errc() || end != s.data() + s.size()) {
          out.push_back({peer, Reply(id, false, "the key holds no counter")});
          return;
        }
      }
      value += request.header["delta"].get<int64_t>();
      Set(key, std::to_string(value), out);
      out.push_back({peer, Reply(id, true, "", value)});
      return;
    }
    default:
      return;  // the caller routes only store requests here
  }
}

void StoreServer::Expire(Clock::time_point now, std::vector<Outgoing>& out) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const std::string key = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    auto [first, last] = waiters_.equal_range(key);
    for (auto w = first; w != last;) {
      if (w->second.deadline <= now) {
        out.push_back({w->second.peer, Reply(w->second.id, false, "timed out")});
        w = waiters_.erase(w);
      } else {
        ++w;
      }
    }
  }
}

}  // namespace difftrain::controller
