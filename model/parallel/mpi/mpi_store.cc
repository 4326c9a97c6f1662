#include "model/parallel/mpi/mpi_store.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "model/parallel/mpi/mpi_request.h"

namespace difftrain::parallel {
namespace {

using std::chrono::milliseconds;

constexpr int kRequestTag = 1;
constexpr int kAnswerTag = 2;

// A request: the op, the key's length (4 bytes), the key, then the value.
std::vector<char> EncodeRequest(char op, const std::string& key, const std::vector<char>& value) {
  const auto key_size = static_cast<uint32_t>(key.size());
  std::vector<char> bytes(1 + sizeof key_size + key.size() + value.size());
  char* at = bytes.data();
  *at++ = op;
  std::memcpy(at, &key_size, sizeof key_size);
  at += sizeof key_size;
  std::memcpy(at, key.data(), key.size());
  if (!value.empty()) std::memcpy(at + key.size(), value.data(), value.size());
  return bytes;
}

// The whole of one message whose arrival MPI_Improbe reported.
std::vector<char> Receive(MPI_Message& message, const MPI_Status& status) {
  int count = 0;
  DT_MPI(MPI_Get_count(&status, MPI_CHAR, &count));
  std::vector<char> bytes(static_cast<size_t>(count));
  DT_MPI(MPI_Mrecv(bytes.data(), count, MPI_CHAR, &message, MPI_STATUS_IGNORE));
  return bytes;
}

void SendBytes(const std::vector<char>& bytes, int dst, int tag, MPI_Comm comm) {
  DT_MPI(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_CHAR, dst, tag, comm));
}

std::vector<char> CounterBytes(int64_t n) {
  std::vector<char> bytes(sizeof n);
  std::memcpy(bytes.data(), &n, sizeof n);
  return bytes;
}

}  // namespace

MpiStore::MpiStore(MPI_Comm world) {
  DT_MPI(MPI_Comm_dup(world, &comm_));
  DT_MPI(MPI_Comm_rank(comm_, &rank_));
  if (rank_ == 0) server_ = std::thread([this] { Serve(); });
}

MpiStore::~MpiStore() {
  stopping_ = true;
  if (server_.joinable()) server_.join();
}

bool MpiStore::Close(std::chrono::steady_clock::time_point deadline) {
  MPI_Request barrier;
  DT_MPI(MPI_Ibarrier(comm_, &barrier));
  return WaitUntil(barrier, deadline);
}

// Rank 0's thread: one request at a time, answered before the next is read.
void MpiStore::Serve() {
  while (!stopping_) {
    int arrived = 0;
    MPI_Message message;
    MPI_Status status;
    DT_MPI(MPI_Improbe(MPI_ANY_SOURCE, kRequestTag, comm_, &arrived, &message, &status));
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    const std::vector<char> request = Receive(message, status);
    uint32_t key_size = 0;
    DT_CHECK(request.size() >= 1 + sizeof key_size, "a store request of {} bytes", request.size());
    std::memcpy(&key_size, request.data() + 1, sizeof key_size);
    const char* key = request.data() + 1 + sizeof key_size;
    DT_CHECK(request.size() >= 1 + sizeof key_size + key_size, "a store key past its request");
    const Answer answer = Apply(static_cast<Op>(request[0]), std::string(key, key_size),
                                std::vector<char>(key + key_size, request.data() + request.size()));
    std::vector<char> reply{answer.found ? '1' : '0'};
    reply.insert(reply.end(), answer.value.begin(), answer.value.end());
    SendBytes(reply, status.MPI_SOURCE, kAnswerTag, comm_);
  }
}

MpiStore::Answer MpiStore::Apply(Op op, const std::string& key, const std::vector<char>& value) {
  std::lock_guard<std::mutex> lock(keys_mu_);
  switch (op) {
    case Op::kSet:
      keys_[key] = value;
      return {true, {}};
    case Op::kGet: {
      auto it = keys_.find(key);
      if (it == keys_.end()) return {false, {}};
      return {true, it->second};
    }
    case Op::kAdd: {
      int64_t delta = 0;
      DT_CHECK(value.size() == sizeof delta, "an add of {} bytes", value.size());
      std::memcpy(&delta, value.data(), sizeof delta);
      std::vector<char>& counter = keys_[key];
      const int64_t now =
          (counter.empty() ? 0 : std::stoll(std::string(counter.begin(), counter.end()))) + delta;
      const std::string text = std::to_string(now);
      counter.assign(text.begin(), text.end());
      return {true, CounterBytes(now)};
    }
  }
  DT_CHECK(false, "unknown store op '{}'", static_cast<char>(op));
  return {};
}

MpiStore::Answer MpiStore::Request(Op op, const std::string& key, const std::vector<char>& value) {
  if (rank_ == 0) return Apply(op, key, value);
  std::lock_guard<std::mutex> lock(request_mu_);
  SendBytes(EncodeRequest(static_cast<char>(op), key, value), 0, kRequestTag, comm_);
  MPI_Message message;
  MPI_Status status;
  DT_MPI(MPI_Mprobe(0, kAnswerTag, comm_, &message, &status));
  const std::vector<char> reply = Receive(message, status);
  DT_CHECK(!reply.empty(), "an empty store answer");
  return {reply[0] == '1', std::vector<char>(reply.begin() + 1, reply.end())};
}

std::optional<std::vector<char>> MpiStore::Poll(const std::string& key,
                                                std::chrono::steady_clock::time_point deadline) {
  milliseconds pause(1);
  while (true) {
    Answer answer = Request(Op::kGet, key, {});
    if (answer.found) return std::move(answer.value);
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(20));
  }
}

Status MpiStore::Set(const std::string& key, std::vector<char> value) {
  Request(Op::kSet, key, value);
  return Status::Ok();
}

Result<std::vector<char>> MpiStore::Get(const std::string& key, milliseconds timeout) {
  std::optional<std::vector<char>> value = Poll(key, std::chrono::steady_clock::now() + timeout);
  if (!value) return Errorf("store key '{}' did not appear within {} ms", key, timeout.count());
  return std::move(*value);
}

Status MpiStore::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!Poll(key, deadline)) missing.push_back(key);
  }
  if (missing.empty()) return Status::Ok();
  return Errorf("store keys {} did not appear within {} ms", fmt::join(missing, ", "),
                timeout.count());
}

Result<int64_t> MpiStore::Add(const std::string& key, int64_t delta) {
  const Answer answer = Request(Op::kAdd, key, CounterBytes(delta));
  int64_t now = 0;
  std::memcpy(&now, answer.value.data(), sizeof now);
  return now;
}

}  // namespace difftrain::parallel
