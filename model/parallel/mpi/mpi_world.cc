#include "model/parallel/mpi_world.h"

#include <mpi.h>

#include <memory>

#include "model/parallel/mpi/mpi_comm.h"
#include "model/parallel/mpi/mpi_request.h"
#include "model/parallel/mpi/mpi_store.h"

namespace difftrain::parallel {
namespace {

class OpenMpiWorld final : public MpiWorld {
 public:
  OpenMpiWorld() {
    DT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    DT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm local;
    DT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    DT_MPI(MPI_Comm_rank(local, &local_rank_));
    DT_MPI(MPI_Comm_size(local, &local_size_));
    DT_MPI(MPI_Comm_free(&local));
    int first_on_node = local_rank_ == 0 ? 1 : 0;
    DT_MPI(MPI_Allreduce(&first_on_node, &nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    store_ = std::make_unique<MpiStore>(MPI_COMM_WORLD);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int nodes() const override { return nodes_; }
  Store& store() override { return *store_; }

  std::string Broadcast(const std::string& text) override {
    uint64_t bytes = text.size();
    DT_MPI(MPI_Bcast(&bytes, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));
    std::string received = rank_ == 0 ? text : std::string(bytes, '\0');
    DT_MPI(MPI_Bcast(received.data(), static_cast<int>(bytes), MPI_CHAR, 0, MPI_COMM_WORLD));
    return received;
  }

  Result<std::unique_ptr<Comm>> CreateComm(const std::string& prefix, int rank, int size,
                                           std::vector<int> global_ranks,
                                           std::chrono::milliseconds timeout) override {
    return CreateMpiComm(MPI_COMM_WORLD, *store_, prefix, rank, size, std::move(global_ranks),
                         timeout);
  }

  Status Finalize(std::chrono::milliseconds timeout) override {
    const bool all_came = store_->Close(MpiClock::now() + timeout);
    store_.reset();
    if (!all_came) {
      return Errorf("rank {}: the other ranks did not finish within {} ms", rank_, timeout.count());
    }
    DT_MPI(MPI_Finalize());
    return Status::Ok();
  }

  [[noreturn]] void Abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; should it, the rank still ends
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, nodes_ = 1;
  std::unique_ptr<MpiStore> store_;
};

}  // namespace

bool MpiBuilt() {
  return true;
}

Result<std::unique_ptr<MpiWorld>> JoinMpiWorld() {
  int provided = 0;
  DT_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  // The store's serving thread and the ranks' ops call MPI at the same time.
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    return Status::Error(
        "this MPI library does not support MPI_THREAD_MULTIPLE, which the MPI "
        "launch needs (the store is served on a thread)");
  }
  return std::unique_ptr<MpiWorld>(std::make_unique<OpenMpiWorld>());
}

}  // namespace difftrain::parallel
