// MpiCommunicator: one FIFO, one communication thread, blocking MPI calls (see the header).
#include "parallel/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/bf16.h"
#include "parallel/flight_dump.h"
#include "parallel/stall_verdict.h"
#include "parallel/straggler.h"

namespace shardgpt {

// Completion flag plus outcome, set once by the communication thread.
class MpiWork final : public Work {
 public:
  void Wait() override {
    if (done_.load(std::memory_order_acquire)) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_.load(std::memory_order_acquire); });
  }
  // Only reads the flag: never touches MPI. The release/acquire pair makes the output
  // buffer written by the communication thread visible to the caller.
  bool IsCompleted() override { return done_.load(std::memory_order_acquire); }
  Status status() override {
    Wait();
    return status_;  // written before done_ was released, never after
  }
  void Complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  Status status_;
};

namespace {

// MPI counts are int: all-reduce and broadcast are split into chunks of this many elements.
constexpr size_t kMaxChunk = size_t{1} << 30;

Status MpiError(int rc, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  return Status::Internal(std::string(call) + " failed: " +
                          (len > 0 ? std::string(text, len) : "MPI error " + std::to_string(rc)));
}

// Converts an MPI error code to a Status at the call.
#define SHARDGPT_MPI_CALL(call, name)                   \
  do {                                                  \
    int _rc = (call);                                   \
    if (_rc != MPI_SUCCESS) return MpiError(_rc, name); \
  } while (0)

// A nonblocking MPI call on the communication thread, then Await on its request: the
// watchdog and the backoff wait instead of MPI's own polling inside a blocking call. `call`
// names the request `_req`.
#define SHARDGPT_MPI_AWAIT(call, name)                  \
  do {                                                  \
    MPI_Request _req = MPI_REQUEST_NULL;                \
    int _rc = (call);                                   \
    if (_rc != MPI_SUCCESS) return MpiError(_rc, name); \
    SHARDGPT_RETURN_IF_ERROR(Await(&_req, name));       \
  } while (0)

std::atomic<long long> g_diagnostic_step{-1};

// This process's latest own pause, as any communicator's watchdog saw it (a pause stops every
// thread), and whether its line was printed.
std::mutex g_pause_mu;
SelfPause g_pause;                                  // guarded by g_pause_mu
std::chrono::steady_clock::time_point g_pause_end;  // guarded by g_pause_mu
std::atomic<bool> g_pause_said{false};

// The pause sentinel: one thread per process that looks at the clock every heartbeat, whatever
// the communicators are doing. A pause while every communication thread sleeps without a timer
// (the training thread computing) is visible only here. Started by the first call of a
// communicator with a watchdog; its heartbeat is that communicator's.
std::once_flag g_sentinel_once;
std::atomic<long long> g_sentinel_period_ns{0};  // 0: not started
std::atomic<long long> g_sentinel_look_ns{0};    // steady clock of the sentinel's latest look

long long SteadyNs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// A gap of more than three heartbeats between two looks at the clock, ending at `now`: this
// process's own pause. Records it (the latest one wins) and returns true.
bool RecordPause(double gap_s, double heartbeat_s, std::chrono::steady_clock::time_point now) {
  const SelfPause pause = DetectSelfPause({0.0, gap_s}, heartbeat_s);
  if (pause.paused_s <= 0) return false;
  {
    std::lock_guard<std::mutex> lock(g_pause_mu);
    g_pause = pause;
    g_pause_end = now;
  }
  g_pause_said.store(false);
  return true;
}

// The sentinel's latest look is more than three heartbeats old: the process was paused and has
// just resumed, before the sentinel looked again. Records the pause like the sentinel would.
void CheckSentinel() {
  const long long period = g_sentinel_period_ns.load();
  if (period == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const long long look = g_sentinel_look_ns.load();
  if (SteadyNs(now) - look > 3 * period) RecordPause((SteadyNs(now) - look) * 1e-9, period * 1e-9, now);
}

void StartPauseSentinel(double heartbeat_s) {
  std::call_once(g_sentinel_once, [heartbeat_s] {
    const auto period = std::chrono::nanoseconds(static_cast<long long>(heartbeat_s * 1e9));
    g_sentinel_look_ns.store(SteadyNs(std::chrono::steady_clock::now()));
    g_sentinel_period_ns.store(period.count());
    // detached: it only sleeps and reads the clock, and ends with the process
    std::thread([period] {
      for (;;) {
        std::this_thread::sleep_for(period);
        const auto now = std::chrono::steady_clock::now();
        const long long last = g_sentinel_look_ns.exchange(SteadyNs(now));
        RecordPause((SteadyNs(now) - last) * 1e-9, period.count() * 1e-9, now);
      }
    }).detach();
  });
}

// The closing note: the last message a rank sends to each peer on a side channel (arrival notes
// carry call numbers, which start at 1).
constexpr long long kClosingNote = -1;
// Flight dumps: a rank whose watchdog expired asks every peer for its dump (kDumpRequest), and
// each answers once it wrote it (kDumpAnswer).
constexpr long long kDumpRequest = -2;
constexpr long long kDumpAnswer = -3;

// The side channel (arrivals_) of a destroyed communicator, kept until no message can reach it
// any more. Its notes are sent without a matching receive, and Open MPI's ob1 must never get a
// message for a freed context id: it keeps such a message for the next communicator given that
// id, on a list that communicator creation (mca_pml_ob1_add_comm) walks unlocked while progress
// on another thread appends to it. So each rank ends the channel with a closing note to every
// peer (after all its other notes: MPI keeps one sender's messages in order on a communicator
// and tag), and the channel is freed only once the closing notes of all peers came in. Nothing
// waits for a peer: one that is still busy, or gone, only keeps its channel here a little
// longer (or until MPI_Finalize).
struct RetiredChannel {
  MPI_Comm comm = MPI_COMM_NULL;
  int open_peers = 0;               // peers whose closing note has not come in
  std::vector<bool> closed;         // per peer: its closing note came in
  std::vector<long long> notes;     // the buffers of our notes still in flight (moved here)
  long long closing = kClosingNote;  // the buffer of our closing notes
  std::vector<MPI_Request> sends;   // those notes and the closing ones
};

std::mutex g_retired_mu;
std::vector<std::unique_ptr<RetiredChannel>> g_retired;  // guarded by g_retired_mu

// Frees every retired channel that nothing can reach any more and whose own sends completed.
// Never blocks: it receives only messages already there (MPI_Iprobe first) and tests its sends
// (an eager send over shared memory may complete only once the peer took it in).
void ReapRetiredChannels() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  std::lock_guard<std::mutex> lock(g_retired_mu);
  for (auto it = g_retired.begin(); it != g_retired.end();) {
    RetiredChannel& r = **it;
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (r.open_peers == 0 || MPI_Iprobe(MPI_ANY_SOURCE, 0, r.comm, &flag, &status) != MPI_SUCCESS || !flag) break;
      long long note = 0;
      if (MPI_Recv(&note, 1, MPI_LONG_LONG, status.MPI_SOURCE, 0, r.comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (note == kClosingNote && !r.closed[status.MPI_SOURCE]) {
        r.closed[status.MPI_SOURCE] = true;
        r.open_peers--;
      }
    }
    int sent = 0;
    if (MPI_Testall(static_cast<int>(r.sends.size()), r.sends.data(), &sent, MPI_STATUSES_IGNORE) != MPI_SUCCESS) sent = 0;
    if (r.open_peers == 0 && sent) {
      MPI_Comm_free(&r.comm);
      it = g_retired.erase(it);
    } else {
      ++it;
    }
  }
}

MPI_Datatype MpiType(DType dtype) { return dtype == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T; }

// User-defined reduction for bf16 bits: inout[i] = bf16(fp32(in[i]) + fp32(inout[i])).
// Commutative (fp32 addition is), so MPI may use any tree.
void Bf16Sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  const int n = *len;
  for (int i = 0; i < n; ++i) b[i] = FloatToBf16(Bf16ToFloat(a[i]) + Bf16ToFloat(b[i]));
}

// kAvg after a sum: divide by the world size. Division (not a multiply by 1/N) is exact
// whenever the quotient is representable.
void DivideInPlace(void* buf, size_t count, DType dtype, int world) {
  const float n = static_cast<float>(world);
  if (dtype == DType::kF32) {
    float* p = static_cast<float*>(buf);
    for (size_t i = 0; i < count; ++i) p[i] /= n;
  } else {
    uint16_t* p = static_cast<uint16_t*>(buf);
    for (size_t i = 0; i < count; ++i) p[i] = FloatToBf16(Bf16ToFloat(p[i]) / n);
  }
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

std::shared_ptr<Work> Refused(std::string msg) {
  return std::make_shared<CompletedWork>(Status::InvalidArgument(std::move(msg)));
}

// Where a staged collective's buffers lie in the host staging area. Only real spans are
// staged: a side with 0 bytes or a null pointer has none (its host pointer is null), wherever
// its device pointer points. Overlapping sides (in place) share one span, so the collective
// sees the same aliasing on the host as on the device; disjoint sides lie back to back.
struct StagingLayout {
  bool has_send = false, has_recv = false;
  size_t bytes = 0;                 // the host span
  size_t send_at = 0, recv_at = 0;  // offsets of the two sides in it
};

StagingLayout LayOut(const void* send, size_t send_bytes, const void* recv, size_t recv_bytes) {
  StagingLayout l;
  l.has_send = send != nullptr && send_bytes > 0;
  l.has_recv = recv != nullptr && recv_bytes > 0;
  if (l.has_send && l.has_recv && Overlaps(send, send_bytes, recv, recv_bytes)) {
    const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
    const uintptr_t lo = std::min(s, r);
    l.bytes = std::max(s + send_bytes, r + recv_bytes) - lo;
    l.send_at = s - lo, l.recv_at = r - lo;
  } else {
    l.bytes = (l.has_send ? send_bytes : 0) + (l.has_recv ? recv_bytes : 0);
    l.recv_at = l.has_send ? send_bytes : 0;
  }
  return l;
}

}  // namespace

StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(MPI_Comm comm, Device* device) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return Status::Internal("MpiCommunicator: MPI is not initialised (call MPI_Init_thread first)");
  }
  int provided = MPI_THREAD_SINGLE;
  SHARDGPT_MPI_CALL(MPI_Query_thread(&provided), "MPI_Query_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    return Status::Internal(
        "MpiCommunicator: MPI thread level " + std::to_string(provided) +
        " is too low; the communication thread needs MPI_THREAD_SERIALIZED (" +
        std::to_string(MPI_THREAD_SERIALIZED) + ") or better from MPI_Init_thread");
  }
  if (comm == MPI_COMM_NULL) return Status::InvalidArgument("MpiCommunicator: MPI_COMM_NULL");
  ReapRetiredChannels();  // the side channels of destroyed communicators that nothing can reach now
  MPI_Comm dup = MPI_COMM_NULL;
  SHARDGPT_MPI_CALL(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  // Errors come back as codes and become Status, instead of aborting the job.
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rank = 0;
  int world = 0;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &world);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Op op = MPI_OP_NULL;
  int rc = MPI_Op_create(&Bf16Sum, /*commute=*/1, &op);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&dup);
    return MpiError(rc, "MPI_Op_create");
  }
  // the watchdog's side channel (arrival notes) and the world rank of every member
  MPI_Comm arrivals = MPI_COMM_NULL;
  std::vector<int> world_ranks(static_cast<size_t>(world));
  rc = MPI_Comm_dup(dup, &arrivals);
  if (rc == MPI_SUCCESS) rc = MPI_Allgather(&world_rank, 1, MPI_INT, world_ranks.data(), 1, MPI_INT, dup);
  if (rc != MPI_SUCCESS) {
    if (arrivals != MPI_COMM_NULL) MPI_Comm_free(&arrivals);
    MPI_Op_free(&op);
    MPI_Comm_free(&dup);
    return MpiError(rc, "MPI_Comm_dup(watchdog)");
  }
  MPI_Comm_set_errhandler(arrivals, MPI_ERRORS_RETURN);
  auto c = std::unique_ptr<MpiCommunicator>(new MpiCommunicator(dup, rank, world, world_rank, op, device));
  c->arrivals_ = arrivals;
  c->world_ranks_ = std::move(world_ranks);
  c->seen_.assign(static_cast<size_t>(world), 0);
  c->heard_.assign(static_cast<size_t>(world), std::chrono::steady_clock::now());
  c->closed_.assign(static_cast<size_t>(world), false);
  c->note_out_.assign(static_cast<size_t>(world), 0);
  c->note_req_.assign(static_cast<size_t>(world), MPI_REQUEST_NULL);
  c->note_owed_.assign(static_cast<size_t>(world), false);
  c->ring_ = MakeFlightRing("world", rank, c->world_ranks_);
  c->poll_when_idle_ = provided >= MPI_THREAD_MULTIPLE;
  c->StartThread();
  return c;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int rank, int world, int world_rank, MPI_Op bf16_sum, Device* device)
    : comm_(comm), rank_(rank), world_(world), world_rank_(world_rank), bf16_sum_(bf16_sum),
      device_(device != nullptr && !device->host_accessible() ? device : nullptr) {}

void MpiCommunicator::StartThread() { thread_ = std::thread([this] { Loop(); }); }

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();  // Loop() drains the queue before it returns
  if (staging_ != nullptr) device_->FreeHost(staging_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    RetireArrivals();
    MPI_Op_free(&bf16_sum_);
    MPI_Comm_free(&comm_);  // only collectives ran on it: every message sent on it was received
  }
}

void MpiCommunicator::RetireArrivals() {
  auto r = std::make_unique<RetiredChannel>();
  r->comm = arrivals_;
  arrivals_ = MPI_COMM_NULL;
  r->closed = closed_;  // closing notes our communication thread already took in
  r->closed[static_cast<size_t>(rank_)] = true;
  r->open_peers = static_cast<int>(std::count(r->closed.begin(), r->closed.end(), false));
  // Our notes still in flight go with the channel (a moved vector keeps its buffer, which those
  // sends read), then one closing note to every peer. Nothing waits here for a peer.
  r->notes = std::move(note_out_);
  r->sends = note_req_;
  r->sends.resize(2 * static_cast<size_t>(world_), MPI_REQUEST_NULL);  // [world_ + p]: the closing note to p
  for (int p = 0; p < world_; p++) {
    MPI_Request& req = r->sends[static_cast<size_t>(world_ + p)];
    if (p != rank_ && MPI_Isend(&r->closing, 1, MPI_LONG_LONG, p, 0, r->comm, &req) != MPI_SUCCESS) req = MPI_REQUEST_NULL;
  }
  std::fill(note_req_.begin(), note_req_.end(), MPI_REQUEST_NULL);
  {
    std::lock_guard<std::mutex> lock(g_retired_mu);
    g_retired.push_back(std::move(r));
  }
  ReapRetiredChannels();
}

void MpiCommunicator::SetDiagnosticStep(long long step) { g_diagnostic_step.store(step); }

namespace {
std::string g_exclude_path;               // SetExcludeHostsOnTimeout: set before any collective
std::vector<std::string> g_exclude_hosts;  // hosts by world rank
}  // namespace

void MpiCommunicator::SetExcludeHostsOnTimeout(const std::string& path, const std::vector<std::string>& hosts) {
  g_exclude_path = path;
  g_exclude_hosts = hosts;
}

void MpiCommunicator::RecordCulpritHosts(const std::vector<int>& culprits) {
  if (g_exclude_path.empty()) return;
  const std::vector<std::string> hosts = HostsToExclude(culprits, g_exclude_hosts);
  if (hosts.empty()) return;
  std::string names;
  for (const std::string& h : hosts) names += (names.empty() ? "" : ", ") + h;
  const Status st = RecordExcludedHosts(g_exclude_path, hosts);
  if (st.ok())
    std::fprintf(stderr, "shardgpt: rank %d: the watchdog's verdict names host %s: recorded in %s\n", world_rank_,
                 names.c_str(), g_exclude_path.c_str());
  else
    std::fprintf(stderr, "shardgpt: warning: rank %d: cannot record host %s: %s\n", world_rank_, names.c_str(),
                 st.message().c_str());
  std::fflush(stderr);
}

size_t MpiCommunicator::RetiredChannels() {
  ReapRetiredChannels();
  std::lock_guard<std::mutex> lock(g_retired_mu);
  return g_retired.size();
}

void MpiCommunicator::Announce() {
  for (int p = 0; p < world_; p++) {
    if (p == rank_) continue;
    if (note_req_[p] != MPI_REQUEST_NULL) {  // the previous note to p still in flight: later
      int done = 0;
      MPI_Test(&note_req_[p], &done, MPI_STATUS_IGNORE);
      if (!done) {
        note_owed_[p] = true;
        continue;
      }
    }
    note_out_[p] = calls_;
    note_owed_[p] = false;
    if (MPI_Isend(&note_out_[p], 1, MPI_LONG_LONG, p, 0, arrivals_, &note_req_[p]) != MPI_SUCCESS)
      note_req_[p] = MPI_REQUEST_NULL;
  }
}

void MpiCommunicator::DrainNotes() {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, 0, arrivals_, &flag, &status) != MPI_SUCCESS || !flag) return;
    long long seq = 0;
    if (MPI_Recv(&seq, 1, MPI_LONG_LONG, status.MPI_SOURCE, 0, arrivals_, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    if (seq == kClosingNote) {  // the peer destroyed its side (after this call's last collective)
      closed_[status.MPI_SOURCE] = true;
    } else if (seq == kDumpRequest) {  // a peer's watchdog expired: our dump, then the answer
      // this rank's own recent pause is the likely cause: it says so, and names no peer
      SelfPause pause;
      if (PausedRecently(&pause) && !g_pause_said.exchange(true)) {
        std::fprintf(stderr, "shardgpt: error: rank %d: %s\n", world_rank_, SelfPauseText(pause).c_str());
        std::fflush(stderr);
      }
      WriteFlightDumpOnce(PausedRecently() ? "paused" : "peer_request");
      dump_note_out_ = kDumpAnswer;
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(&dump_note_out_, 1, MPI_LONG_LONG, status.MPI_SOURCE, 0, arrivals_, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);
    } else if (seq == kDumpAnswer) {
      dumps_answered_++;
    } else {
      seen_[status.MPI_SOURCE] = std::max(seen_[status.MPI_SOURCE], seq);
      heard_[status.MPI_SOURCE] = std::chrono::steady_clock::now();
    }
  }
}

Status MpiCommunicator::Await(MPI_Request* req, const char* name) {
  calls_++;
  if (world_ > 1) Announce();
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // While this rank waits inside the call it notes it again every heartbeat, so that a peer
  // that is silent although it noted the call is known to be stopped or hung inside it (not
  // waiting, as this rank is). Silence: three heartbeats missed.
  const double heartbeat_s = std::min(1.0, timeout_s_ / 4), silence_s = 3 * heartbeat_s;
  if (timeout_s_ > 0) StartPauseSentinel(heartbeat_s);
  auto announced = t0, deadline_from = t0, last_look = t0;
  int sleep_us = 20;
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(rc, name);
    const auto now = Clock::now();
    // This loop looks at least every 0.5 ms plus a heartbeat's work; a gap of several heartbeats
    // means this rank itself was paused (SIGSTOP and SIGCONT, a frozen VM): what it heard of its
    // peers is stale, so it neither accuses them nor counts the pause against the deadline. It
    // looks after every test, the last one included (a call that completes on resuming still
    // records the pause, for the dump request drained next).
    if (timeout_s_ > 0 && NotePause(last_look, now)) deadline_from = now;
    last_look = now;
    if (done) break;
    // The first millisecond spins: a collective the peers are already in (a large transfer
    // moving fragment by fragment included) completes at full speed in here.
    if (now - t0 < std::chrono::milliseconds(1)) continue;
    // The peers are busy (computing, or gone): sleep, doubling up to 0.5 ms, so the waiting
    // thread does not take a core from the compute threads it waits for.
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(2 * sleep_us, 500);
    // a pause in the sleep is known before the notes drained next are acted on
    if (timeout_s_ > 0) {
      const auto woke = Clock::now();
      if (NotePause(last_look, woke)) deadline_from = woke;
      last_look = woke;
    }
    if (world_ == 1) continue;
    bool owed = false;
    for (int p = 0; p < world_; p++) owed = owed || note_owed_[p];
    if (owed || (timeout_s_ > 0 && std::chrono::duration<double>(now - announced).count() >= heartbeat_s)) {
      Announce();
      announced = now;
    }
    if (timeout_s_ <= 0) continue;
    DrainNotes();
    const double waited = std::chrono::duration<double>(now - deadline_from).count();
    if (waited <= timeout_s_) continue;
    // Past the deadline with every peer heard from recently: wait one silence longer, so that a
    // peer stopped just after its latest note is told apart from MPI being stuck.
    std::vector<int> culprits;
    std::string verdict = Verdict(silence_s, &culprits);
    if (!verdict.empty() || waited > timeout_s_ + silence_s) {
      if (!PausedRecently()) RecordCulpritHosts(culprits);  // a paused rank names no peer's host
      TimedOut(name, verdict);
    }
  }
  if (world_ > 1) DrainNotes();
  return Status::OK();
}

bool MpiCommunicator::NotePause(std::chrono::steady_clock::time_point last, std::chrono::steady_clock::time_point now) {
  if (!RecordPause(std::chrono::duration<double>(now - last).count(), std::min(1.0, timeout_s_ / 4), now)) return false;
  for (auto& h : heard_) h = now;
  return true;
}

bool MpiCommunicator::PausedRecently(SelfPause* pause) const {
  CheckSentinel();
  std::lock_guard<std::mutex> lock(g_pause_mu);
  if (pause != nullptr) *pause = g_pause;
  return g_pause.paused_s > 0 &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - g_pause_end).count() <= timeout_s_;
}

double MpiCommunicator::DumpWaitLimit() const { return std::min(60.0, std::max(10.0, timeout_s_)); }

std::string MpiCommunicator::Verdict(double silence_s, std::vector<int>* culprits) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<PeerNotes> peers(static_cast<size_t>(world_));
  for (int p = 0; p < world_; p++)
    peers[p] = {seen_[p], std::chrono::duration<double>(now - heard_[p]).count()};
  if (culprits != nullptr) *culprits = StallCulprits(calls_, rank_, peers, silence_s, world_ranks_);
  return StallVerdict(calls_, rank_, peers, silence_s, world_ranks_);
}

void MpiCommunicator::DumpFlightEverywhere(const char* reason) {
  WriteFlightDumpOnce(reason);
  if (world_ <= 1 || arrivals_ == MPI_COMM_NULL || !FlightDumpsConfigured()) return;
  dump_note_out_ = kDumpRequest;
  std::vector<MPI_Request> reqs;
  int asked = 0;
  for (int p = 0; p < world_; p++) {
    if (p == rank_ || closed_[p]) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(&dump_note_out_, 1, MPI_LONG_LONG, p, 0, arrivals_, &req) == MPI_SUCCESS) reqs.push_back(req), asked++;
  }
  // A peer answers from its communication thread, which drains notes whether it is idle or
  // waiting in a call; a stopped or dead one never does: the wait is bounded.
  const double limit = DumpWaitLimit();
  const auto t0 = std::chrono::steady_clock::now();
  while (dumps_answered_ < asked &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit) {
    DrainNotes();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (MPI_Request& r : reqs) MPI_Request_free(&r);
}

void MpiCommunicator::RequestFlightDumps(const char* reason) {
  WriteFlightDumpOnce(reason);
  if (world_ <= 1 || arrivals_ == MPI_COMM_NULL || !FlightDumpsConfigured()) return;
  std::shared_ptr<Work> work = Enqueue([this, reason] {
    DumpFlightEverywhere(reason);
    return Status::OK();
  });
  const double limit = std::min(60.0, std::max(10.0, timeout_s_)) + 5.0;
  const auto t0 = std::chrono::steady_clock::now();
  while (!work->IsCompleted() &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void MpiCommunicator::TimedOut(const char* name, const std::string& verdict) {
  const long long step = g_diagnostic_step.load();
  char what[512];
  std::snprintf(what, sizeof(what),
                "%s (MPI call %lld on a communicator of %d rank(s), %s%lld) made no progress for %.0f s "
                "(--comm-timeout)",
                name, calls_, world_, step >= 0 ? "step " : "before step ", step >= 0 ? step : 1LL, timeout_s_);
  // this rank's own view: never its peers after its own pause
  SelfPause pause;
  const std::string own = PausedRecently(&pause) ? SelfPauseText(pause)
                          : verdict.empty() ? "every rank arrived and is waiting (MPI itself is stuck)"
                                            : verdict;
  const char* reason = PausedRecently() ? "paused" : "comm_timeout";  // diagnose names a paused rank
  auto say = [&](const std::string& text) {
    std::fprintf(stderr, "shardgpt: error: rank %d: %s: %s; ending the job\n", world_rank_, what, text.c_str());
    std::fflush(stderr);
  };
  bool claimed = false;
  const int lead = ClaimJobVerdict(world_rank_, &claimed);
  if (lead < 0) {  // no dumps to merge: this rank's own view, marked as such
    say("this rank's view: " + own);
    DumpFlightEverywhere(reason);
  } else if (!claimed) {
    // another rank prints the job's verdict: the dumps of this rank and of its peers (that rank
    // may not reach them all), answers to its dump request, and a bounded wait for its line
    // before the job ends
    std::fprintf(stderr, "shardgpt: error: rank %d: %s; the job's verdict is rank %d's (from the flight dumps in %s)\n",
                 world_rank_, what, lead, FlightDumpDir().c_str());
    std::fflush(stderr);
    DumpFlightEverywhere(reason);
    const auto t0 = std::chrono::steady_clock::now();
    while (!JobVerdictPrinted() &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < DumpWaitLimit() + 30) {
      if (arrivals_ != MPI_COMM_NULL) DrainNotes();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!JobVerdictPrinted()) say("rank " + std::to_string(lead) + " printed no verdict; this rank's view: " + own);
  } else {
    DumpFlightEverywhere(reason);
    const std::string job = JobVerdictFromDumps();
    say(job.empty() ? "this rank's view: " + own
                    : "the job's verdict from the flight dumps (shardgpt diagnose " + FlightDumpDir() + "): " + job);
    MarkJobVerdictPrinted();
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void MpiCommunicator::Loop() {
  bool ran = false;  // timeout_s_ is set before the first collective: read only after one
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // With the watchdog on, an idle thread still drains the side channel every heartbeat, so
      // that a peer's dump request is answered while this rank computes (or hangs) elsewhere
      // (under MPI_THREAD_MULTIPLE only: other threads may be inside MPI meanwhile).
      const bool poll = ran && poll_when_idle_ && timeout_s_ > 0 && world_ > 1;
      const auto heartbeat = std::chrono::duration<double>(std::min(1.0, timeout_s_ / 4));
      while (!stop_ && queue_.empty()) {
        if (!poll) {
          cv_.wait(lock);
          continue;
        }
        // a wait of several heartbeats is this rank's own pause, whether it ends by the timeout
        // or with work queued meanwhile (both threads resume together)
        const auto before = std::chrono::steady_clock::now();
        const bool woken = cv_.wait_for(lock, heartbeat, [this] { return stop_ || !queue_.empty(); });
        NotePause(before, std::chrono::steady_clock::now());
        if (!woken) {
          lock.unlock();
          DrainNotes();
          lock.lock();
        }
      }
      if (queue_.empty()) return;  // stop requested and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto t0 = std::chrono::steady_clock::now();
    agreed_failure_ = false;
    // Nothing may escape to std::terminate: an exception becomes this Work's error. (The
    // staging tasks catch their own, so that every rank stays in step; see the header.)
    Status st;
    ran = true;
    if (item.seq != 0) ring_->Started(item.seq);
    try {
      st = item.task();
    } catch (const std::exception& e) {
      st = Status::Internal("communication thread of rank " + std::to_string(world_rank_) + ": " + e.what());
    } catch (...) {
      st = Status::Internal("communication thread of rank " + std::to_string(world_rank_) + ": unknown exception");
    }
    busy_ns_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    if (item.seq != 0) ring_->Completed(item.seq, st.ok());
    if (!st.ok() && item.data_plane && end_job_on_failure_.load()) EndJob(st);
    item.work->Complete(std::move(st));
  }
}

void MpiCommunicator::EndJob(const Status& failure) {
  std::fprintf(stderr, "shardgpt: error: rank %d: %s\n", world_rank_, failure.message().c_str());
  std::fflush(stderr);
  // A failure every rank of this communicator knows: each prints its line before anyone ends
  // the job. Otherwise the others may be inside the collective: no barrier.
  if (agreed_failure_) MPI_Barrier(comm_);
  DumpFlightEverywhere("comm_failure");
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

std::shared_ptr<Work> MpiCommunicator::Enqueue(Task task, bool data_plane, uint64_t seq) {
  auto work = std::make_shared<MpiWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Item{std::move(task), work, data_plane, seq});
  }
  cv_.notify_one();
  return work;
}

Status MpiCommunicator::AgreeOnFailure(const Status& local) {
  int first = local.ok() ? world_ : rank_;  // the lowest failing rank, world_ for none
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm_, &req);
  Status waited = rc == MPI_SUCCESS ? Await(&req, "MPI_Allreduce(staging outcome)") : MpiError(rc, "MPI_Allreduce(staging outcome)");
  if (!waited.ok()) return local.ok() ? waited : local;
  if (first >= world_) return Status::OK();
  // that rank's message to every rank, so that all Works fail with the same text
  std::string msg = first == rank_ ? local.message() : std::string();
  int len = static_cast<int>(msg.size());
  rc = MPI_Ibcast(&len, 1, MPI_INT, first, comm_, &req);
  if (rc == MPI_SUCCESS) rc = Await(&req, "MPI_Bcast(staging outcome)").ok() ? MPI_SUCCESS : MPI_ERR_OTHER;
  if (rc == MPI_SUCCESS) {
    msg.resize(static_cast<size_t>(len));
    rc = MPI_Ibcast(&msg[0], len, MPI_CHAR, first, comm_, &req);
    if (rc == MPI_SUCCESS) rc = Await(&req, "MPI_Bcast(staging outcome)").ok() ? MPI_SUCCESS : MPI_ERR_OTHER;
  }
  if (rc != MPI_SUCCESS) msg = "a collective failed on rank " + std::to_string(first) + " of this communicator";
  agreed_failure_ = true;
  return Status::Internal(msg);
}

std::shared_ptr<Work> MpiCommunicator::Submit(CollKind kind, Body body, const void* send, size_t send_bytes,
                                              void* recv, size_t recv_bytes, uint64_t seq) {
  if (device_ == nullptr) return Enqueue([body, send, recv]() { return body(send, recv); }, /*data_plane=*/true, seq);
  std::shared_ptr<DeviceEvent> ready = device_->RecordEvent();  // the producer of `send`
  return Enqueue([this, kind, body, send, send_bytes, recv, recv_bytes, ready]() -> Status {
    const StagingLayout l = LayOut(send, send_bytes, recv, recv_bytes);
    auto failed = [this, kind](const char* step, const char* what) {
      return Status::Internal(std::string(CollKindName(kind)) + " failed on rank " + std::to_string(world_rank_) +
                              ": " + step + ": " + what);
    };
    char* host_send = nullptr;
    char* host_recv = nullptr;
    Status in;
    try {
      ready->Synchronize();
      char* host = l.bytes > 0 ? Staging(l.bytes) : nullptr;
      if (l.has_send) host_send = host + l.send_at;
      if (l.has_recv) host_recv = host + l.recv_at;
      if (l.has_send) device_->StageToHost(host_send, send, send_bytes);
    } catch (const std::exception& e) {
      in = failed("copying its input to host memory", e.what());
    } catch (...) {
      in = failed("copying its input to host memory", "unknown exception");
    }
    // Every rank enters the MPI calls, or none does: one that stayed out would leave the
    // others waiting inside them forever.
    SHARDGPT_RETURN_IF_ERROR(AgreeOnFailure(in));
    Status st = body(host_send, host_recv);
    if (!st.ok()) return st;  // an MPI error, this rank's own (MPI itself may be broken: no agreement)
    Status out;
    try {
      if (l.has_recv) device_->StageToDevice(recv, host_recv, recv_bytes);
    } catch (const std::exception& e) {
      out = failed("copying its output back to the device", e.what());
    } catch (...) {
      out = failed("copying its output back to the device", "unknown exception");
    }
    return AgreeOnFailure(out);
  }, /*data_plane=*/true, seq);
}

char* MpiCommunicator::Staging(size_t bytes) {
  if (bytes > staging_bytes_) {
    const size_t grown = std::max(bytes, 2 * staging_bytes_);
    // the new area first: a failed allocation leaves the old one in place
    char* p = static_cast<char*>(device_->AllocateHost(grown));
    if (p == nullptr) throw std::runtime_error("cannot allocate " + std::to_string(grown) + " bytes of pinned host memory");
    if (staging_ != nullptr) device_->FreeHost(staging_);
    staging_ = p, staging_bytes_ = grown;
  }
  return staging_;
}

MPI_Op MpiCommunicator::SumOp(DType dtype) const { return dtype == DType::kF32 ? MPI_SUM : bf16_sum_; }

std::shared_ptr<Work> MpiCommunicator::AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  if (count > 0 && buf == nullptr) return Refused("AllReduce: null buffer with count " + std::to_string(count));
  ledger_.Add(CollKind::kAllReduce, CommLedger::RingBytes(CollKind::kAllReduce, count, dtype, world_));
  NoteIssued(CollKind::kAllReduce, count);
  const size_t bytes = count * DTypeSize(dtype);
  const uint64_t seq = Record(FlightOp::kAllReduce, dtype, count, bytes);
  return Submit(CollKind::kAllReduce, [this, count, dtype, op](const void*, void* buf) -> Status {
    char* p = static_cast<char*>(buf);
    const size_t esize = DTypeSize(dtype);
    size_t done = 0;
    do {  // at least one call, so count 0 is a real (empty) collective on every rank
      const size_t n = std::min(kMaxChunk, count - done);
      SHARDGPT_MPI_AWAIT(MPI_Iallreduce(MPI_IN_PLACE, p + done * esize, static_cast<int>(n), MpiType(dtype),
                                        SumOp(dtype), comm_, &_req),
                         "MPI_Allreduce");
      done += n;
    } while (done < count);
    if (op == ReduceOp::kAvg && world_ > 1) DivideInPlace(buf, count, dtype, world_);
    return Status::OK();
  }, buf, bytes, buf, bytes, seq);
}

std::shared_ptr<Work> MpiCommunicator::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                                     DType dtype, ReduceOp op) {
  if (recv_count > static_cast<size_t>(INT_MAX)) {
    return Refused("ReduceScatter: recv_count " + std::to_string(recv_count) + " exceeds INT_MAX");
  }
  if (recv_count > 0 && (send == nullptr || recv == nullptr)) {
    return Refused("ReduceScatter: null buffer with recv_count " + std::to_string(recv_count));
  }
  ledger_.Add(CollKind::kReduceScatter,
              CommLedger::RingBytes(CollKind::kReduceScatter, recv_count, dtype, world_));
  NoteIssued(CollKind::kReduceScatter, recv_count);
  const size_t rbytes = recv_count * DTypeSize(dtype);
  const uint64_t seq = Record(FlightOp::kReduceScatter, dtype, recv_count, rbytes * world_);
  return Submit(CollKind::kReduceScatter, [this, recv_count, dtype, op](const void* send, void* recv) -> Status {
    const size_t esize = DTypeSize(dtype);
    const size_t recv_bytes = recv_count * esize;
    // MPI forbids aliasing send and recv (its MPI_IN_PLACE means something else here), so
    // a recv inside send goes through a temporary.
    const bool alias = Overlaps(send, recv_bytes * world_, recv, recv_bytes);
    std::vector<char> tmp(alias ? recv_bytes : 0);
    void* out = alias ? tmp.data() : recv;
    SHARDGPT_MPI_AWAIT(MPI_Ireduce_scatter_block(send, out, static_cast<int>(recv_count), MpiType(dtype),
                                                 SumOp(dtype), comm_, &_req),
                       "MPI_Reduce_scatter_block");
    if (alias) std::memcpy(recv, tmp.data(), recv_bytes);
    if (op == ReduceOp::kAvg && world_ > 1) DivideInPlace(recv, recv_count, dtype, world_);
    return Status::OK();
  }, send, rbytes * world_, recv, rbytes, seq);
}

std::shared_ptr<Work> MpiCommunicator::AllGather(const void* send, void* recv, size_t send_count, DType dtype) {
  if (send_count > static_cast<size_t>(INT_MAX)) {
    return Refused("AllGather: send_count " + std::to_string(send_count) + " exceeds INT_MAX");
  }
  if (send_count > 0 && (send == nullptr || recv == nullptr)) {
    return Refused("AllGather: null buffer with send_count " + std::to_string(send_count));
  }
  const size_t esize = DTypeSize(dtype);
  const void* own_block = static_cast<const char*>(recv) + static_cast<size_t>(rank_) * send_count * esize;
  const bool in_place = send_count > 0 && send == own_block;
  if (!in_place && Overlaps(send, send_count * esize, recv, send_count * esize * world_)) {
    return Refused("AllGather: send overlaps recv but is not this rank's block of it");
  }
  ledger_.Add(CollKind::kAllGather, CommLedger::RingBytes(CollKind::kAllGather, send_count, dtype, world_));
  NoteIssued(CollKind::kAllGather, send_count);
  const uint64_t seq = Record(FlightOp::kAllGather, dtype, send_count, send_count * esize * world_);
  return Submit(CollKind::kAllGather, [this, send_count, dtype, in_place](const void* send, void* recv) -> Status {
    const MPI_Datatype type = MpiType(dtype);
    const int n = static_cast<int>(send_count);
    SHARDGPT_MPI_AWAIT(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, type, recv, n, type, comm_, &_req),
                       "MPI_Allgather");
    return Status::OK();
  }, send, send_count * esize, recv, send_count * esize * world_, seq);
}

std::shared_ptr<Work> MpiCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root) {
  if (root < 0 || root >= world_) {
    return Refused("Broadcast: root " + std::to_string(root) + " outside [0, " + std::to_string(world_) + ")");
  }
  if (count > 0 && buf == nullptr) return Refused("Broadcast: null buffer with count " + std::to_string(count));
  ledger_.Add(CollKind::kBroadcast, CommLedger::RingBytes(CollKind::kBroadcast, count, dtype, world_));
  NoteIssued(CollKind::kBroadcast, count);
  const size_t bytes = count * DTypeSize(dtype);
  const uint64_t seq = Record(FlightOp::kBroadcast, dtype, count, bytes);
  return Submit(CollKind::kBroadcast, [this, count, dtype, root](const void*, void* buf) -> Status {
    char* p = static_cast<char*>(buf);
    const size_t esize = DTypeSize(dtype);
    size_t done = 0;
    do {
      const size_t n = std::min(kMaxChunk, count - done);
      SHARDGPT_MPI_AWAIT(MPI_Ibcast(p + done * esize, static_cast<int>(n), MpiType(dtype), root, comm_, &_req),
                         "MPI_Bcast");
      done += n;
    } while (done < count);
    return Status::OK();
  }, buf, bytes, buf, bytes, seq);
}

StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Derive(const char* what, const DeriveFn& make,
                                                                 Device* device) {
  // a collective on comm_: it runs on our thread, in call order
  MPI_Comm derived = MPI_COMM_NULL;
  SHARDGPT_RETURN_IF_ERROR(Enqueue([this, what, &make, &derived]() -> Status {
                             SHARDGPT_MPI_CALL(make(comm_, &derived), what);
                             return Status::OK();
                           }, false, Record(FlightOp::kSplit, DType::kF32, 0, 0))->status());
  auto made = Create(derived, device);  // duplicates `derived` (nobody else uses it): ours to free
  MPI_Comm_free(&derived);
  if (!made.ok()) return made.status();
  made.value()->SetEndJobOnFailure(end_job_on_failure_.load());
  made.value()->SetTimeout(timeout_s_);
  if (made.value()->ring_) made.value()->ring_->SetName(std::strcmp(what, "MPI_Comm_split") == 0 ? "split" : "control");
  return std::unique_ptr<Communicator>(std::move(made.value()));
}

StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Split(int color, int key) {
  return Derive("MPI_Comm_split",
                [color, key](MPI_Comm comm, MPI_Comm* out) { return MPI_Comm_split(comm, color, key, out); }, device_);
}

StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::DuplicateControl() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return Status::Unimplemented("a second communicator thread needs MPI_THREAD_MULTIPLE (this MPI provides level " +
                                 std::to_string(provided) + ")");
  return Derive("MPI_Comm_dup", [](MPI_Comm comm, MPI_Comm* out) { return MPI_Comm_dup(comm, out); }, nullptr);
}

std::shared_ptr<Work> MpiCommunicator::AllToAllV(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                                 const std::vector<size_t>& recv_counts, DType dtype) {
  if (send_counts.size() != static_cast<size_t>(world_) || recv_counts.size() != static_cast<size_t>(world_))
    return Refused("AllToAllV: need " + std::to_string(world_) + " send and recv counts, got " +
                   std::to_string(send_counts.size()) + " and " + std::to_string(recv_counts.size()));
  // MPI takes int counts and displacements: every prefix sum must fit.
  std::vector<int> sc(world_), sd(world_), rc(world_), rd(world_);
  size_t s_total = 0, r_total = 0;
  for (int j = 0; j < world_; j++) {
    if (s_total + send_counts[j] > static_cast<size_t>(INT_MAX) || r_total + recv_counts[j] > static_cast<size_t>(INT_MAX))
      return Refused("AllToAllV: more than INT_MAX elements");
    sd[j] = static_cast<int>(s_total), sc[j] = static_cast<int>(send_counts[j]);
    rd[j] = static_cast<int>(r_total), rc[j] = static_cast<int>(recv_counts[j]);
    s_total += send_counts[j], r_total += recv_counts[j];
  }
  const size_t esize = DTypeSize(dtype);
  if ((s_total > 0 && send == nullptr) || (r_total > 0 && recv == nullptr))
    return Refused("AllToAllV: null buffer with a non-zero count");
  if (Overlaps(send, s_total * esize, recv, r_total * esize)) return Refused("AllToAllV: send overlaps recv");
  ledger_.Add(CollKind::kAllToAll, CommLedger::AllToAllBytes(send_counts, rank_, dtype));
  NoteIssued(CollKind::kAllToAll, s_total);
  const uint64_t seq = Record(FlightOp::kAllToAll, dtype, s_total, s_total * esize);
  return Submit(CollKind::kAllToAll, [this, sc, sd, rc, rd, dtype](const void* send, void* recv) -> Status {
    const MPI_Datatype type = MpiType(dtype);
    SHARDGPT_MPI_AWAIT(
        MPI_Ialltoallv(send, sc.data(), sd.data(), type, recv, rc.data(), rd.data(), type, comm_, &_req),
        "MPI_Alltoallv");
    return Status::OK();
  }, send, s_total * esize, recv, r_total * esize, seq);
}

Status MpiCommunicator::Barrier() {
  ledger_.AddControl(0);
  const uint64_t seq = Record(FlightOp::kBarrier, DType::kF32, 0, 0);
  auto work = Enqueue([this]() -> Status {
    SHARDGPT_MPI_AWAIT(MPI_Ibarrier(comm_, &_req), "MPI_Barrier");
    return Status::OK();
  }, false, seq);
  return work->status();
}

bool MpiCommunicator::AllTrue(bool local) {
  ledger_.AddControl(sizeof(int));
  int value = local ? 1 : 0;
  Status s = Enqueue([this, &value]() -> Status {
               SHARDGPT_MPI_AWAIT(MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_LAND, comm_, &_req),
                                  "MPI_Allreduce(AllTrue)");
               return Status::OK();
             }, false, Record(FlightOp::kAllTrue, DType::kF32, 1, sizeof(int)))->status();
  return s.ok() && value != 0;
}

double MpiCommunicator::AllReduceScalar(double value, ReduceOp op) {
  ledger_.AddControl(sizeof(double));
  double v = value;
  Status s = Enqueue([this, &v]() -> Status {
               SHARDGPT_MPI_AWAIT(MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, comm_, &_req),
                                  "MPI_Allreduce(AllReduceScalar)");
               return Status::OK();
             }, false, Record(FlightOp::kAllReduceScalar, DType::kF32, 1, sizeof(double)))->status();
  if (!s.ok()) return std::nan("");
  return op == ReduceOp::kAvg ? v / world_ : v;
}

Status MpiCommunicator::ControlAllGather(const void* send, void* recv, size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX)) return Status::InvalidArgument("ControlAllGather: too many bytes");
  ledger_.AddControl(bytes);
  return Enqueue([this, send, recv, bytes]() -> Status {
           const int n = static_cast<int>(bytes);
           SHARDGPT_MPI_AWAIT(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &_req),
                              "MPI_Allgather(control)");
           return Status::OK();
         }, false, Record(FlightOp::kControlAllGather, DType::kF32, bytes, bytes))->status();
}

Status MpiCommunicator::ControlBroadcast(void* buf, size_t bytes, int root) {
  if (root < 0 || root >= world_)
    return Status::InvalidArgument("ControlBroadcast: root " + std::to_string(root) + " outside [0, " +
                                   std::to_string(world_) + ")");
  if (bytes > static_cast<size_t>(INT_MAX)) return Status::InvalidArgument("ControlBroadcast: too many bytes");
  ledger_.AddControl(bytes);
  return Enqueue([this, buf, bytes, root]() -> Status {
           SHARDGPT_MPI_AWAIT(MPI_Ibcast(buf, static_cast<int>(bytes), MPI_BYTE, root, comm_, &_req),
                              "MPI_Bcast(control)");
           return Status::OK();
         }, false, Record(FlightOp::kControlBroadcast, DType::kF32, bytes, bytes))->status();
}

}  // namespace shardgpt
