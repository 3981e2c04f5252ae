// NcclCommunicator: the Communicator of the CUDA backend's data plane, over NCCL, bootstrapped
// from MPI: rank 0 creates the NCCL unique id and broadcasts it over MPI; every rank joins with
// its MPI rank and world size. MPI stays the launcher and the control plane (Barrier, AllTrue,
// AllReduceScalar, Control*: the loss, the stop flag, checkpoint agreement).
//
// Streams: every collective runs on one communication stream of the device. It waits (a CUDA
// event) for the compute work queued before the call, which produced its input, and records an
// event after itself; IsCompleted() queries that event, WaitStream() makes the compute stream
// wait on it (the host goes on), Wait() blocks the host on it. So stage 0 buckets and stage 1-3
// reduce-scatters run while backward continues and stage 3's all-gathers prefetch the next
// unit; the host blocks only where the engine needs the data (the rate limit, the step).
// Stream order keeps the in-call-order guarantee of the Communicator contract.
//
// Failures do not hang: NCCL runs non-blocking (config.blocking = 0) and a watchdog thread
// checks ncclCommGetAsyncError, CUDA errors, and the age of the oldest unfinished collective;
// past the timeout (or on an error) it aborts the communicator (ncclCommAbort) and ends the
// process with one line "shardgpt: error: rank R: NCCL: ..." and status 1, so every surviving
// rank of a job whose GPU or rank died exits within the timeout. A collective's age counts
// from when it STARTED on the stream (a "started" event recorded just before it, after the
// wait for the compute stream), not from its launch: compute it waits behind is not a hang.
// Destruction drains the stream while the watchdog still runs, then ncclCommFinalize, polled
// up to the timeout, and ncclCommDestroy; a finalize that fails or does not finish (a dead
// peer) becomes ncclCommAbort and one warning line, never a hang at exit.
//
// One GPU per rank: before NCCL starts, every rank's (host, GPU PCI bus id) is gathered over
// MPI and two ranks on one GPU are refused on every rank alike (parallel/gpu_binding.h). The
// number of GPUs a rank sees does not matter (Slurm's --gpu-bind=per_task:1 shows each rank one).
//
// Split (HSDP's shard and replica groups): MPI_Comm_split for the control plane and
// ncclCommSplit for the data plane (no new unique id). Every communicator split from this one
// runs on THIS one's communication stream: one stream per rank for all NCCL collectives, so the
// GPU executes them in issue order. The price is the rule of parallel/communicator.h: every
// rank must issue the collectives of all these communicators in the same order (the
// GradReducer issues HSDP's replica all-reduce right after its shard reduce-scatter, from the
// training flow, not from a completion step). stream_ordered() is true. The stream lives
// until the last of these communicators is destroyed.
//
// Built only with the CUDA backend and NCCL (SHARDGPT_HAVE_NCCL). Thread contract: one caller
// thread, as every Communicator; the watchdog thread only reads the event queue under a mutex.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "base/status.h"
#include "model/device.h"
#include "parallel/communicator.h"

namespace shardgpt {

struct NcclOptions {
  double timeout_s = 600;  // --comm-timeout: a collective running longer than this aborts the job
};

// Collective over comm. device must be a CUDA device and outlive the communicator. Errors:
// NCCL's initialisation failing or not finishing within the timeout (one line naming NCCL's
// error), or two ranks on one GPU (naming the ranks, their host and the GPU's bus id; the same
// line on every rank).
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(MPI_Comm comm, Device& device,
                                                               const NcclOptions& options);

// "NCCL 2.28.9" (the library this process loaded).
std::string NcclVersionString();

}  // namespace shardgpt
