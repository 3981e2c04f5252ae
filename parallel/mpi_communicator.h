// MpiCommunicator: the Communicator of the CPU backend, over host memory with MPI.
//
// Every call (collective or blocking helper) is queued, in call order, to ONE communication
// thread owned by this object, which runs it with a blocking MPI call (MPI_Allreduce,
// MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast, MPI_Alltoallv, MPI_Barrier, each as its
// nonblocking MPI_I* form). That thread is what makes a collective progress while the caller
// computes. It sleeps on a condition variable when the queue is empty, and waits for a call
// with MPI_Test and a backoff sleep (1 ms of spinning, then sleeps doubling to 0.5 ms): a peer
// that is still computing costs no core spinning inside a blocking MPI call.
//
// Watchdog (SetTimeout, --comm-timeout): a call still not complete after that many seconds
// ends the job (one line naming the call, the step and the ranks that did not arrive or that
// arrived and then fell silent, then MPI_Abort): a stopped or hung peer cannot hang the job.
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
// tests); the ledger counts the same bytes either way. Only real spans are staged: a side of
// the collective with 0 bytes (an empty shard, a null pointer) stages nothing, wherever its
// pointer points. Every rank of the communicator must pass the same kind of device (staged or
// not): staged collectives agree on their outcome (below), which is a protocol of their own.
//
// Failures on the communication thread. Staging can fail (a CUDA error thrown by
// Device::StageToHost, the event wait or the pinned allocation); a staged collective then
// still keeps every rank in step: the ranks agree (one int all-reduce on this communicator,
// not counted in the ledger) whether all of them staged their input before anyone enters the
// MPI calls, and again whether all copied the output back, so the collective succeeds on
// every rank or fails on every rank, with the failing rank's message ("reduce_scatter failed
// on rank 1: copying its input to host memory: CUDA: ..."), and nobody is left waiting. Any
// other exception escaping a task fails that Work (never std::terminate). An MPI error fails
// the Work of the rank that saw it. With SetEndJobOnFailure (what the application sets: the
// engine has no error path for a Work), a failed data-plane collective instead ends the job:
// every rank that knows prints one "shardgpt: error: rank R: ..." line, then MPI_Abort, as
// the NCCL watchdog does.
//
// Lifetime: create after MPI_Init_thread and destroy before MPI_Finalize. The destructor
// runs what is still queued (so remote ranks are not left waiting), then joins the thread;
// like every call it is collective, but it waits for no peer: the watchdog's side channel,
// whose notes have no matching receive, is kept (retired) until every peer's closing note came
// in, so that no message ever reaches a freed communicator (Open MPI's ob1 mishandles those;
// see RetiredChannel in the .cc). Not copyable; owned by the caller of Create().
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "model/device.h"
#include "parallel/communicator.h"
#include "parallel/stall_verdict.h"

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
  FlightRing* flight_ring() override { return ring_.get(); }

  // On: a data-plane collective (AllReduce ... AllToAllV) that fails on the communication
  // thread ends the job (one error line per rank that knows, then MPI_Abort) instead of
  // failing its Work; refused arguments still come back as a failed Work. Split and
  // DuplicateControl pass it on. Off by default; set before the first collective.
  void SetEndJobOnFailure(bool on) { end_job_on_failure_ = on; }

  // The watchdog (--comm-timeout): an MPI call of this communicator that has not completed
  // after `seconds` ends the job with one line naming the call, the step and the ranks that
  // did not arrive at it, or arrived and fell silent (each rank notes every call it enters to
  // the others on a side channel, and again every heartbeat while it waits inside it: a rank
  // stopped inside a collective is told apart from MPI being stuck). 0 (the default) waits
  // forever. Split and DuplicateControl pass it on. Set
  // before the first collective. A rank that was itself paused inside the call (its own loop
  // saw a gap of several heartbeats) restarts the deadline from its resumption instead of
  // naming peers from stale notes. Before the job ends, this rank writes its flight dump and asks
  // every peer for theirs on the side channel (parallel/flight_dump.h).
  void SetTimeout(double seconds) { timeout_s_ = seconds; }
  // Any thread, before the job ends (another communicator's watchdog, e.g. NCCL's over this
  // control communicator): this rank's flight dump, then, from the communication thread, the
  // dump request to every peer and the bounded wait for their answers (as when this
  // communicator's own watchdog expires). Returns when that is done, or at most 5 s after the
  // answers' bound (min(60, max(10, timeout)) s) when the communication thread is held up in
  // another call. A peer answers while its communication thread is idle only under the
  // watchdog (SetTimeout) and MPI_THREAD_MULTIPLE.
  void RequestFlightDumps(const char* reason);
  // The training step the watchdog's line names (process-wide; the training loop sets it).
  static void SetDiagnosticStep(long long step);
  // Process-wide, set once before the first collective (the trainer, with
  // --straggler-exclude-after): when this process's watchdog ends the job, the hosts of the
  // world ranks its verdict names (hosts_by_world_rank) are appended to `path`
  // (RecordExcludedHosts, HostsToExclude: never every host) before the abort. Empty path: off.
  static void SetExcludeHostsOnTimeout(const std::string& path, const std::vector<std::string>& hosts_by_world_rank);
  // The side channels of destroyed communicators this process still keeps (each is freed once
  // every peer's closing note came in, so that no message reaches a freed communicator); frees
  // those it can first, without waiting. For tests and diagnostics.
  static size_t RetiredChannels();

 private:
  using Task = std::function<Status()>;  // runs on the communication thread
  struct Item {
    Task task;
    std::shared_ptr<MpiWork> work;
    bool data_plane = false;  // a collective on the caller's buffers (not a control call)
    uint64_t seq = 0;         // its flight recorder entry (0: none)
  };

  // A collective's MPI calls on (send, recv), which are host memory when it runs.
  using Body = std::function<Status(const void* send, void* recv)>;

  MpiCommunicator(MPI_Comm comm, int rank, int world, int world_rank, MPI_Op bf16_sum, Device* device);
  // A new communicator over make(comm_) (MPI_Comm_split, MPI_Comm_dup), run on our thread.
  using DeriveFn = std::function<int(MPI_Comm, MPI_Comm*)>;
  StatusOr<std::unique_ptr<Communicator>> Derive(const char* what, const DeriveFn& make, Device* device);
  std::shared_ptr<Work> Enqueue(Task task, bool data_plane = false, uint64_t seq = 0);
  // The flight recorder entry of a call being issued (0 when the recorder is off).
  uint64_t Record(FlightOp op, DType dtype, uint64_t count, uint64_t bytes) {
    return ring_ ? ring_->Record(op, dtype, count, bytes) : 0;
  }
  // Enqueues collective `kind` as body(send, recv), staging device buffers through host memory
  // when needed (send_bytes / recv_bytes: the spans the collective reads / writes).
  std::shared_ptr<Work> Submit(CollKind kind, Body body, const void* send, size_t send_bytes, void* recv,
                               size_t recv_bytes, uint64_t seq);
  // Communication thread, staged collectives: every rank learns whether any rank failed
  // (`local` is this rank's outcome); OK when none did, else the lowest failing rank's error,
  // on every rank. Every rank of the communicator must call it at the same point.
  Status AgreeOnFailure(const Status& local);
  // Communication thread: the host staging area, grown to at least `bytes`. Throws when the
  // pinned allocation fails (caught by the staging task).
  char* Staging(size_t bytes);
  void Loop();
  // Communication thread: one line, then the job ends (SetEndJobOnFailure).
  [[noreturn]] void EndJob(const Status& failure);
  MPI_Op SumOp(DType dtype) const;
  void StartThread();
  // Communication thread: waits for a nonblocking MPI call's request with MPI_Test and a
  // backoff sleep (no core burnt while the peers compute); past timeout_s_ it ends the job.
  Status Await(MPI_Request* req, const char* name);
  void Announce();    // the note "I entered call calls_" to every other rank
  void DrainNotes();  // the others' notes into seen_ (and heard_, when each came in)
  // Destructor: hands arrivals_ to the retired side channels (mpi_communicator.cc), which free
  // it once every peer's closing note came in, so that no note reaches a freed channel.
  void RetireArrivals();
  // The verdict on the call stalled in Await (stall_verdict.h): empty when every peer is
  // waiting in it, noting it every heartbeat.
  std::string Verdict(double silence_s, std::vector<int>* culprits = nullptr);
  // SetExcludeHostsOnTimeout's recording of the hosts of `culprits` (world ranks), if set.
  void RecordCulpritHosts(const std::vector<int>& culprits);
  // Past the deadline: the job's one verdict (flight_dump.h: the rank that claims it prints the
  // dumps' analysis, the others name that rank), or without dumps this rank's own view; then
  // the job ends. Every wait in here is bounded.
  [[noreturn]] void TimedOut(const char* name, const std::string& verdict);
  // The watchdog thread looked at its clock at `last` and again at `now`: a gap past three
  // heartbeats is this rank's own pause (recorded; true), and what it heard of its peers is stale.
  bool NotePause(std::chrono::steady_clock::time_point last, std::chrono::steady_clock::time_point now);
  // A pause (seen by the watchdog of any communicator of this process: a pause stops every
  // thread) ended within the last timeout: this rank names no peer. *pause: that pause.
  bool PausedRecently(SelfPause* pause = nullptr) const;
  // The bounded wait for the peers' answers to a dump request.
  double DumpWaitLimit() const;
  // Communication thread, before the job ends: this rank's flight dump, then a dump request to
  // every peer on the side channel, and a bounded wait for their answers (a peer that is
  // stopped or dead answers nothing).
  void DumpFlightEverywhere(const char* reason);

  MPI_Comm comm_;   // our duplicate; freed in the destructor
  const int rank_;
  const int world_;
  const int world_rank_;  // in MPI_COMM_WORLD: error lines name it
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
  std::atomic<bool> end_job_on_failure_{false};
  bool agreed_failure_ = false;  // communication thread: the running task's failure is known to every rank
  double timeout_s_ = 0;    // set before the first collective
  // the watchdog's state, communication thread only
  MPI_Comm arrivals_ = MPI_COMM_NULL;   // side channel: one note per MPI call per peer
  std::vector<int> world_ranks_;        // MPI_COMM_WORLD rank of each member
  long long calls_ = 0;                 // MPI calls entered on comm_
  std::vector<long long> seen_;         // the latest call each peer noted
  std::vector<std::chrono::steady_clock::time_point> heard_;  // when each peer's latest note came in
  std::vector<bool> closed_;            // the peer's closing note came in (it destroyed its side)
  std::vector<long long> note_out_;     // send buffers of the notes in flight
  std::vector<MPI_Request> note_req_;
  std::vector<bool> note_owed_;         // a note not sent (the previous one was in flight)
  bool poll_when_idle_ = false;         // MPI_THREAD_MULTIPLE: the idle thread drains notes too
  int dumps_answered_ = 0;              // peers that answered our dump request
  long long dump_note_out_ = 0;         // the send buffer of dump requests and answers
  std::unique_ptr<FlightRing> ring_;    // the flight recorder; null when off
  std::thread thread_;      // started last, by Create
};

}  // namespace shardgpt
