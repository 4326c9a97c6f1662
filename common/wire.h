// The control-plane wire protocol: every message between the controller, the worker
// daemons and the ranks' store clients. docs/protocol.md is the specification.
//
// One ZeroMQ frame per message:
//
//   offset 0  "DT"             magic
//          2  version (u8)     kWireVersion
//          3  type (u8)        MessageType
//          4  header length    u32, little-endian, at most kMaxHeaderBytes
//          8  header           a JSON object, the fields of the type (validated)
//          8+header length     payload: raw bytes (a store value, the job file), may be empty
//
// Decode checks all of it (size, magic, version, type, the header's fields, their types
// and ranges) before anyone reads a field, so handlers may use the fields directly. A
// message that fails is dropped by the receiver and counted; it never reaches a handler.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace difftrain::wire {

// 2 (2026-11-30): a heartbeat's ranks carry flops_per_second. A field added or removed is a new
// version: the decoder refuses unknown and missing fields.
inline constexpr uint8_t kWireVersion = 2;
inline constexpr size_t kFixedHeaderBytes = 8;
inline constexpr size_t kMaxHeaderBytes = 256 << 10;  // 256 KiB of JSON
inline constexpr size_t kMaxMessageBytes = 4 << 20;   // the whole frame
inline constexpr size_t kMaxKeyBytes = 1024;          // a store key
inline constexpr size_t kMaxNameBytes = 255;          // a node name
inline constexpr int kMaxRanksPerNode = 4096;

enum class MessageType : uint8_t {
  // worker daemon -> controller
  kRegister = 1,  // node, devices, gpus, cores, memory_bytes, pid
  kHeartbeat =
      2,  // node, attempt, ranks: [{rank, pid, step, loss, step_seconds, samples_per_second,
          //   compute_seconds}]
  kRankExit = 3,  // attempt, rank, exit_code, signal
  kStopped = 4,   // attempt: every rank of this node has exited
  // controller -> worker daemon
  kRegistered = 10,    // node, job, heartbeat_ms, timeout_ms
  kLaunch = 11,        // attempt, world, ranks: [{rank, local_rank, device}]; payload: job YAML
  kStop = 12,          // attempt, mode: "kill" | "checkpoint"
  kShutdown = 13,      // exit_code: the job is over
  kHeartbeatAck = 14,  // (no fields)
  // rank store client -> controller, and the reply
  kStoreSet = 20,    // id, key; payload: value
  kStoreGet = 21,    // id, key, timeout_ms
  kStoreAdd = 22,    // id, key, delta
  kStoreReply = 23,  // id, ok, error, number; payload: value (get)
};

// "register", "store-get", ... ("unknown(N)" for a number that is no type).
std::string_view TypeName(MessageType type);

struct Message {
  MessageType type{};
  nlohmann::json header = nlohmann::json::object();
  std::string payload;
};

// The frame of `message`. The header must hold the type's fields (a programming error
// otherwise: it fails fast), so what one side encodes the other always decodes.
std::string Encode(const Message& message);

// The message in `frame`, or why it is not one (which the receiver logs and counts).
Result<Message> Decode(std::string_view frame);

// Why a frame was refused, for counting: "oversized", "malformed", "version", "type",
// "fields".
std::string_view DropReason(const Status& decode_error);

}  // namespace difftrain::wire
