#include "model/parallel/mpi/mpi_request.h"

#include <thread>

namespace difftrain::parallel {

bool WaitUntil(MPI_Request& request, MpiClock::time_point deadline) {
  const MpiClock::time_point spin_until = MpiClock::now() + std::chrono::milliseconds(2);
  while (true) {
    int done = 0;
    DT_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    const MpiClock::time_point now = MpiClock::now();
    if (now >= deadline) return false;
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace difftrain::parallel
