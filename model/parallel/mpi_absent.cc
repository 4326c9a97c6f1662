// A build without MPI (CMake found no Open MPI): the launch mode and the backend say so.
#include "model/parallel/mpi_world.h"

namespace difftrain::parallel {

bool MpiBuilt() {
  return false;
}

Result<std::unique_ptr<MpiWorld>> JoinMpiWorld() {
  return Status::Error(
      "this difftrain was built without MPI: install Open MPI (libopenmpi-dev, "
      "scripts/install-deps.sh) and rebuild, or launch with `difftrain run` or the daemons");
}

}  // namespace difftrain::parallel
