// Communicator: the one interface through which the engine talks to other ranks
// (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all-v, plus a few blocking control helpers),
// like PyTorch's ProcessGroup. MpiCommunicator (parallel/mpi_communicator.h) implements it
// over host memory; a NCCL communicator for the CUDA backend implements the same interface,
// so the engine does not change. Not here: sharding plans, bucketing, topology.
//
// Rank contract. Every method below is COLLECTIVE: every rank of the communicator calls it,
// in the same order, with matching arguments (same count, dtype, op and root). A rank that
// skips a call, or calls in another order, makes the others wait forever; nothing here can
// detect that. Argument checks that fail (bad root, null buffer, count too large) make the
// returned Work complete at once with an error and send nothing; they are meant to fail on
// every rank alike.
//
// Threading contract (asynchronous collectives and their order).
//  - AllReduce / ReduceScatter / AllGather / Broadcast return at once with a Work handle;
//    the collective runs later. All of them are executed strictly in CALL ORDER, one at a
//    time: the communicator owns a single FIFO of work. A Work that is complete implies all
//    earlier Works of the same communicator are complete.
//  - Completion of a Work (Wait() returned, or IsCompleted() returned true) means the output
//    buffer is final and may be read, and the input buffer may be reused. Until then the
//    caller must keep every buffer alive, must not write the input and must not read or write
//    the output. Buffers are owned by the caller; the communicator never frees them.
//  - Barrier, AllTrue and AllReduceScalar block the caller, and go through the same FIFO:
//    they return after every collective queued before them has completed.
//  - IsCompleted() never calls the communication library from the calling thread; it only
//    reads a flag. So the caller can compute while the collective progresses.
//  - A communicator is driven by ONE caller thread (or by callers that serialise their calls
//    themselves): the queue is thread-safe, but the ledger is not, and the call order across
//    ranks must be well defined anyway.
//  - CPU (MpiCommunicator): one communication thread per communicator runs the FIFO with
//    blocking MPI calls, which is what makes collectives progress while the caller computes
//    (MPI's nonblocking collectives only progress inside MPI calls). NCCL maps the same FIFO
//    onto its own CUDA stream: launching enqueues the kernel on the comm stream after an
//    event recorded on the compute stream (the buffers' producer), and the Work is a CUDA
//    event recorded after it; Wait() makes the compute stream wait on that event, and
//    IsCompleted() is cudaEventQuery. Stream order gives the same in-call-order guarantee.
//  - Several communicators (HSDP's shard and replica groups, Split). MPI: each has its own
//    FIFO and thread, so their collectives progress independently and the order between
//    communicators does not matter. NCCL: all communicators of a rank share ONE communication
//    stream (stream_ordered() is true), so a collective of one waits for every collective
//    issued before it on any of them; two ranks that issue collectives of two communicators in
//    different orders deadlock (each waits, behind its own first one, for the other's). So on
//    stream-ordered communicators the ISSUE ORDER ACROSS COMMUNICATORS must be the same on
//    every rank: collectives are issued from fixed points of the program, never from
//    completion steps, whose timing differs per rank (parallel/grad_reducer.cc).
//
// Ring-model accounting (CommLedger). Every collective is counted at ENQUEUE time in the
// caller's ledger: one call, plus the bytes this rank SENDS under a ring algorithm, with the
// (N-1)/N factor included, N = world size (N = 1 sends nothing). With e = element size
// (fp32 4, bf16 2) and the count argument of the call:
//   all_reduce(count)          2*(N-1)*count/N elements   (reduce-scatter + all-gather ring)
//   reduce_scatter(recv_count) (N-1)*recv_count elements  (= (N-1)*S/N, S = N*recv_count*e)
//   all_gather(send_count)     (N-1)*send_count elements  (= (N-1)*S/N, S = N*send_count*e)
//   broadcast(count)           (N-1)*count/N elements     (pipelined ring: N-1 ranks forward
//                                                          S bytes; this is the per-rank mean)
// Integer arithmetic on element counts; a division by N rounds DOWN to whole elements, then
// the result is multiplied by e. Reduce-scatter and all-gather are exact. For all-reduce and
// broadcast the floor is the per-rank mean of the exact ring total (the total over ranks is
// exactly 2*(N-1)*count resp. (N-1)*count elements); it loses less than one element per call,
// and nothing when N divides count (as for padded shards). Counted bytes are the model, not
// what the MPI library happens to send; the engine compares them with the seed's 4Psi / 6Psi
// formulas. Control traffic (Barrier, AllTrue, AllReduceScalar) is kept apart in
// `control`, counted as raw payload bytes per call (0, sizeof(int), sizeof(double)), so the
// big-collective totals stay exactly comparable with the formulas.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "parallel/flight_recorder.h"

namespace shardgpt {

// kAvg = sum over ranks divided by the world size. For bf16 the sum is accumulated pairwise
// with each partial sum rounded to bf16 (RNE), then divided in fp32 and rounded once more.
// Rounding of avg is backend-specific (NCCL pre-multiplies by 1/N), but within one run every
// rank gets the same bits.
enum class ReduceOp { kSum, kAvg };

// kAllToAll (AllToAllV) is not a ring collective: it is counted as the exact bytes this rank
// sends to the OTHER ranks (its own block stays local), see CommLedger::AllToAllBytes.
enum class CollKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll, kCount };
constexpr size_t kNumCollKinds = static_cast<size_t>(CollKind::kCount);

// "all_reduce", "reduce_scatter", "all_gather", "broadcast".
inline const char* CollKindName(CollKind kind) {
  switch (kind) {
    case CollKind::kAllReduce: return "all_reduce";
    case CollKind::kReduceScatter: return "reduce_scatter";
    case CollKind::kAllGather: return "all_gather";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kAllToAll: return "all_to_all";
    case CollKind::kCount: break;
  }
  return "unknown";
}

// Per-rank traffic counters, by collective kind (ring model, see the header comment).
// Not thread-safe: updated by the calling thread when a collective is enqueued.
struct CommLedger {
  struct Counter {
    uint64_t bytes_sent = 0;
    uint64_t calls = 0;
  };
  std::array<Counter, kNumCollKinds> kinds{};
  Counter control;  // Barrier / AllTrue / AllReduceScalar: raw payload bytes, not ring-model.

  const Counter& operator[](CollKind k) const { return kinds[static_cast<size_t>(k)]; }
  void Add(CollKind k, uint64_t bytes) {
    Counter& c = kinds[static_cast<size_t>(k)];
    c.bytes_sent += bytes;
    c.calls += 1;
  }
  void AddControl(uint64_t bytes) {
    control.bytes_sent += bytes;
    control.calls += 1;
  }
  void Reset() { *this = CommLedger(); }
  // Sum over the big collectives (all-to-all included); control traffic excluded.
  Counter Total() const {
    Counter t;
    for (const Counter& c : kinds) {
      t.bytes_sent += c.bytes_sent;
      t.calls += c.calls;
    }
    return t;
  }
  // One line per kind with calls and bytes, then total and control.
  std::string ToString() const {
    std::string out;
    auto line = [&out](const char* name, const Counter& c) {
      out += std::string(name) + ": calls=" + std::to_string(c.calls) +
             " bytes_sent=" + std::to_string(c.bytes_sent) + "\n";
    };
    for (size_t k = 0; k < kNumCollKinds; ++k) line(CollKindName(static_cast<CollKind>(k)), kinds[k]);
    line("total", Total());
    line("control", control);
    return out;
  }

  // Bytes one rank sends for one collective of `kind` with the call's count argument (the
  // formula table above). Pure; also used by tests and the engine's traffic check.
  static uint64_t RingBytes(CollKind kind, uint64_t count, DType dtype, int world) {
    if (world <= 1) return 0;
    const uint64_t n = static_cast<uint64_t>(world);
    uint64_t elems = 0;
    switch (kind) {
      case CollKind::kAllReduce: elems = 2 * (n - 1) * count / n; break;
      case CollKind::kReduceScatter: elems = (n - 1) * count; break;
      case CollKind::kAllGather: elems = (n - 1) * count; break;
      case CollKind::kBroadcast: elems = (n - 1) * count / n; break;
      case CollKind::kAllToAll:  // not ring-modelled: see AllToAllBytes
      case CollKind::kCount: break;
    }
    return elems * DTypeSize(dtype);
  }
  // Bytes `rank` sends in AllToAllV: its blocks for every other rank (exact, no model).
  static uint64_t AllToAllBytes(const std::vector<size_t>& send_counts, int rank, DType dtype) {
    uint64_t elems = 0;
    for (size_t j = 0; j < send_counts.size(); j++)
      if (static_cast<int>(j) != rank) elems += send_counts[j];
    return elems * DTypeSize(dtype);
  }
  // nccl-tests' bus-bandwidth factor: busbw = algbw * factor, algbw = S / time, S being the
  // all-reduce buffer, the reduce-scatter input / all-gather output of all ranks, or the
  // broadcast buffer. all_reduce 2(N-1)/N, reduce_scatter and all_gather (N-1)/N, broadcast 1.
  static double BusBandwidthFactor(CollKind kind, int world) {
    const double n = world;
    switch (kind) {
      case CollKind::kAllReduce: return 2.0 * (n - 1) / n;
      case CollKind::kReduceScatter:
      case CollKind::kAllGather:
      case CollKind::kAllToAll: return (n - 1) / n;
      case CollKind::kBroadcast: return 1.0;
      case CollKind::kCount: break;
    }
    return 0.0;
  }
};

// Handle to one queued collective. Shared by the caller and the communicator; may outlive
// the communicator (it is complete by then).
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is complete (output final). Safe to call more than once.
  virtual void Wait() = 0;
  // Makes later work on the device's compute stream wait for the collective; the host thread
  // goes on (NCCL). Host backends have no stream: Wait().
  virtual void WaitStream() { Wait(); }
  // Non-blocking; never calls the communication library from the calling thread.
  virtual bool IsCompleted() = 0;
  // The outcome. Blocks until complete, then returns OK or the error (an MPI error string,
  // or a refused argument). After an error the output buffer's content is unspecified.
  virtual Status status() {
    Wait();
    return Status::OK();
  }
};

// A Work that is complete from the start: the result of a refused call, or of a backend
// that finishes synchronously.
class CompletedWork final : public Work {
 public:
  explicit CompletedWork(Status s = Status::OK()) : status_(std::move(s)) {}
  void Wait() override {}
  bool IsCompleted() override { return true; }
  Status status() override { return status_; }

 private:
  Status status_;
};

class Communicator;

// Debug hook: called for every data-plane collective (AllReduce, ReduceScatter, AllGather,
// Broadcast, AllToAllV) that a communicator of this process accepts, on the issuing thread, in
// issue order, with the call's count argument (AllToAllV: the elements sent). Tests record the
// sequence of (communicator, collective) per rank to check that every rank issues the same
// sequence across communicators (the stream-ordered rule above). Empty by default (the cost is
// one test of an empty std::function per call); set it before the communicators run and reset
// it after: it is not synchronised.
using CollectiveIssueHook = std::function<void(const Communicator& comm, CollKind kind, size_t count)>;
inline CollectiveIssueHook& CollectiveIssueHookSlot() {
  static CollectiveIssueHook hook;
  return hook;
}

// See the header comment for the rank and threading contracts; every method is collective.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // True when collectives execute in ISSUE order on one device stream shared with the other
  // communicators of this rank (NCCL), so that a collective issued right after another one
  // (of any of them) runs after it without the host waiting; the issue order across
  // communicators must then be the same on every rank (header comment). False (MPI): one FIFO
  // per communicator, ordered only within it.
  virtual bool stream_ordered() const { return false; }

  // In place: buf holds count elements; afterwards every rank holds the reduction.
  virtual std::shared_ptr<Work> AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // send holds world*recv_count elements (block b = elements [b*recv_count, (b+1)*recv_count));
  // rank r receives in recv the reduction over ranks of block r. recv may lie inside send.
  virtual std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t recv_count,
                                              DType dtype, ReduceOp op) = 0;
  // recv holds world*send_count elements; block r comes from rank r. send may be exactly
  // rank r's block of recv (in place, as an FSDP flat buffer holding its own shard); any other
  // overlap is refused.
  virtual std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t send_count,
                                          DType dtype) = 0;
  // buf holds count elements; afterwards every rank holds root's.
  virtual std::shared_ptr<Work> Broadcast(void* buf, size_t count, DType dtype, int root) = 0;

  // Personalised exchange (MPI_Alltoallv): send holds world blocks back to back, block j of
  // send_counts[j] elements going to rank j; recv receives world blocks back to back, block j
  // of recv_counts[j] elements from rank j. Counts must agree pairwise (rank i's
  // send_counts[j] == rank j's recv_counts[i]); send and recv must not overlap. Used by
  // distributed Muon (parallel/sharded_muon.h); counted under kAllToAll.
  virtual std::shared_ptr<Work> AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                          const std::vector<size_t>& recv_counts, DType dtype) = 0;

  // Blocking: returns when all ranks have entered it and all earlier work is complete.
  virtual Status Barrier() = 0;
  // Blocking agreement helpers for errors: every rank gets the same answer. AllTrue is the
  // logical AND over ranks (false if the communication itself fails). AllReduceScalar is a
  // sum or mean over ranks of one double (grad norm, loss); NaN if the communication fails.
  virtual bool AllTrue(bool local) = 0;
  virtual double AllReduceScalar(double value, ReduceOp op) = 0;

  // Control plane: blocking, HOST memory, never staged (on MPI even where the data plane is
  // NCCL), counted as control traffic. recv of ControlAllGather holds world * bytes: block r
  // comes from rank r. Used for agreement, per-rank figures and small metadata.
  virtual Status ControlAllGather(const void* send, void* recv, size_t bytes) = 0;
  virtual Status ControlBroadcast(void* buf, size_t bytes, int root) = 0;

  // Blocking, collective: a new communicator of the ranks that passed the same color, ordered
  // by key (MPI_Comm_split; ncclCommSplit on NCCL), with its own FIFO, ledger and control
  // plane; this one stays usable. HSDP splits the world once into shard groups and replica
  // groups (parallel/engine.h). Backends that cannot split return Unimplemented.
  virtual StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) {
    (void)color, (void)key;
    return Status::Unimplemented("this communicator cannot be split into groups");
  }

  // A new communicator over the same ranks with its own queue, thread and MPI communicator
  // (MPI_Comm_dup), for the control plane of ANOTHER thread (the async checkpoint writer,
  // ckpt/async_checkpoint.h): its calls never match or delay this one's, so the training
  // collectives' order is untouched. Its buffers are host memory. Collective over this
  // communicator (runs in its call order); needs MPI_THREAD_MULTIPLE (two threads in MPI).
  virtual StatusOr<std::unique_ptr<Communicator>> DuplicateControl() {
    return Status::Unimplemented("this communicator cannot be duplicated");
  }

  // This rank's traffic counters. Reset it whenever a measurement starts.
  virtual CommLedger& ledger() = 0;
  // Wall time spent executing collectives since creation (to measure how much of it was
  // hidden behind computation); 0 where the backend cannot tell.
  virtual double busy_seconds() const { return 0.0; }
  // This communicator's flight recorder ring (parallel/flight_recorder.h), null when the
  // recorder is off or the backend keeps none. Owned by the communicator.
  virtual FlightRing* flight_ring() { return nullptr; }

 protected:
  // Implementations call this once per accepted data-plane collective (where they count it in
  // the ledger): runs the debug hook, if any.
  void NoteIssued(CollKind kind, size_t count) const {
    const CollectiveIssueHook& hook = CollectiveIssueHookSlot();
    if (hook) hook(*this, kind, count);
  }
};

// Every rank's values, on every rank (k values per rank, rank-major). Collective.
inline std::vector<uint64_t> AllGatherU64(Communicator& comm, const std::vector<uint64_t>& mine) {
  std::vector<uint64_t> all(mine.size() * comm.world_size(), 0);
  if (!comm.ControlAllGather(mine.data(), all.data(), mine.size() * sizeof(uint64_t)).ok()) all.assign(all.size(), 0);
  return all;
}

// Every rank returns an error when any rank has one; exactly one rank keeps the message (the
// first rank, in rank order, whose error has one), the others return an error with an empty
// message, so that a failure is printed once. Collective.
inline Status Agree(Communicator& comm, Status local) {
  if (comm.AllTrue(local.ok())) return Status::OK();
  // 2: failed with a message, 1: failed because another rank did (empty message), 0: ok
  const uint64_t code = local.ok() ? 0 : local.message().empty() ? 1 : 2;
  const std::vector<uint64_t> codes = AllGatherU64(comm, {code});
  int speaker = -1;
  for (uint64_t want = 2; want >= 1 && speaker < 0; want--)
    for (int r = 0; r < comm.world_size() && speaker < 0; r++)
      if (codes[r] == want) speaker = r;
  if (speaker == comm.rank()) return local;
  return Status::Internal("");
}

}  // namespace shardgpt
