// Launcher: the process's MPI, and for the commands that run on devices, this rank's device
// and data-plane communicator.
#pragma once

#include <functional>
#include <string>

#include "base/status.h"
#include "model/device.h"
#include "model/device_factory.h"
#include "parallel/comm_factory.h"
#include "parallel/communicator.h"

namespace shardgpt {

// Under srun --mpi=pmix (and not under mpirun): Open MPI's direct modex unless the user chose
// (OMPI_MCA_pmix_base_async_modex=1, OMPI_MCA_pmix_base_collect_data=0), so that no message
// from a faster peer is progressed inside MPI_Init before ob1 can receive it (launcher.cc).
// Called by the Launcher before MPI_Init_thread.
void PrepareMpiEnvironment();

// The value the command line gives --device ("--device X" or "--device=X"; the last one, as the
// parser takes it), looked at before MPI starts; "" when there is none. Arguments after a bare
// "--" are not flags.
std::string DeviceFlagBeforeParse(int argc, char** argv);

// Construction initialises MPI (MPI_THREAD_MULTIPLE, for the background checkpoint writer)
// and learns this rank's place in the world and on its node. With --device cuda on the command
// line it first sets the GPU of the launcher's node-local rank (SetGpuBeforeMpi), so that a
// CUDA-aware MPI creates its context there; nothing touches CUDA otherwise; destruction finalises MPI, so
// one Launcher lives for the whole of Main and nothing that uses MPI outlives it.
class Launcher {
 public:
  Launcher(int* argc, char*** argv);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int local_rank() const { return local_rank_; }  // among the ranks of this node
  int local_size() const { return local_size_; }
  // Compute threads per rank when none are asked for: the node's cores divided among its ranks.
  int default_threads() const;

  // --shard-group-size auto: the ranks of one node, which must be as many on every node and
  // consecutive in rank order (the engine groups consecutive ranks). Collective over the
  // world: every rank gets the same G or the same error.
  StatusOr<int> AutoShardGroupSize() const;

  struct DeviceChoice {
    std::string device = "cpu";    // --device
    std::string attention = "own";  // --attention
    CommOptions comm;              // --comm, --comm-timeout
    bool quiet = false;            // no topology lines
  };
  // Creates this rank's device (a GPU chosen by node-local rank), then the communicator that
  // moves that device's buffers, prints the topology (GPU runs, rank 0, unless quiet) and runs
  // body. A GPU set before MPI_Init that is not the one chosen now (the launcher's and MPI's
  // node-local ranks differ) gets one warning line on stderr naming both; the device is the
  // one chosen now. Every rank learns whether all devices came up before any communicator collective
  // starts. Returns OK or an error agreed on by every rank (one of them keeps the message).
  // Out of memory inside body, where the other ranks wait in a collective and cannot agree,
  // prints one line and ends the job (MPI_Abort). Collective.
  Status RunOnDevice(const DeviceChoice& choice, const std::function<Status(Communicator&, Device&)>& body);

 private:
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  EarlyGpu early_gpu_;  // the GPU set before MPI_Init (ordinal -1: none)
};

}  // namespace shardgpt
