// NcclCommunicator (see the header): NCCL collectives on a communication stream, events against
// the compute stream, MPI for bootstrap and control, a watchdog against hangs.
#include "parallel/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "base/clock.h"
#include "model/cuda/cuda_device.h"
#include "parallel/flight_dump.h"
#include "parallel/gpu_binding.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {

namespace {


std::string NcclText(ncclResult_t r) { return std::string(ncclGetErrorString(r)) + " (" + std::to_string(r) + ")"; }

ncclDataType_t NcclType(DType d) { return d == DType::kF32 ? ncclFloat32 : ncclBfloat16; }
ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

// Ends the process: the one error line, then exit status 1 (mpirun/srun end the other ranks).
[[noreturn]] void Fatal(int rank, const std::string& what) {
  std::fprintf(stderr, "shardgpt: error: rank %d: NCCL: %s\n", rank, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// A collective in flight: the event recorded after it on the communication stream.
class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, cudaStream_t compute) : done_(done), compute_(compute) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  void Wait() override {
    if (!waited_) cudaEventSynchronize(done_);
    waited_ = true;
  }
  void WaitStream() override { cudaStreamWaitEvent(compute_, done_, 0); }
  bool IsCompleted() override {
    if (waited_) return true;
    waited_ = cudaEventQuery(done_) == cudaSuccess;
    return waited_;
  }

 private:
  cudaEvent_t done_;
  cudaStream_t compute_;
  bool waited_ = false;
};

// The communication stream of a rank, shared by a communicator and every one split from it, so
// that all NCCL collectives of the rank run in one issue order (the header: one stream). The
// last owner destroys it, after each owner has drained it.
struct CommStream {
  CommStream(int device, cudaStream_t s) : device(device), stream(s) {}
  ~CommStream() {
    cudaSetDevice(device);
    cudaStreamDestroy(stream);
  }
  const int device;
  const cudaStream_t stream;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<MpiCommunicator> control, ncclComm_t nccl, int device, cudaStream_t compute,
                   std::shared_ptr<CommStream> comm_stream, double timeout_s)
      : control_(std::move(control)),
        nccl_(nccl),
        device_(device),
        compute_(compute),
        shared_stream_(std::move(comm_stream)),
        stream_(shared_stream_->stream),
        timeout_s_(timeout_s),
        rank_(control_->rank()),
        world_(control_->world_size()) {
    if (FlightRing* ctl = control_->flight_ring()) ring_ = MakeFlightRing("nccl", rank_, ctl->world_ranks());
    watchdog_ = std::thread([this] { Watch(); });
  }
  // Drain, then finalize; nothing here can block forever. The drain runs while the watchdog
  // still watches (it is joined after): a collective that never completes is aborted by it
  // after --comm-timeout (the process ends with its error line). ncclCommFinalize waits for
  // the peers' side of the communicator; a peer that died leaves it in progress, so it is
  // polled up to --comm-timeout and the communicator aborted instead (one warning line).
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);  // also the work of communicators sharing the stream
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (held_queued_at_ >= 0)
      std::fprintf(stderr,
                   "nccl watchdog: rank %d: the held collective waited %.2f s to start, watched (--comm-timeout %g s)\n",
                   rank_, TestHold().released_at.load() - held_queued_at_, timeout_s_);
    for (const InFlight& f : inflight_) {
      cudaEventDestroy(f.started);
      cudaEventDestroy(f.done);
    }
    Finalize();
  }

  bool stream_ordered() const override { return true; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    ledger_.Add(CollKind::kAllReduce, CommLedger::RingBytes(CollKind::kAllReduce, count, dtype, world_));
    NoteIssued(CollKind::kAllReduce, count);
    return Launch("ncclAllReduce", Record(FlightOp::kAllReduce, dtype, count, count * DTypeSize(dtype)), [&] { return ncclAllReduce(buf, buf, count, NcclType(dtype), NcclOp(op), nccl_, stream_); });
  }
  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                      ReduceOp op) override {
    ledger_.Add(CollKind::kReduceScatter, CommLedger::RingBytes(CollKind::kReduceScatter, recv_count, dtype, world_));
    NoteIssued(CollKind::kReduceScatter, recv_count);
    // NCCL allows recv to be rank r's block of send (in place); any other overlap is refused,
    // as by MpiCommunicator.
    return Launch("ncclReduceScatter",
                  Record(FlightOp::kReduceScatter, dtype, recv_count, recv_count * DTypeSize(dtype) * world_), [&] {
      return ncclReduceScatter(send, recv, recv_count, NcclType(dtype), NcclOp(op), nccl_, stream_);
    });
  }
  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t send_count, DType dtype) override {
    ledger_.Add(CollKind::kAllGather, CommLedger::RingBytes(CollKind::kAllGather, send_count, dtype, world_));
    NoteIssued(CollKind::kAllGather, send_count);
    return Launch("ncclAllGather",
                  Record(FlightOp::kAllGather, dtype, send_count, send_count * DTypeSize(dtype) * world_), [&] { return ncclAllGather(send, recv, send_count, NcclType(dtype), nccl_, stream_); });
  }
  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= world_)
      return std::make_shared<CompletedWork>(Status::InvalidArgument("Broadcast: root out of range"));
    ledger_.Add(CollKind::kBroadcast, CommLedger::RingBytes(CollKind::kBroadcast, count, dtype, world_));
    NoteIssued(CollKind::kBroadcast, count);
    return Launch("ncclBroadcast", Record(FlightOp::kBroadcast, dtype, count, count * DTypeSize(dtype)), [&] { return ncclBroadcast(buf, buf, count, NcclType(dtype), root, nccl_, stream_); });
  }

  // ncclSend / ncclRecv to every peer inside one group (NCCL's documented all-to-all-v
  // pattern); the self block is a send to and a receive from this rank, which NCCL copies.
  std::shared_ptr<Work> AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                  const std::vector<size_t>& recv_counts, DType dtype) override {
    if (send_counts.size() != static_cast<size_t>(world_) || recv_counts.size() != static_cast<size_t>(world_))
      return std::make_shared<CompletedWork>(Status::InvalidArgument("AllToAllV: need one count per rank"));
    ledger_.Add(CollKind::kAllToAll, CommLedger::AllToAllBytes(send_counts, rank_, dtype));
    size_t sent = 0;
    for (size_t c : send_counts) sent += c;
    NoteIssued(CollKind::kAllToAll, sent);
    const size_t esize = DTypeSize(dtype);
    return Launch("ncclSend/ncclRecv (all-to-all-v)", Record(FlightOp::kAllToAll, dtype, sent, sent * esize),
                  [&]() -> ncclResult_t {
      ncclResult_t r = ncclGroupStart();
      size_t so = 0, ro = 0;
      for (int j = 0; j < world_ && (r == ncclSuccess || r == ncclInProgress); j++) {
        if (send_counts[j] > 0)
          r = ncclSend(static_cast<const char*>(send) + so * esize, send_counts[j], NcclType(dtype), j, nccl_, stream_);
        if (recv_counts[j] > 0 && (r == ncclSuccess || r == ncclInProgress))
          r = ncclRecv(static_cast<char*>(recv) + ro * esize, recv_counts[j], NcclType(dtype), j, nccl_, stream_);
        so += send_counts[j], ro += recv_counts[j];
      }
      const ncclResult_t end = ncclGroupEnd();
      return (r == ncclSuccess || r == ncclInProgress) ? end : r;
    });
  }

  // Control plane on MPI, after every collective queued before it (stream order).
  Status Barrier() override {
    Drain();
    return control_->Barrier();
  }
  bool AllTrue(bool local) override {
    Drain();
    return control_->AllTrue(local);
  }
  double AllReduceScalar(double value, ReduceOp op) override {
    Drain();
    return control_->AllReduceScalar(value, op);
  }
  Status ControlAllGather(const void* send, void* recv, size_t bytes) override {
    return control_->ControlAllGather(send, recv, bytes);
  }
  Status ControlBroadcast(void* buf, size_t bytes, int root) override {
    return control_->ControlBroadcast(buf, bytes, root);
  }
  // The control plane is MPI: the duplicate is an MPI communicator of its own.
  StatusOr<std::unique_ptr<Communicator>> DuplicateControl() override { return control_->DuplicateControl(); }

  CommLedger& ledger() override { return ledger_; }
  // The data plane's ring; the control plane's calls are in the MPI communicator's.
  FlightRing* flight_ring() override { return ring_.get(); }

  // HSDP: the control plane split with MPI_Comm_split, the data plane with ncclCommSplit (it
  // shares the parent's bootstrap: no new unique id), on the parent's communication stream: one
  // stream for all NCCL collectives of this rank, so the GPU runs them in issue order and the
  // shard and replica groups never hold the GPU for each other (the header: issue order).
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    Drain();
    auto ctl = control_->Split(color, key);
    if (!ctl.ok()) return ctl.status();
    // MpiCommunicator::Split makes an MpiCommunicator
    std::unique_ptr<MpiCommunicator> control(static_cast<MpiCommunicator*>(ctl.value().release()));
    cudaSetDevice(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // as the parent: a stuck split is timed out and aborted
    ncclComm_t part = nullptr;
    ncclResult_t r = ncclCommSplit(nccl_, color, key, &part, &config);
    const double t0 = MonotonicSeconds();
    while (r == ncclInProgress && part != nullptr) {
      if (MonotonicSeconds() - t0 > timeout_s_) {
        ncclCommAbort(part);
        part = nullptr;
        r = ncclSystemError;
        break;
      }
      usleep(1000);
      ncclCommGetAsyncError(part, &r);
    }
    Status st = r == ncclSuccess && part != nullptr
                    ? Status::OK()
                    : Status::Internal("NCCL: ncclCommSplit failed on rank " + std::to_string(rank_) + ": " +
                                       NcclText(r) + (MonotonicSeconds() - t0 > timeout_s_ ? " (timed out after --comm-timeout)" : ""));
    if (!control->AllTrue(st.ok())) {
      if (part) ncclCommAbort(part);
      return st.ok() ? Status::Internal("") : st;
    }
    auto split = std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(std::move(control), part, device_, compute_, shared_stream_, timeout_s_));
    if (split->ring_) split->ring_->SetName("nccl-split");
    return std::unique_ptr<Communicator>(std::move(split));
  }

 private:
  // Waits (host) for the communication stream; the watchdog guards against a hang.
  void Drain() {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
  }

  // Orders the collective after the compute stream's work so far, records its "started" event
  // (the stream reaches it when that work and every collective issued before, of any
  // communicator on the stream, are done), issues it, records its completion event and hands
  // both to the watchdog.
  uint64_t Record(FlightOp op, DType dtype, uint64_t count, uint64_t bytes) {
    return ring_ ? ring_->Record(op, dtype, count, bytes) : 0;
  }

  template <typename Issue>
  std::shared_ptr<Work> Launch(const char* name, uint64_t seq, Issue issue) {
    cudaSetDevice(device_);
    cudaEvent_t ready = nullptr, started = nullptr, done = nullptr, watch = nullptr;
    cudaEvent_t* events[] = {&ready, &started, &done, &watch};
    for (cudaEvent_t* e : events)
      if (cudaEventCreateWithFlags(e, cudaEventDisableTiming) != cudaSuccess)
        Fatal(rank_, std::string(name) + ": cannot create a CUDA event: " + cudaGetErrorString(cudaGetLastError()));
    const double queued_at = MonotonicSeconds();
    const bool held = HoldComputeOnce(queued_at);
    cudaEventRecord(ready, compute_);
    cudaStreamWaitEvent(stream_, ready, 0);
    cudaEventDestroy(ready);  // destruction is deferred until the wait has been satisfied
    cudaEventRecord(started, stream_);
    ncclResult_t r = issue();
    // non-blocking communicator: the call may still be in progress; wait for it to be enqueued
    const double t0 = MonotonicSeconds();
    while (r == ncclInProgress) {
      if (MonotonicSeconds() - t0 > timeout_s_) Abort(std::string(name) + " was not enqueued within the timeout");
      ncclCommGetAsyncError(nccl_, &r);
    }
    if (r != ncclSuccess) Abort(std::string(name) + " failed: " + NcclText(r) + ": " + ncclGetLastError(nccl_));
    cudaEventRecord(done, stream_);
    cudaEventRecord(watch, stream_);  // the watchdog's own event: the Work's may die before it is queried
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_.push_back(InFlight{started, watch, -1.0, name, seq, held});
      if (held) held_queued_at_ = queued_at;
    }
    cv_.notify_all();
    return std::make_shared<NcclWork>(done, compute_);
  }

  // ncclCommFinalize, polled up to the timeout, then ncclCommDestroy; ncclCommAbort (and one
  // warning line) when it fails or does not finish.
  void Finalize() {
    ncclResult_t r = ncclCommFinalize(nccl_);
    const double t0 = MonotonicSeconds();
    while (r == ncclInProgress && MonotonicSeconds() - t0 <= timeout_s_) {
      usleep(1000);
      ncclCommGetAsyncError(nccl_, &r);
    }
    if (r == ncclSuccess) {
      ncclCommDestroy(nccl_);
      return;
    }
    ncclCommAbort(nccl_);
    char buf[96];
    std::snprintf(buf, sizeof(buf), "did not finish within --comm-timeout %.0f s", timeout_s_);
    std::fprintf(stderr, "shardgpt: warning: rank %d: NCCL: ncclCommFinalize %s (a peer probably died); aborted the communicator\n",
                 rank_, r == ncclInProgress ? buf : ("failed: " + NcclText(r)).c_str());
    std::fflush(stderr);
  }

  // This rank's flight dump and its peers' (asked over the control communicator), then the
  // error line and the end of the process. With dumps on, the line carries the job's one verdict
  // (flight_dump.h): the first rank to claim it appends the dumps' analysis; any other names
  // that rank and waits, bounded, for its line before ending the process.
  [[noreturn]] void Abort(const std::string& why) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    bool claimed = false;
    const int lead = FlightDumpsConfigured() ? ClaimJobVerdict(world_rank, &claimed) : -1;
    control_->RequestFlightDumps("nccl_watchdog");
    ncclCommAbort(nccl_);
    if (claimed) {
      const std::string job = JobVerdictFromDumps();
      std::string line = why;
      if (!job.empty()) line += "; the job's verdict from the flight dumps (shardgpt diagnose " + FlightDumpDir() + "): " + job;
      std::fprintf(stderr, "shardgpt: error: rank %d: NCCL: %s\n", rank_, line.c_str());
      std::fflush(stderr);
      MarkJobVerdictPrinted();
      std::_Exit(1);
    }
    if (lead < 0) Fatal(rank_, why);
    std::fprintf(stderr, "shardgpt: error: rank %d: NCCL: %s; the job's verdict is rank %d's (from the flight dumps in %s)\n",
                 rank_, why.c_str(), lead, FlightDumpDir().c_str());
    std::fflush(stderr);
    const double limit = std::min(60.0, std::max(10.0, timeout_s_)) + 30.0, t0 = MonotonicSeconds();
    while (!JobVerdictPrinted() && MonotonicSeconds() - t0 < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::_Exit(1);
  }

  // The watchdog: every 100 ms, retire completed collectives and check NCCL's asynchronous
  // error and the age of the oldest unfinished collective. The age counts from the first time
  // the watchdog saw its "started" event complete, not from the launch: the compute it waited
  // for and the collectives queued before it on the stream are not its time.
  void Watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (!inflight_.empty() && inflight_.front().held) TestHold().watched = true;  // before any query may block
      while (!inflight_.empty()) {
        const cudaError_t q = cudaEventQuery(inflight_.front().done);
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) Abort(std::string(inflight_.front().name) + ": CUDA error: " + cudaGetErrorString(q));
        if (inflight_.front().seq != 0) {
          if (inflight_.front().started_at < 0) ring_->Started(inflight_.front().seq);
          ring_->Completed(inflight_.front().seq, true);
        }
        cudaEventDestroy(inflight_.front().started);
        cudaEventDestroy(inflight_.front().done);
        inflight_.pop_front();
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(nccl_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        Abort("asynchronous error: " + NcclText(async) + ": " + ncclGetLastError(nccl_) +
              " (another rank or its GPU probably failed)");
      if (inflight_.empty()) continue;
      InFlight& f = inflight_.front();
      if (f.started_at < 0) {
        const cudaError_t q = cudaEventQuery(f.started);
        if (q == cudaSuccess) {
          f.started_at = MonotonicSeconds();
          if (f.seq != 0) ring_->Started(f.seq);
        }
        else if (q != cudaErrorNotReady) Abort(std::string(f.name) + ": CUDA error: " + cudaGetErrorString(q));
      }
      if (f.started_at >= 0 && MonotonicSeconds() - f.started_at > timeout_s_) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "%s did not complete within --comm-timeout %.0f s of starting", f.name,
                      timeout_s_);
        Abort(std::string(buf) + " (another rank probably died or hangs); aborting the communicator");
      }
    }
  }

  // Both events owned by the watchdog (destroyed when retired, or by the destructor).
  struct InFlight {
    cudaEvent_t started;  // recorded on the stream just before the collective
    cudaEvent_t done;     // recorded just after it
    double started_at;    // when the watchdog first saw `started` complete; < 0: not yet
    const char* name;
    uint64_t seq;         // its flight recorder entry (0: none)
    bool held;            // the test hook's held collective (HoldComputeOnce)
  };

  // Test hook (SHARDGPT_TEST_NCCL_HOLD_COMPUTE_S=S): the process's first collective is queued
  // behind a host function on the compute stream that returns only when S seconds have passed
  // since the collective was queued and the watchdog has seen that collective in flight, so it
  // waits at least S seconds to start under the watchdog's eyes, whatever the machine's speed.
  // The communicator that issued it prints that wait on destruction (the watchdog test holds it
  // above --comm-timeout: its premise). Returns whether this collective is the held one.
  struct Hold {
    std::atomic<bool> taken{false}, watched{false};
    std::atomic<double> released_at{-1};
    double until = 0;
  };
  static Hold& TestHold() {
    static Hold h;
    return h;
  }
  bool HoldComputeOnce(double queued_at) {
    const char* env = std::getenv("SHARDGPT_TEST_NCCL_HOLD_COMPUTE_S");
    Hold& h = TestHold();
    if (!env || h.taken.exchange(true)) return false;
    h.until = queued_at + std::atof(env);
    cudaLaunchHostFunc(
        compute_,
        [](void*) {
          Hold& h = TestHold();
          while (MonotonicSeconds() < h.until || !h.watched.load())
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          h.released_at = MonotonicSeconds();
        },
        nullptr);
    return true;
  }

  std::unique_ptr<MpiCommunicator> control_;
  ncclComm_t nccl_;
  const int device_;
  const cudaStream_t compute_;
  const std::shared_ptr<CommStream> shared_stream_;  // shared with the communicators split from this one
  const cudaStream_t stream_;                        // shared_stream_->stream
  const double timeout_s_;
  const int rank_, world_;
  CommLedger ledger_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InFlight> inflight_;  // guarded by mu_
  double held_queued_at_ = -1;     // when the test hook's held collective was queued (mu_); < 0: none
  bool stop_ = false;              // guarded by mu_
  std::unique_ptr<FlightRing> ring_;  // null when the recorder is off
  std::thread watchdog_;
};

}  // namespace

std::string NcclVersionString() {
  int v = 0;
  ncclGetVersion(&v);
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(MPI_Comm comm, Device& device,
                                                               const NcclOptions& options) {
  auto control_or = MpiCommunicator::Create(comm, nullptr);
  if (!control_or.ok()) return control_or.status();
  std::unique_ptr<MpiCommunicator> control = std::move(control_or.value());
  // The control calls get the same watchdog; with it, the control communicator's idle thread
  // answers a peer's flight dump request while this rank hangs elsewhere.
  control->SetTimeout(options.timeout_s);
  const int rank = control->rank(), world = control->world_size();
  const int ordinal = CudaDeviceOrdinal(device);
  Status st = ordinal < 0 ? Status::InvalidArgument("--comm nccl needs --device cuda") : Status::OK();
  if (!control->AllTrue(st.ok())) return st.ok() ? Status::Internal("") : st;
  // One GPU per rank: every rank's (machine, PCI bus id), decided alike on every rank from the
  // same gathered list, so all ranks return the same error together (parallel/gpu_binding.h).
  auto gpus = GatherRankGpus(*control, RankGpu{ThisHostName(), CudaPciBusId(device), ThisMachineId()});
  if (!gpus.ok()) return gpus.status();
  const std::string shared = SharedGpuError(gpus.value());
  if (!shared.empty()) return Status::InvalidArgument(shared);

  // Bootstrap: rank 0's unique id, broadcast over MPI.
  ncclUniqueId id{};
  ncclResult_t r = rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
  st = r == ncclSuccess ? Status::OK() : Status::Internal("NCCL: ncclGetUniqueId failed: " + NcclText(r));
  if (!control->AllTrue(st.ok())) return st.ok() ? Status::Internal("") : st;
  SHARDGPT_RETURN_IF_ERROR(control->ControlBroadcast(&id, sizeof(id), 0));

  cudaSetDevice(ordinal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a stuck initialisation can be timed out and aborted
  ncclComm_t nccl = nullptr;
  r = ncclCommInitRankConfig(&nccl, world, id, rank, &config);
  const double t0 = MonotonicSeconds();
  while (r == ncclInProgress) {
    if (MonotonicSeconds() - t0 > options.timeout_s) {
      ncclCommAbort(nccl);
      r = ncclSystemError;
      break;
    }
    usleep(1000);
    ncclCommGetAsyncError(nccl, &r);
  }
  if (r != ncclSuccess) {
    st = Status::Internal("NCCL: initialisation failed on rank " + std::to_string(rank) + ": " + NcclText(r) + ": " +
                          (nccl ? ncclGetLastError(nccl) : "") +
                          (MonotonicSeconds() - t0 > options.timeout_s ? " (timed out after --comm-timeout)" : ""));
  }
  if (!control->AllTrue(st.ok())) {
    if (nccl) ncclCommAbort(nccl);
    return st.ok() ? Status::Internal("") : st;
  }
  cudaStream_t stream = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  st = e == cudaSuccess ? Status::OK()
                        : Status::Internal("NCCL: cannot create the communication stream on rank " + std::to_string(rank) +
                                           ": " + cudaGetErrorString(e));
  if (!control->AllTrue(st.ok())) {
    if (stream) cudaStreamDestroy(stream);
    ncclCommAbort(nccl);
    return st.ok() ? Status::Internal("") : st;
  }
  auto* compute = static_cast<cudaStream_t>(CudaComputeStream(device));
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(control), nccl, ordinal, compute,
                                                            std::make_shared<CommStream>(ordinal, stream),
                                                            options.timeout_s));
}

}  // namespace shardgpt
