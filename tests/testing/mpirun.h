// How the tests start `mpirun`.
#pragma once

#include <string>

#include "tests/testing/run_command.h"

namespace difftrain::testing {

// "TMPDIR=<session_base> mpirun --allow-run-as-root --oversubscribe": as root (CI runs as
// root), with more ranks than cores, and with Open MPI's session directory under
// `session_base`, an existing directory of the caller's own with a short path (PMIx puts its
// sockets there, and a socket's path is at most 107 bytes).
//
// Why a directory of its own: Open MPI 4.1 keeps the session directories of all of a user's
// mpiruns in one $TMPDIR/ompi.HOST.UID, which each mpirun removes when it ends and leaves it
// empty. ctest runs tests side by side; an mpirun that starts at that moment fails in
// orte_init ("A call to mkdir was unable to create the desired directory:
// /tmp/ompi.HOST.0/pid.N ... orte_session_dir failed"), as one did in CI.
inline std::string MpirunCommand(const std::string& session_base) {
  return "TMPDIR=" + ShellQuote(session_base) + " mpirun --allow-run-as-root --oversubscribe";
}

}  // namespace difftrain::testing
