// One GPU per rank, NCCL's rule, checked before NCCL starts: every rank names its machine and its
// GPU's PCI bus id, the names are gathered over the control plane, and a (machine, bus id) pair
// used by two or more ranks is refused with one line naming those ranks, their host and the GPU.
//
// The machine is the running kernel's boot id (/proc/sys/kernel/random/boot_id), not the host
// name: containers on different nodes can carry the same host name, and containers on one node
// (one kernel, so one boot id) can carry different ones.
//
// Why not "ranks on the node <= GPUs visible to the rank": under Slurm's --gpu-bind=per_task:1
// each rank sees exactly one GPU (its own), so 8 ranks on a node each see 1 GPU and are still
// one GPU per rank. Only the bus ids tell whether two ranks opened the same device.
//
// The decision (SharedGpuError) is pure and has no CUDA dependency, so it is unit-tested
// without a GPU; GatherRankGpus runs over any Communicator's control plane (MPI).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/communicator.h"

namespace shardgpt {

// Where one rank's GPU is. bus_id: "0000:19:00.0" (lower case, as cudaDeviceGetPCIBusId); empty
// when unknown (then the rank is not compared: NCCL's own duplicate check still applies).
// machine: ThisMachineId(); empty: the host name stands for it.
struct RankGpu {
  std::string host;
  std::string bus_id;
  std::string machine;
};

// Given every rank's GPU (index = rank), "" when no two ranks share one, else the error line for
// the first shared GPU (the one whose lowest rank is lowest), e.g. "--comm nccl: ranks 0 and 3
// on host n1 share GPU 0000:19:00.0; NCCL needs one GPU per rank (check --gpu-bind /
// CUDA_VISIBLE_DEVICES, or use --comm mpi to share GPUs)"; more shared GPUs are counted, not
// listed. Every rank that computes it from the same list gets the same text.
std::string SharedGpuError(const std::vector<RankGpu>& ranks);

// This process's host name (gethostname; "?" if it fails).
std::string ThisHostName();

// This machine's identity: the kernel's boot id, else /etc/machine-id, else "" (unknown).
std::string ThisMachineId();

// Every rank's RankGpu, on every rank (ControlAllGather of fixed-size records: host names and
// bus ids and machine ids are cut at 255, 63 and 63 bytes). Collective over comm's control plane.
StatusOr<std::vector<RankGpu>> GatherRankGpus(Communicator& comm, const RankGpu& mine);

}  // namespace shardgpt
