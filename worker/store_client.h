// The ranks' side of the rendezvous store: model/parallel/store.h over ZeroMQ to the
// controller (controller/store_server.h), CURVE-authenticated with the job's keys.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "model/parallel/store.h"

namespace difftrain::worker {

// The store at `address`: "tcp://…" or "ipc://…" is the controller's store, reached
// with the keys in `keys_dir`; anything else is a FileStore directory.
Result<std::unique_ptr<parallel::Store>> OpenStore(const std::string& address,
                                                   const std::string& keys_dir);

}  // namespace difftrain::worker
