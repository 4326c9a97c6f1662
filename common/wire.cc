#include "common/wire.h"

#include <cstring>
#include <limits>
#include <vector>

#include "common/check.h"

namespace difftrain::wire {
namespace {

using nlohmann::json;

// What one header field must be. Integers carry their allowed range; strings their
// largest size; a list of objects its element schema.
struct Field {
  enum Kind { kInt, kNumber, kBool, kString, kObjects };
  const char* name;
  Kind kind;
  int64_t min = 0;
  int64_t max = 0;  // kInt: value range; kString: max bytes; kObjects: max elements
  const std::vector<Field>* elements = nullptr;
};

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

const std::vector<Field> kRankProgress = {
    {"rank", Field::kInt, 0, kMaxInt},    {"pid", Field::kInt, 0, kMaxInt},
    {"step", Field::kInt, -1, kMaxInt64}, {"loss", Field::kNumber},
    {"step_seconds", Field::kNumber},     {"samples_per_second", Field::kNumber},
    {"compute_seconds", Field::kNumber},  {"flops_per_second", Field::kNumber},
};
const std::vector<Field> kRankAssignment = {
    {"rank", Field::kInt, 0, kMaxInt},
    {"local_rank", Field::kInt, 0, kMaxRanksPerNode - 1},
    {"device", Field::kInt, -1, kMaxRanksPerNode - 1},
};

// The fields of each type, in one table: the decoder checks them and the encoder asserts
// them, so the two ends cannot drift apart.
const std::vector<Field>* SchemaOf(MessageType type) {
  static const std::vector<Field> kRegister = {
      {"node", Field::kString, 1, kMaxNameBytes},
      {"devices", Field::kInt, 1, kMaxRanksPerNode},
      {"gpus", Field::kInt, 0, kMaxRanksPerNode},
      {"cores", Field::kInt, 1, 1 << 20},
      {"memory_bytes", Field::kInt, 0, kMaxInt64},
      {"memory_limit", Field::kString, 0, 4096},
      {"pid", Field::kInt, 0, kMaxInt},
      {"gpu_name", Field::kString, 0, kMaxNameBytes},
      {"gpu_memory_bytes", Field::kInt, 0, kMaxInt64},
  };
  static const std::vector<Field> kHeartbeat = {
      {"node", Field::kString, 1, kMaxNameBytes},
      {"attempt", Field::kInt, -1, kMaxInt},
      {"ranks", Field::kObjects, 0, kMaxRanksPerNode, &kRankProgress},
  };
  static const std::vector<Field> kRankExit = {
      {"attempt", Field::kInt, 0, kMaxInt}, {"rank", Field::kInt, 0, kMaxInt},
      {"exit_code", Field::kInt, 0, 255},   {"signal", Field::kInt, 0, 128},
      {"oom_killed", Field::kInt, 0, 1},
  };
  static const std::vector<Field> kAttempt = {{"attempt", Field::kInt, -1, kMaxInt}};
  static const std::vector<Field> kRegistered = {
      {"node", Field::kString, 1, kMaxNameBytes},
      {"job", Field::kString, 0, 1024},
      {"heartbeat_ms", Field::kInt, 1, kMaxInt},
      {"timeout_ms", Field::kInt, 1, kMaxInt},
  };
  static const std::vector<Field> kLaunch = {
      {"attempt", Field::kInt, 0, kMaxInt},
      {"incarnation", Field::kString, 1, 64},
      {"world", Field::kInt, 1, kMaxInt},
      {"ranks", Field::kObjects, 1, kMaxRanksPerNode, &kRankAssignment},
  };
  static const std::vector<Field> kStop = {
      {"attempt", Field::kInt, -1, kMaxInt},
      {"mode", Field::kString, 1, 16},
  };
  static const std::vector<Field> kShutdown = {{"exit_code", Field::kInt, 0, 255}};
  static const std::vector<Field> kNone = {};
  static const std::vector<Field> kStoreSet = {
      {"id", Field::kInt, 0, kMaxInt64},
      {"key", Field::kString, 1, kMaxKeyBytes},
  };
  static const std::vector<Field> kStoreGet = {
      {"id", Field::kInt, 0, kMaxInt64},
      {"key", Field::kString, 1, kMaxKeyBytes},
      {"timeout_ms", Field::kInt, 0, 24LL * 3600 * 1000},
  };
  static const std::vector<Field> kStoreAdd = {
      {"id", Field::kInt, 0, kMaxInt64},
      {"key", Field::kString, 1, kMaxKeyBytes},
      {"delta", Field::kInt, -(int64_t{1} << 53), int64_t{1} << 53},
  };
  static const std::vector<Field> kStoreReply = {
      {"id", Field::kInt, 0, kMaxInt64},
      {"ok", Field::kBool},
      {"error", Field::kString, 0, 4096},
      {"number", Field::kInt, std::numeric_limits<int64_t>::min(), kMaxInt64},
  };
  switch (type) {
    case MessageType::kRegister:
      return &kRegister;
    case MessageType::kHeartbeat:
      return &kHeartbeat;
    case MessageType::kRankExit:
      return &kRankExit;
    case MessageType::kStopped:
      return &kAttempt;
    case MessageType::kRegistered:
      return &kRegistered;
    case MessageType::kLaunch:
      return &kLaunch;
    case MessageType::kStop:
      return &kStop;
    case MessageType::kShutdown:
      return &kShutdown;
    case MessageType::kHeartbeatAck:
      return &kNone;
    case MessageType::kStoreSet:
      return &kStoreSet;
    case MessageType::kStoreGet:
      return &kStoreGet;
    case MessageType::kStoreAdd:
      return &kStoreAdd;
    case MessageType::kStoreReply:
      return &kStoreReply;
  }
  return nullptr;
}

Status CheckFields(const json& object, const std::vector<Field>& schema, const std::string& path);

Status CheckField(const json& value, const Field& f, const std::string& path) {
  switch (f.kind) {
    case Field::kInt: {
      int64_t v = 0;
      if (value.is_number_integer()) {
        if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(kMaxInt64)) {
          return Errorf("fields: {} out of range", path);
        }
        v = value.get<int64_t>();
      } else {
        return Errorf("fields: {} must be an integer", path);
      }
      if (v < f.min || v > f.max) {
        return Errorf("fields: {} = {} outside [{}, {}]", path, v, f.min, f.max);
      }
      return Status::Ok();
    }
    case Field::kNumber:
      if (!value.is_number()) return Errorf("fields: {} must be a number", path);
      return Status::Ok();
    case Field::kBool:
      if (!value.is_boolean()) return Errorf("fields: {} must be true or false", path);
      return Status::Ok();
    case Field::kString: {
      if (!value.is_string()) return Errorf("fields: {} must be a string", path);
      const size_t n = value.get_ref<const std::string&>().size();
      if (n < static_cast<size_t>(f.min) || n > static_cast<size_t>(f.max)) {
        return Errorf("fields: {} has {} bytes, outside [{}, {}]", path, n, f.min, f.max);
      }
      return Status::Ok();
    }
    case Field::kObjects: {
      if (!value.is_array()) return Errorf("fields: {} must be a list", path);
      if (value.size() < static_cast<size_t>(f.min) || value.size() > static_cast<size_t>(f.max)) {
        return Errorf("fields: {} has {} elements, outside [{}, {}]", path, value.size(), f.min,
                      f.max);
      }
      for (size_t i = 0; i < value.size(); ++i) {
        DT_RETURN_IF_ERROR(CheckFields(value[i], *f.elements, fmt::format("{}[{}]", path, i)));
      }
      return Status::Ok();
    }
  }
  return Errorf("fields: {} has no kind", path);
}

// Every schema field present and valid; no other field (an unknown field means the
// sender speaks another protocol, which the version should have said).
Status CheckFields(const json& object, const std::vector<Field>& schema, const std::string& path) {
  if (!object.is_object()) return Errorf("fields: {} must be an object", path);
  for (const Field& f : schema) {
    auto it = object.find(f.name);
    const std::string field = path.empty() ? f.name : path + "." + f.name;
    if (it == object.end()) return Errorf("fields: {} is missing", field);
    DT_RETURN_IF_ERROR(CheckField(*it, f, field));
  }
  if (object.size() != schema.size()) {
    for (auto it = object.begin(); it != object.end(); ++it) {
      bool known = false;
      for (const Field& f : schema)
        known = known || it.key() == f.name;
      if (!known) return Errorf("fields: unknown field '{}'", it.key().substr(0, 64));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view TypeName(MessageType type) {
  switch (type) {
    case MessageType::kRegister:
      return "register";
    case MessageType::kHeartbeat:
      return "heartbeat";
    case MessageType::kRankExit:
      return "rank-exit";
    case MessageType::kStopped:
      return "stopped";
    case MessageType::kRegistered:
      return "registered";
    case MessageType::kLaunch:
      return "launch";
    case MessageType::kStop:
      return "stop";
    case MessageType::kShutdown:
      return "shutdown";
    case MessageType::kHeartbeatAck:
      return "heartbeat-ack";
    case MessageType::kStoreSet:
      return "store-set";
    case MessageType::kStoreGet:
      return "store-get";
    case MessageType::kStoreAdd:
      return "store-add";
    case MessageType::kStoreReply:
      return "store-reply";
  }
  return "unknown";
}

std::string Encode(const Message& m) {
  const std::vector<Field>* schema = SchemaOf(m.type);
  DT_CHECK(schema != nullptr, "encoding a message of no known type {}", int(m.type));
  const Status valid = CheckFields(m.header, *schema, "");
  DT_CHECK(valid.ok(), "encoding a {} message: {}", TypeName(m.type), valid.message());
  const std::string header = m.header.dump();
  DT_CHECK(header.size() <= kMaxHeaderBytes, "{} header of {} bytes", TypeName(m.type),
           header.size());
  std::string frame;
  frame.reserve(kFixedHeaderBytes + header.size() + m.payload.size());
  frame += "DT";
  frame += static_cast<char>(kWireVersion);
  frame += static_cast<char>(m.type);
  const uint32_t n = static_cast<uint32_t>(header.size());
  for (int i = 0; i < 4; ++i)
    frame += static_cast<char>((n >> (8 * i)) & 0xff);
  frame += header;
  frame += m.payload;
  return frame;
}

Result<Message> Decode(std::string_view frame) {
  if (frame.size() > kMaxMessageBytes) {
    return Errorf("oversized: {} bytes (at most {})", frame.size(), kMaxMessageBytes);
  }
  if (frame.size() < kFixedHeaderBytes || frame[0] != 'D' || frame[1] != 'T') {
    return Errorf("malformed: not a difftrain message ({} bytes)", frame.size());
  }
  const uint8_t version = static_cast<uint8_t>(frame[2]);
  if (version != kWireVersion) {
    return Errorf("version: protocol version {} (this build speaks {})", version, kWireVersion);
  }
  Message m;
  m.type = static_cast<MessageType>(static_cast<uint8_t>(frame[3]));
  const std::vector<Field>* schema = SchemaOf(m.type);
  if (schema == nullptr) return Errorf("type: unknown message type {}", uint8_t(frame[3]));
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= uint32_t(static_cast<uint8_t>(frame[4 + i])) << (8 * i);
  if (n > kMaxHeaderBytes || n > frame.size() - kFixedHeaderBytes) {
    return Errorf("malformed: header length {} in a frame of {} bytes", n, frame.size());
  }
  m.header = json::parse(frame.substr(kFixedHeaderBytes, n), nullptr, /*allow_exceptions=*/false);
  if (m.header.is_discarded()) return Status::Error("malformed: the header is not JSON");
  DT_RETURN_IF_ERROR(CheckFields(m.header, *schema, "").WithContext(std::string(TypeName(m.type))));
  m.payload = std::string(frame.substr(kFixedHeaderBytes + n));
  return m;
}

std::string_view DropReason(const Status& decode_error) {
  const std::string& s = decode_error.message();
  for (std::string_view reason : {"oversized", "malformed", "version", "type"}) {
    if (s.rfind(reason, 0) == 0) return reason;
  }
  return "fields";
}

}  // namespace difftrain::wire
