// Picks and creates the data-plane communicator from --comm: MPI over host memory (staging
// device buffers through pinned host memory for a GPU), or NCCL for CUDA devices.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "base/status.h"
#include "model/device.h"
#include "parallel/communicator.h"

namespace shardgpt {

struct CommOptions {
  std::string kind = "auto";  // auto (nccl for --device cuda when built, else mpi), mpi, nccl
  double timeout_s = 600;     // --comm-timeout (NCCL): a collective older than this ends the job
};

// True when this build has the NCCL communicator.
bool NcclBuilt();

// Collective over comm. local_size: ranks on this node, gpus: GPUs visible to this rank (for
// NCCL, which needs one GPU per rank: more ranks than GPUs is an error naming both numbers).
StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommOptions& options, MPI_Comm comm, Device& device,
                                                           int local_size, int gpus);

// The communicator kind `auto` resolves to on this device ("mpi" or "nccl").
std::string ResolveCommKind(const std::string& kind, const Device& device);

// One line about this rank's place: "host h, local rank 0/8, cuda:0 (NVIDIA H200, bus ...), NCCL 2.28.9".
std::string TopologyLine(const Device& device, int local_rank, int local_size, const std::string& comm_kind);

}  // namespace shardgpt
