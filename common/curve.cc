#include "common/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/temp_dir.h"

namespace difftrain {
namespace {

constexpr const char* kControllerFile = "controller.key";
constexpr const char* kClientFile = "client.key";

Status WriteKeyFile(const std::string& path) {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Errorf("generating a CURVE key pair: {} (libzmq without CURVE?)",
                  zmq_strerror(zmq_errno()));
  }
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errorf("creating '{}': {}", tmp, std::strerror(errno));
  const std::string text = fmt::format("public {}\nsecret {}\n", pub, sec);
  const bool written = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  const bool synced = written && ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    return Errorf("writing '{}': {}", path, std::strerror(errno));
  }
  return Status::Ok();
}

Status ReadKeyFile(const std::string& path, std::string& pub, std::string& sec) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Errorf("'{}': {}", path, std::strerror(errno));
  if ((st.st_mode & 077) != 0) {
    return Errorf("'{}' can be read by other users (mode {:o}); keys must be 0600 or 0400", path,
                  st.st_mode & 0777);
  }
  std::ifstream in(path);
  std::string word;
  for (int i = 0; i < 2; ++i) {
    std::string value;
    if (!(in >> word >> value) || value.size() != 40 || (word != "public" && word != "secret")) {
      return Errorf("'{}' is not a key file (expected lines 'public <z85>' and 'secret <z85>')",
                    path);
    }
    (word == "public" ? pub : sec) = value;
  }
  if (pub.empty() || sec.empty()) return Errorf("'{}' lacks a public or secret key", path);
  uint8_t decoded[32];
  if (zmq_z85_decode(decoded, pub.c_str()) == nullptr ||
      zmq_z85_decode(decoded, sec.c_str()) == nullptr) {
    return Errorf("'{}' holds a key that is not Z85", path);
  }
  return Status::Ok();
}

}  // namespace

Status WriteNewKeys(const std::string& dir) {
  // Check before touching anything: a directory with other files keeps its mode.
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name != kControllerFile && name != kClientFile) {
        return Errorf("'{}' is not empty (holds '{}'); keys go into a directory of their own", dir,
                      name);
      }
    }
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) return Errorf("creating '{}': {}", dir, ec.message());
  if (::chmod(dir.c_str(), 0700) != 0) {
    return Errorf("chmod 0700 '{}': {}", dir, std::strerror(errno));
  }
  DT_RETURN_IF_ERROR(WriteKeyFile(dir + "/" + kControllerFile));
  return WriteKeyFile(dir + "/" + kClientFile);
}

Result<CurveKeys> ReadKeys(const std::string& dir) {
  CurveKeys k;
  DT_RETURN_IF_ERROR(
      ReadKeyFile(dir + "/" + kControllerFile, k.controller_public, k.controller_secret)
          .WithContext("reading the job's keys"));
  DT_RETURN_IF_ERROR(ReadKeyFile(dir + "/" + kClientFile, k.client_public, k.client_secret)
                         .WithContext("reading the job's keys"));
  return k;
}

Result<std::string> MakeEphemeralKeys() {
  DT_ASSIGN_OR_RETURN(std::string dir, MakeTempDir("difftrain-keys"));
  DT_RETURN_IF_ERROR(WriteNewKeys(dir));
  return dir;
}

void MakeCurveServer(zmq::socket_t& socket, const CurveKeys& keys) {
  socket.set(zmq::sockopt::curve_server, true);
  socket.set(zmq::sockopt::curve_secretkey, keys.controller_secret);
  // A ZAP domain makes libzmq consult the handler for every handshake.
  socket.set(zmq::sockopt::zap_domain, "difftrain");
}

void MakeCurveClient(zmq::socket_t& socket, const CurveKeys& keys) {
  socket.set(zmq::sockopt::curve_serverkey, keys.controller_public);
  socket.set(zmq::sockopt::curve_publickey, keys.client_public);
  socket.set(zmq::sockopt::curve_secretkey, keys.client_secret);
}

ZapHandler::ZapHandler(zmq::context_t& context, const CurveKeys& keys)
    : socket_(context, zmq::socket_type::rep), client_public_binary_(32, '\0') {
  DT_CHECK(zmq_z85_decode(reinterpret_cast<uint8_t*>(client_public_binary_.data()),
                          keys.client_public.c_str()) != nullptr,
           "bad client key");
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
}

void ZapHandler::HandleRequest() {
  // Frames (RFC 27): version, request id, domain, address, identity, mechanism, key.
  std::vector<zmq::message_t> frames;
  while (true) {
    zmq::message_t frame;
    if (!socket_.recv(frame, zmq::recv_flags::dontwait)) break;
    const bool more = frame.more();
    frames.push_back(std::move(frame));
    if (!more) break;
  }
  if (frames.size() < 2) return;  // REP cannot answer what it did not receive whole
  const std::string mechanism = frames.size() > 5 ? frames[5].to_string() : "";
  const bool allowed =
      frames.size() == 7 && mechanism == "CURVE" && frames[6].to_string() == client_public_binary_;
  if (!allowed) {
    ++refused_;
    spdlog::warn("controller: refused a connection from {} (mechanism {}, unknown client key)",
                 frames.size() > 3 ? frames[3].to_string() : "?", mechanism);
  }
  const std::string request_id = frames[1].to_string();
  socket_.send(zmq::buffer(std::string("1.0")), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(std::string(allowed ? "200" : "400")), zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(std::string(allowed ? "OK" : "unknown client key")),
               zmq::send_flags::sndmore);
  socket_.send(zmq::buffer(std::string(allowed ? "difftrain" : "")), zmq::send_flags::sndmore);
  socket_.send(zmq::message_t(), zmq::send_flags::none);
}

}  // namespace difftrain
