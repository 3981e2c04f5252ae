// FlightRing, the registry and the process-wide context (see the header).
#include "parallel/flight_recorder.h"

#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace shardgpt {

namespace {

std::atomic<size_t> g_capacity{2000};
std::atomic<FlightRing*> g_rings[kMaxFlightRings];

std::atomic<int64_t> g_step{-1};
std::atomic<int> g_micro{-1};
std::atomic<int> g_unit{-1};
std::atomic<uint8_t> g_phase{static_cast<uint8_t>(FlightPhase::kSetup)};
std::atomic<int> g_phase_unit{-1};
std::atomic<int64_t> g_phase_since{0};
std::atomic<bool> g_phases_on{true};
std::atomic<bool> g_timing_on{false};
std::atomic<bool> g_phases_active{true};  // g_phases_on || g_timing_on: SetFlightPhase's one test
std::atomic<int64_t> g_phase_total[kFlightPhases];
// The training thread's own: the step and micro-batch the open phase began in.
int64_t g_phase_begin_step = -1;
int g_phase_begin_micro = -1;

// The phase trace (StartFlightTrace): a preallocated buffer, the training thread's only.
std::unique_ptr<FlightSpan[]> g_trace;
size_t g_trace_capacity = 0, g_trace_size = 0, g_trace_dropped = 0;
int64_t g_trace_first = 0, g_trace_last = -1;
bool g_trace_on = false;

// The armed fault (SHARDGPT_TEST_FAULT), read once by ArmFlightFault.
FlightFault g_fault = FlightFault::kNone;
int g_fault_rank = -1;
int64_t g_fault_step = -1;
int g_fault_unit = -1;
bool g_fault_here = false;  // this process is the faulty rank
// The slow rank (SHARDGPT_TEST_SLOW), read once by ArmFlightFault.
bool g_slow_here = false;
FlightPhase g_slow_phase = FlightPhase::kForward;
int g_slow_ms = 0;
int64_t g_slow_last_step = -2;

void SlowOnPhase(FlightPhase phase) {
  const int64_t step = g_step.load(std::memory_order_relaxed);
  if (phase != g_slow_phase || step == g_slow_last_step) return;
  g_slow_last_step = step;
  timespec ts{g_slow_ms / 1000, static_cast<long>(g_slow_ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

bool InTraceWindow(int64_t step) { return step >= g_trace_first && step <= g_trace_last; }

void KeepSpan(FlightPhase phase, int unit, int64_t begin_ns, int64_t end_ns) {
  if (!InTraceWindow(g_phase_begin_step) || begin_ns == 0) return;
  if (g_trace_size == g_trace_capacity) {
    g_trace_dropped++;
    return;
  }
  FlightSpan& s = g_trace[g_trace_size++];
  s.phase = phase, s.unit = unit, s.micro = g_phase_begin_micro, s.step = g_phase_begin_step;
  s.begin_ns = begin_ns, s.end_ns = end_ns;
}

void FireFaultOnPhase(FlightPhase phase, int unit) {
  if (!g_fault_here || g_step.load(std::memory_order_relaxed) != g_fault_step) return;
  if (g_fault == FlightFault::kStopForward && phase == FlightPhase::kForward && unit == g_fault_unit) {
    for (;;) pause();  // hung inside the unit; the communication threads go on
  }
  if (g_fault == FlightFault::kStopData && phase == FlightPhase::kData) {
    for (;;) pause();  // stuck in the data loader; the communication threads go on
  }
  if (g_fault == FlightFault::kKill && phase == FlightPhase::kData) std::raise(SIGKILL);
  if (g_fault == FlightFault::kSegv && phase == FlightPhase::kData) std::raise(SIGSEGV);
}

}  // namespace

const char* FlightOpName(FlightOp op) {
  switch (op) {
    case FlightOp::kAllReduce: return "all_reduce";
    case FlightOp::kReduceScatter: return "reduce_scatter";
    case FlightOp::kAllGather: return "all_gather";
    case FlightOp::kBroadcast: return "broadcast";
    case FlightOp::kAllToAll: return "all_to_all";
    case FlightOp::kBarrier: return "barrier";
    case FlightOp::kAllTrue: return "all_true";
    case FlightOp::kAllReduceScalar: return "all_reduce_scalar";
    case FlightOp::kControlAllGather: return "control_all_gather";
    case FlightOp::kControlBroadcast: return "control_broadcast";
    case FlightOp::kSplit: return "split";
    case FlightOp::kCount: break;
  }
  return "unknown";
}

const char* FlightStateName(FlightState s) {
  switch (s) {
    case FlightState::kQueued: return "queued";
    case FlightState::kStarted: return "started";
    case FlightState::kCompleted: return "completed";
    case FlightState::kFailed: return "failed";
  }
  return "unknown";
}

const char* FlightPhaseName(FlightPhase p) {
  switch (p) {
    case FlightPhase::kSetup: return "setup";
    case FlightPhase::kData: return "data";
    case FlightPhase::kForward: return "forward";
    case FlightPhase::kBackward: return "backward";
    case FlightPhase::kGradSync: return "grad_sync";
    case FlightPhase::kOptimizer: return "optimizer";
    case FlightPhase::kCheckpoint: return "checkpoint";
    case FlightPhase::kValidation: return "validation";
    case FlightPhase::kIdle: return "idle";
    case FlightPhase::kCount: break;
  }
  return "unknown";
}

int64_t FlightNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

FlightRing::FlightRing(const char* name, int rank, const std::vector<int>& world_ranks, size_t capacity)
    : rank_(rank), world_ranks_(world_ranks), capacity_(capacity), slots_(new FlightSlot[capacity]) {
  SetName(name);
  for (auto& slot : g_rings) {
    FlightRing* expected = nullptr;
    if (slot.compare_exchange_strong(expected, this)) break;
  }  // a full table: this ring records but is not dumped
}

FlightRing::~FlightRing() {
  for (auto& slot : g_rings) {
    FlightRing* expected = this;
    if (slot.compare_exchange_strong(expected, nullptr)) break;
  }
}

void FlightRing::SetName(const char* name) {
  std::strncpy(name_, name, sizeof(name_) - 1);
  name_[sizeof(name_) - 1] = '\0';
}

uint64_t FlightRing::Record(FlightOp op, DType dtype, uint64_t count, uint64_t bytes) {
  const uint64_t seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
  FlightSlot& s = slots_[(seq - 1) % capacity_];
  constexpr auto r = std::memory_order_relaxed;
  s.seq.store(0, r);  // readers skip the slot while it changes
  std::atomic_thread_fence(std::memory_order_release);
  s.op.store(static_cast<uint8_t>(op), r);
  s.dtype.store(static_cast<uint8_t>(dtype), r);
  s.state.store(static_cast<uint8_t>(FlightState::kQueued), r);
  s.unit.store(g_unit.load(r), r);
  s.micro.store(g_micro.load(r), r);
  s.step.store(g_step.load(r), r);
  s.count.store(count, r);
  s.bytes.store(bytes, r);
  s.queued_ns.store(FlightNowNs(), r);
  s.started_ns.store(0, r);
  s.completed_ns.store(0, r);
  s.seq.store(seq, std::memory_order_release);
  return seq;
}

void FlightRing::Started(uint64_t seq) {
  FlightSlot& s = slots_[(seq - 1) % capacity_];
  if (s.seq.load(std::memory_order_acquire) != seq) return;  // overwritten by a later entry
  s.started_ns.store(FlightNowNs(), std::memory_order_relaxed);
  s.state.store(static_cast<uint8_t>(FlightState::kStarted), std::memory_order_release);
}

void FlightRing::Completed(uint64_t seq, bool ok) {
  FlightSlot& s = slots_[(seq - 1) % capacity_];
  if (s.seq.load(std::memory_order_acquire) != seq) return;
  s.completed_ns.store(FlightNowNs(), std::memory_order_relaxed);
  s.state.store(static_cast<uint8_t>(ok ? FlightState::kCompleted : FlightState::kFailed), std::memory_order_release);
}

bool FlightRing::Read(uint64_t seq, FlightEntry* out) const {
  if (seq == 0 || seq > last_seq()) return false;
  const FlightSlot& s = slots_[(seq - 1) % capacity_];
  if (s.seq.load(std::memory_order_acquire) != seq) return false;
  constexpr auto r = std::memory_order_relaxed;
  FlightEntry e;
  e.seq = seq;
  e.op = static_cast<FlightOp>(s.op.load(r));
  e.dtype = static_cast<DType>(s.dtype.load(r));
  e.state = static_cast<FlightState>(s.state.load(std::memory_order_acquire));
  e.unit = s.unit.load(r), e.micro = s.micro.load(r), e.step = s.step.load(r);
  e.count = s.count.load(r), e.bytes = s.bytes.load(r);
  e.queued_ns = s.queued_ns.load(r), e.started_ns = s.started_ns.load(r), e.completed_ns = s.completed_ns.load(r);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.seq.load(r) != seq) return false;  // rewritten while we read
  *out = e;
  return true;
}

void SetFlightCapacity(size_t entries) {
  g_capacity.store(entries);
  SetFlightPhases(entries > 0);
}
void SetFlightPhases(bool on) {
  g_phases_on.store(on);
  g_phases_active.store(on || g_timing_on.load());
}
void SetFlightPhaseTiming(bool on) {
  g_timing_on.store(on);
  g_phases_active.store(on || g_phases_on.load());
}
size_t FlightCapacity() { return g_capacity.load(); }

std::unique_ptr<FlightRing> MakeFlightRing(const char* name, int rank, const std::vector<int>& world_ranks) {
  const size_t n = g_capacity.load();
  if (n == 0) return nullptr;
  return std::make_unique<FlightRing>(name, rank, world_ranks, n);
}

void SetFlightStep(int64_t step) { g_step.store(step, std::memory_order_relaxed); }
void SetFlightMicro(int micro) { g_micro.store(micro, std::memory_order_relaxed); }
void SetFlightUnit(int unit) { g_unit.store(unit, std::memory_order_relaxed); }

void SetFlightPhase(FlightPhase phase, int unit) {
  constexpr auto r = std::memory_order_relaxed;
  if (!g_phases_active.load(r)) return;
  const int64_t now = FlightNowNs(), since = g_phase_since.load(r);
  const auto prev = static_cast<FlightPhase>(g_phase.load(r));
  std::atomic<int64_t>& total = g_phase_total[static_cast<int>(prev)];
  if (since > 0) total.store(total.load(r) + (now - since), r);  // one writer: no read-modify-write
  if (g_trace_on) KeepSpan(prev, g_phase_unit.load(r), since, now);
  g_phase_begin_step = g_step.load(r);
  g_phase_begin_micro = g_micro.load(r);
  g_phase_since.store(now, r);
  g_phase_unit.store(unit, r);
  g_phase.store(static_cast<uint8_t>(phase), std::memory_order_release);
  if (g_fault_here) FireFaultOnPhase(phase, unit);
  if (g_slow_here) SlowOnPhase(phase);
}

void ReadFlightPhaseTotals(int64_t totals[kFlightPhases]) {
  constexpr auto r = std::memory_order_relaxed;
  for (int p = 0; p < kFlightPhases; p++) totals[p] = g_phase_total[p].load(r);
  const int64_t since = g_phase_since.load(r);
  if (since > 0 && g_phases_active.load(r)) totals[g_phase.load(r)] += FlightNowNs() - since;
}

void StartFlightTrace(int64_t first, int64_t last, size_t capacity) {
  g_trace.reset(new FlightSpan[capacity]);
  g_trace_capacity = capacity, g_trace_size = 0, g_trace_dropped = 0;
  g_trace_first = first, g_trace_last = last;
  g_trace_on = true;
}

size_t CopyFlightTrace(std::vector<FlightSpan>* spans) {
  spans->assign(g_trace.get(), g_trace.get() + g_trace_size);
  const int64_t since = g_phase_since.load(std::memory_order_relaxed);
  if (g_trace_on && InTraceWindow(g_phase_begin_step) && since > 0) {
    FlightSpan s;
    s.phase = static_cast<FlightPhase>(g_phase.load(std::memory_order_relaxed));
    s.unit = g_phase_unit.load(std::memory_order_relaxed);
    s.micro = g_phase_begin_micro, s.step = g_phase_begin_step;
    s.begin_ns = since, s.end_ns = FlightNowNs();
    spans->push_back(s);
  }
  return g_trace_dropped;
}

void StopFlightTrace() {
  g_trace_on = false;
  g_trace.reset();
  g_trace_capacity = g_trace_size = 0;
}

FlightContext ReadFlightContext() {
  FlightContext c;
  c.phase = static_cast<FlightPhase>(g_phase.load(std::memory_order_acquire));
  c.phase_unit = g_phase_unit.load(std::memory_order_relaxed);
  c.phase_since_ns = g_phase_since.load(std::memory_order_relaxed);
  c.step = g_step.load(std::memory_order_relaxed);
  c.micro = g_micro.load(std::memory_order_relaxed);
  return c;
}

FlightRing* FlightRingAt(int i) { return g_rings[i].load(std::memory_order_acquire); }

void ArmFlightFault(int world_rank) {
  if (const char* slow = std::getenv("SHARDGPT_TEST_SLOW")) {  // RANK:PHASE:MS
    int rank = -1, ms = 0;
    char phase[16] = {};
    if (std::sscanf(slow, "%d:%15[a-z]:%d", &rank, phase, &ms) == 3 && rank == world_rank && ms > 0) {
      const std::string p(phase);
      g_slow_phase = p == "data" ? FlightPhase::kData : p == "backward" ? FlightPhase::kBackward
                   : p == "optimizer" ? FlightPhase::kOptimizer : FlightPhase::kForward;
      g_slow_ms = ms;
      g_slow_here = true;
    }
  }
  const char* v = std::getenv("SHARDGPT_TEST_FAULT");
  if (v == nullptr || *v == '\0') return;
  const std::string s(v);
  const size_t a = s.find(':');
  if (a == std::string::npos) return;
  const std::string kind = s.substr(0, a);
  int rank = -1, unit = -1;
  long long step = -1;
  if (std::sscanf(s.c_str() + a + 1, "%d:%lld:%d", &rank, &step, &unit) < 2) return;
  if (kind == "stop-forward") g_fault = FlightFault::kStopForward;
  else if (kind == "stop-data") g_fault = FlightFault::kStopData;
  else if (kind == "kill") g_fault = FlightFault::kKill;
  else if (kind == "segv") g_fault = FlightFault::kSegv;
  else if (kind == "skip") g_fault = FlightFault::kSkip;
  else if (kind == "size") g_fault = FlightFault::kSize;
  else return;
  g_fault_rank = rank, g_fault_step = step, g_fault_unit = unit;
  g_fault_here = rank == world_rank;
}

bool FlightFaultAt(FlightFault kind, int64_t step) { return g_fault_here && g_fault == kind && g_fault_step == step; }
bool FlightFaultArmedAt(FlightFault kind, int64_t step) { return g_fault == kind && g_fault_step == step; }

}  // namespace shardgpt
