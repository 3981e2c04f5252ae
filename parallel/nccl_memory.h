// An estimate of the device memory NCCL allocates for itself on each rank: its connection
// buffers and, where NCCL uses NVLink SHARP (NVLS), its multicast buffers. Neither is a
// shardgpt allocation, so the memory ledger (base/memory_ledger.h) and the peak model
// (parallel/memory_model.h) do not count them; `plan --device cuda --comm nccl` prints this
// estimate as a row of its own, and training with --comm nccl names it at start-up.
//
// The model, per communicator of n ranks, l of them on this rank's node (n >= 2; a one-rank
// communicator connects nothing and costs 0):
//   connection buffers = channels x connections x (NCCL_BUFFSIZE + LL + LL128)
//     channels:    kDefaultChannels (16), raised to NCCL_MIN_NCHANNELS and capped by
//                  NCCL_MAX_NCHANNELS where those are set;
//     connections: 2 per channel, the ring's (from the previous rank and to the next), each
//                  holding one set of buffers; the tree's extra connections are not counted;
//     NCCL_BUFFSIZE: the Simple protocol's buffer, 4 MiB by default (NCCL's documented
//                  default), the environment's value when set;
//     LL, LL128:   the other two protocols' buffers, fixed by NCCL: 512 KiB and 4800 KiB.
//   NVLS buffers (only when counted and l >= 2) = NCCL_NVLS_NCHANNELS (16) x 2 (reduce and
//     broadcast) x NCCL_NVLS_CHUNKSIZE (128 KiB) x 8 (NCCL_STEPS) x l (one head per local rank).
// Communicators: the world's; with HSDP (shard groups of G < N ranks) also the shard group's
// (G ranks, consecutive, so min(G, ranks per node) on the node) and the replica group's (N/G
// ranks, max(1, ranks per node / G) on the node), each with buffers of its own (ncclCommSplit
// without splitShare).
//
// An upper-bound-leaning estimate, not a measurement: NCCL connects lazily (only what a run's
// collectives use), picks channels by topology, and its internals change between versions.
// Pure arithmetic with the environment injected; thread-compatible.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace shardgpt {

struct NcclMemoryAssumptions {
  static constexpr int kDefaultChannels = 16;
  static constexpr int kSteps = 8;  // NCCL_STEPS
  double buffsize = 4.0 * 1024 * 1024;      // NCCL_BUFFSIZE, bytes
  double ll_bytes = 512.0 * 1024;           // LL protocol buffer per connection
  double ll128_bytes = 4800.0 * 1024;       // LL128 protocol buffer per connection
  int channels = kDefaultChannels;          // ring channels per communicator
  int connections_per_channel = 2;
  bool nvls = false;                        // count NVLS buffers (NVSwitch systems, NCCL_NVLS_ENABLE not 0)
  int nvls_channels = 16;                   // NCCL_NVLS_NCHANNELS
  double nvls_chunk = 128.0 * 1024;         // NCCL_NVLS_CHUNKSIZE, bytes
};

// The defaults above, with whatever of NCCL_BUFFSIZE, NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS,
// NCCL_NVLS_NCHANNELS and NCCL_NVLS_CHUNKSIZE lookup(name) gives as a positive decimal integer
// (other values are ignored, as if unset). nvls = nvls_available unless NCCL_NVLS_ENABLE is "0".
NcclMemoryAssumptions NcclAssumptionsFromEnvironment(const std::function<const char*(const char*)>& lookup,
                                                     bool nvls_available);

struct NcclCommunicatorMemory {
  std::string name;  // "world", "shard", "replica"
  int ranks = 0, local_ranks = 0;
  double simple = 0;   // channels x connections x NCCL_BUFFSIZE
  double ll = 0;       // channels x connections x (LL + LL128)
  double nvls = 0;
  double total() const { return simple + ll + nvls; }
};

struct NcclMemoryEstimate {
  std::vector<NcclCommunicatorMemory> comms;
  double simple() const;
  double ll() const;
  double nvls() const;
  double total() const { return simple() + ll() + nvls(); }
  // e.g. "3 communicators (world 16 ranks, shard 8, replica 2) x 16 channels x 2 connections x
  // (NCCL_BUFFSIZE 4 MiB + LL 0.5 MiB + LL128 4.6875 MiB) + NVLS 512 MiB"
  std::string Describe(const NcclMemoryAssumptions& a) const;
};

// Per rank, for `world` ranks in shard groups of `shard_group` (== world: no HSDP) with
// `ranks_per_node` ranks on each node (clamped to [1, world]).
NcclMemoryEstimate EstimateNcclMemory(int world, int shard_group, int ranks_per_node, const NcclMemoryAssumptions& a);

}  // namespace shardgpt
