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
  double timeout_s = 600;     // --comm-timeout (NCCL and MPI): a collective running longer than this ends the job
  // MPI: a data-plane collective that fails on the communication thread (a staging copy that
  // threw, an MPI error) ends the job with one "shardgpt: error: rank R: ..." line per rank,
  // as the NCCL watchdog does: the engine has no error path for a Work
  // (MpiCommunicator::SetEndJobOnFailure). False: the Work fails with the Status (tests).
  bool end_job_on_failure = true;
};

// True when this build has the NCCL communicator.
bool NcclBuilt();

// Collective over comm. For NCCL, two ranks on one GPU are refused (the ranks, host and bus id
// named on every rank; parallel/gpu_binding.h); how many GPUs each rank sees does not matter.
StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommOptions& options, MPI_Comm comm, Device& device);

// The same, for callers that pass the local rank count and visible GPU count: both are ignored
// (NCCL compares the GPUs' bus ids, so --gpu-bind=per_task:1, where each rank sees one GPU,
// works).
inline StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommOptions& options, MPI_Comm comm,
                                                                  Device& device, int /*local_size*/, int /*gpus*/) {
  return CreateCommunicator(options, comm, device);
}

// The communicator kind `auto` resolves to on this device ("mpi" or "nccl").
std::string ResolveCommKind(const std::string& kind, const Device& device);

// One line about this rank's place: "host h, local rank 0/8, cuda:0 (NVIDIA H200, bus ...), NCCL 2.28.9".
std::string TopologyLine(const Device& device, int local_rank, int local_size, const std::string& comm_kind);

}  // namespace shardgpt
