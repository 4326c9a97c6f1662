// The address this node's ranks advertise to their peers for the CPU collectives (Gloo's
// TCP transport): the local interface address the kernel would use to reach the
// controller. On one machine that is loopback; across nodes it is the node's address on
// the network the controller is reached by, which is the network the job runs on.
#pragma once

#include <string>

#include "common/status.h"

namespace difftrain::worker {

// For `tcp://HOST:PORT` (HOST a name, an IPv4 address or `*`), the IPv4 address of the
// local interface the route to HOST leaves by; `127.0.0.1` for `ipc://` endpoints and for a
// controller on this machine. Sends nothing: a UDP socket is connected, never used.
Result<std::string> LocalAddressTowards(const std::string& controller_endpoint);

}  // namespace difftrain::worker
