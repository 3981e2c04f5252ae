// MpiCommunicator: the Communicator of the CPU backend, over host memory with MPI.
//
// Every call (collective or blocking helper) is queued, in call order, to ONE communication
// thread owned by this object, which runs it with a blocking MPI call (MPI_Allreduce,
// MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast, MPI_Alltoallv, MPI_Barrier). That thread is what makes
// a collective progress while the caller computes. It sleeps on a condition variable when
// the queue is empty (no busy spin); inside an MPI call, Open MPI itself may poll.
//
// MPI use: the communicator duplicates the given MPI_Comm (so its traffic never matches
// anyone else's messages) and, after construction, calls MPI only from its thread, one call
// at a time. That needs MPI_THREAD_SERIALIZED or better; Create() refuses less. Other code
// may call MPI on its own communicators from other threads only if MPI was initialised with
// MPI_THREAD_MULTIPLE (under SERIALIZED it must not while work is queued here).
//
// bf16: MPI has no bf16 type, so bf16 buffers travel as MPI_UINT16_T and are reduced by a
// user-defined commutative MPI_Op that widens to fp32, adds and rounds back (RNE).
// kAvg divides the sum by the world size in the communication thread, after the MPI call.
//
// Device buffers: given a Device whose memory the host cannot address (CUDA), every collective
// stages its buffers through pinned host memory on the communication thread: it waits for the
// compute work queued before the call (an event recorded at enqueue), copies the input to the
// host on the device's side stream, runs MPI, and copies the output back before the Work
// completes. This is the `--comm mpi` path for GPUs (and what lets 2-4 ranks share one GPU in
// tests); the ledger counts the same bytes either way.
//
// Lifetime: create after MPI_Init_thread and destroy before MPI_Finalize. The destructor
// runs what is still queued (so remote ranks are not left waiting), then joins the thread;
// like every call it is collective. Not copyable; owned by the caller of Create().
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "model/device.h"
#include "parallel/communicator.h"

namespace shardgpt {

class MpiWork;

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `comm`. Errors: MPI not initialised, thread level below
  // MPI_THREAD_SERIALIZED, MPI_COMM_NULL, or a failing MPI call (message names it).
  // device: where the buffers passed to collectives live (null: host memory); it must
  // outlive the communicator.
  static StatusOr<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm comm, Device* device = nullptr);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                      ReduceOp op) override;
  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t send_count,
                                  DType dtype) override;
  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DType dtype, int root) override;
  std::shared_ptr<Work> AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                  const std::vector<size_t>& recv_counts, DType dtype) override;

  Status Barrier() override;
  bool AllTrue(bool local) override;
  double AllReduceScalar(double value, ReduceOp op) override;
  Status ControlAllGather(const void* send, void* recv, size_t bytes) override;
  Status ControlBroadcast(void* buf, size_t bytes, int root) override;
  // MPI_Comm_split on this communicator's thread (after the work queued before it), then a new
  // MpiCommunicator over the result, on the same device.
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

  StatusOr<std::unique_ptr<Communicator>> DuplicateControl() override;

  CommLedger& ledger() override { return ledger_; }
  double busy_seconds() const override { return busy_ns_.load() * 1e-9; }

 private:
  using Task = std::function<Status()>;  // runs on the communication thread
  struct Item {
    Task task;
    std::shared_ptr<MpiWork> work;
  };

  // A collective's MPI calls on (send, recv), which are host memory when it runs.
  using Body = std::function<Status(const void* send, void* recv)>;

  MpiCommunicator(MPI_Comm comm, int rank, int world, MPI_Op bf16_sum, Device* device);
  // A new communicator over make(comm_) (MPI_Comm_split, MPI_Comm_dup), run on our thread.
  using DeriveFn = std::function<int(MPI_Comm, MPI_Comm*)>;
  StatusOr<std::unique_ptr<Communicator>> Derive(const char* what, const DeriveFn& make, Device* device);
  std::shared_ptr<Work> Enqueue(Task task);
  // Enqueues body(send, recv), staging device buffers through host memory when needed.
  std::shared_ptr<Work> Submit(Body body, const void* send, size_t send_bytes, void* recv, size_t recv_bytes);
  // Communication thread: the host staging area, grown to at least `bytes`.
  char* Staging(size_t bytes);
  void Loop();
  MPI_Op SumOp(DType dtype) const;

  MPI_Comm comm_;   // our duplicate; freed in the destructor
  const int rank_;
  const int world_;
  MPI_Op bf16_sum_;  // freed in the destructor
  Device* device_;   // null or host-accessible: no staging
  char* staging_ = nullptr;  // pinned host memory, used by the communication thread only
  size_t staging_bytes_ = 0;
  CommLedger ledger_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  std::atomic<uint64_t> busy_ns_{0};  // time the comm thread spent inside collectives
  std::thread thread_;      // started last in the constructor
};

}  // namespace shardgpt
