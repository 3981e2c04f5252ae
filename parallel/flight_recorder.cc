// FlightRing, the registry and the process-wide context (see the header).
#include "parallel/flight_recorder.h"

#include <time.h>
#include <unistd.h>

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

// The armed fault (SHARDGPT_TEST_FAULT), read once by ArmFlightFault.
FlightFault g_fault = FlightFault::kNone;
int g_fault_rank = -1;
int64_t g_fault_step = -1;
int g_fault_unit = -1;
bool g_fault_here = false;  // this process is the faulty rank

void FireFaultOnPhase(FlightPhase phase, int unit) {
  if (!g_fault_here || g_step.load(std::memory_order_relaxed) != g_fault_step) return;
  if (g_fault == FlightFault::kStopForward && phase == FlightPhase::kForward && unit == g_fault_unit) {
    for (;;) pause();  // hung inside the unit; the communication threads go on
  }
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
  g_phases_on.store(entries > 0);
}
void SetFlightPhases(bool on) { g_phases_on.store(on); }
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
  if (!g_phases_on.load(std::memory_order_relaxed)) return;
  g_phase_since.store(FlightNowNs(), std::memory_order_relaxed);
  g_phase_unit.store(unit, std::memory_order_relaxed);
  g_phase.store(static_cast<uint8_t>(phase), std::memory_order_release);
  if (g_fault_here) FireFaultOnPhase(phase, unit);
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
