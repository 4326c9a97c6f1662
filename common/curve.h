// The job's CURVE keys and how sockets use them. Every control-plane socket is CURVE:
// the controller's ROUTER is the server, worker daemons and ranks' store clients are
// clients, and a ZAP handler in the controller admits only clients holding the job's
// client key. A peer with any other key completes no handshake and gets nothing.
//
// A keys directory (written by `difftrain keys --out DIR`, mode 0700, files 0600) holds
//   controller.key   "public <z85>\nsecret <z85>\n"   the controller's key pair
//   client.key       "public <z85>\nsecret <z85>\n"   the key pair of daemons and ranks
#pragma once

#include <chrono>
#include <string>

#include <zmq.hpp>

#include "common/status.h"

namespace difftrain {

struct CurveKeys {
  std::string controller_public, controller_secret;  // Z85, 40 characters each
  std::string client_public, client_secret;
};

// Writes a fresh key pair for the controller and one for clients into `dir`, created
// with mode 0700 (an existing directory must be empty or hold only earlier keys).
Status WriteNewKeys(const std::string& dir);

// Reads the keys of `dir`; an error names the file that is missing or malformed. Files
// that others can read are refused: the keys are the job's only credential.
Result<CurveKeys> ReadKeys(const std::string& dir);

// A private directory under $TMPDIR with fresh keys, for `difftrain run` (removed by
// the caller). Returns its path.
Result<std::string> MakeEphemeralKeys();

// zmq_poll that returns 0 (nothing ready) when a signal interrupts it: the daemons take
// SIGTERM/SIGUSR1 as requests and look at them in their loops.
inline int PollIgnoringSignals(zmq::pollitem_t* items, size_t n,
                               std::chrono::milliseconds timeout) {
  const int rc = zmq_poll(items, static_cast<int>(n), static_cast<long>(timeout.count()));
  return rc < 0 ? 0 : rc;
}

void MakeCurveServer(zmq::socket_t& socket, const CurveKeys& keys);
void MakeCurveClient(zmq::socket_t& socket, const CurveKeys& keys);

// The ZAP handler: a REP socket on inproc://zeromq.zap.01 of `context` that the
// controller polls with its ROUTER. Bind it before the ROUTER so that no handshake ever
// happens without it.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, const CurveKeys& keys);

  zmq::socket_t& socket() { return socket_; }
  // Answers one pending ZAP request (call when the socket is readable).
  void HandleRequest();
  int64_t refused() const { return refused_; }

 private:
  zmq::socket_t socket_;
  std::string client_public_binary_;  // 32 bytes
  int64_t refused_ = 0;
};

}  // namespace difftrain
