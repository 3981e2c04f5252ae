// The flight recorder: what every rank was doing before a hang or a crash, kept cheaply enough
// to be on in every run (--flight-recorder N, docs/DIAGNOSE.md).
//
// FlightRing: one fixed ring of the last N collectives of ONE communicator (data and control
// planes alike), each with its sequence number on that communicator (the same call has the
// same number on every member), op, dtype, count, bytes, parameter unit, step, micro-batch and
// state (queued, started, completed, failed) with steady-clock timestamps. Beside the rings,
// the process-wide phase (data, forward unit k, backward unit k, gradient sync, optimizer,
// checkpoint, validation) and when it began.
//
// Hot-path contract: recording allocates nothing and takes no lock. The caller thread writes an
// entry at issue (Record); the communication thread marks it started and completed by sequence
// number. Every field is a relaxed atomic, and each slot carries its sequence number, written
// last: a reader (the dump, possibly a signal handler) takes a slot only when its number is the
// same before and after reading it, so a torn slot is skipped, never mixed.
//
// Registry: every ring registers itself in a fixed process-wide table (no allocation, lock-free
// reads), which the dump walks (parallel/flight_dump.h). A ring unregisters in its destructor.
// Capacity 0 (--flight-recorder 0): no ring is created and recording is one branch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/dtype.h"

namespace shardgpt {

// What one entry was. The data plane's kinds first (CollKind's order), then the control plane.
// Part of the dump schema: do not renumber (the names are what the dump writes).
enum class FlightOp : uint8_t {
  kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll,
  kBarrier, kAllTrue, kAllReduceScalar, kControlAllGather, kControlBroadcast, kSplit, kCount
};
const char* FlightOpName(FlightOp op);

enum class FlightState : uint8_t { kQueued = 1, kStarted = 2, kCompleted = 3, kFailed = 4 };
const char* FlightStateName(FlightState s);

// What the rank's training thread is doing (the dump's "phase"). kForward / kBackward carry
// the unit; kGradSync is the step's wait for the reductions, kOptimizer the update.
enum class FlightPhase : uint8_t {
  kSetup, kData, kForward, kBackward, kGradSync, kOptimizer, kCheckpoint, kValidation, kIdle, kCount
};
const char* FlightPhaseName(FlightPhase p);

// Steady-clock nanoseconds (clock_gettime(CLOCK_MONOTONIC): async-signal-safe).
int64_t FlightNowNs();

// One ring entry; see the header comment for the read protocol.
struct FlightSlot {
  std::atomic<uint64_t> seq{0};  // 0: never written
  std::atomic<uint8_t> op{0}, dtype{0}, state{0};
  std::atomic<int32_t> unit{-1}, micro{-1};
  std::atomic<int64_t> step{-1};
  std::atomic<uint64_t> count{0}, bytes{0};
  std::atomic<int64_t> queued_ns{0}, started_ns{0}, completed_ns{0};
};

// A plain copy of a slot, for the dump and tests.
struct FlightEntry {
  uint64_t seq = 0;
  FlightOp op = FlightOp::kAllReduce;
  DType dtype = DType::kF32;
  FlightState state = FlightState::kQueued;
  int unit = -1, micro = -1;
  int64_t step = -1;
  uint64_t count = 0, bytes = 0;
  int64_t queued_ns = 0, started_ns = 0, completed_ns = 0;
};

// The ring of one communicator. Record() from the one caller thread; Started() / Completed()
// from the communication thread (or the caller, for backends without one); Snapshot() from
// anywhere. Not copyable.
class FlightRing {
 public:
  // name: "world", "shard", "replica", "control" ... (copied, at most 31 characters);
  // world_ranks: the MPI_COMM_WORLD rank of each member, in communicator rank order.
  FlightRing(const char* name, int rank, const std::vector<int>& world_ranks, size_t capacity);
  ~FlightRing();
  FlightRing(const FlightRing&) = delete;
  FlightRing& operator=(const FlightRing&) = delete;

  // A new entry (state queued) with the next sequence number, tagged with the process-wide
  // unit, step and micro-batch; returns its number.
  uint64_t Record(FlightOp op, DType dtype, uint64_t count, uint64_t bytes);
  void Started(uint64_t seq);
  void Completed(uint64_t seq, bool ok);

  void SetName(const char* name);
  const char* name() const { return name_; }
  int rank() const { return rank_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  size_t capacity() const { return capacity_; }
  uint64_t last_seq() const { return next_seq_.load(std::memory_order_relaxed) - 1; }
  // Entry `seq` if the ring still holds it whole (false: overwritten, torn, or never issued).
  bool Read(uint64_t seq, FlightEntry* out) const;

 private:
  char name_[32];
  const int rank_;
  const std::vector<int> world_ranks_;
  const size_t capacity_;
  std::unique_ptr<FlightSlot[]> slots_;
  std::atomic<uint64_t> next_seq_{1};
};

// ---- process-wide settings and context ----

// Entries per communicator for rings created from now on (--flight-recorder); 0: off.
void SetFlightCapacity(size_t entries);
size_t FlightCapacity();
// A new ring, or null when the recorder is off.
std::unique_ptr<FlightRing> MakeFlightRing(const char* name, int rank, const std::vector<int>& world_ranks);

// What the next collectives are tagged with (set by the training loop and the engine).
void SetFlightStep(int64_t step);
void SetFlightMicro(int micro);
void SetFlightUnit(int unit);  // the parameter unit (or bucket) the next collective belongs to
// The training thread's phase from now on (unit: forward / backward only, else -1). Also where
// the test fault hooks fire (SHARDGPT_TEST_FAULT, flight_recorder.cc).
void SetFlightPhase(FlightPhase phase, int unit = -1);

// Phase tracking on or off (on by default; SetFlightCapacity(0) turns it off). For the
// benchmark that alternates steps with and without the recorder.
void SetFlightPhases(bool on);
// Phase timing kept on whatever SetFlightPhases says (straggler detection and --trace need the
// phases with --flight-recorder 0).
void SetFlightPhaseTiming(bool on);

// ---- phase times (straggler detection, parallel/straggler.h) ----
constexpr int kFlightPhases = static_cast<int>(FlightPhase::kCount);
// Each phase's total time (ns) while phases were tracked, the phase now open counted up to now.
// A phase's time is added when the next begins: one clock read per phase change, no allocation.
// Call from the training thread (the one that sets phases).
void ReadFlightPhaseTotals(int64_t totals[kFlightPhases]);

// ---- the phase trace (--trace, app/trace.h) ----
// One phase as it ran: the step and micro-batch it began in, steady-clock begin and end (ns).
struct FlightSpan {
  FlightPhase phase = FlightPhase::kIdle;
  int unit = -1, micro = -1;
  int64_t step = -1;
  int64_t begin_ns = 0, end_ns = 0;
};
// From now on, every phase that begins in a step of first..last is kept as a span, in a buffer
// of `capacity` spans allocated here (later spans are dropped and counted). Training thread.
void StartFlightTrace(int64_t first, int64_t last, size_t capacity);
// The spans kept since StartFlightTrace (the open phase included, ending now, when its step is
// in the window) into *spans; returns how many were dropped. Recording goes on.
size_t CopyFlightTrace(std::vector<FlightSpan>* spans);
// Stops recording and frees the buffer.
void StopFlightTrace();

// A copy of the context, for the dump.
struct FlightContext {
  FlightPhase phase = FlightPhase::kSetup;
  int phase_unit = -1;
  int64_t phase_since_ns = 0;
  int64_t step = -1;
  int micro = -1;
};
FlightContext ReadFlightContext();

// The registry: up to kMaxFlightRings live rings; slot i is null when free.
constexpr int kMaxFlightRings = 64;
FlightRing* FlightRingAt(int i);

// ---- test-only fault hooks ----
// SHARDGPT_TEST_FAULT=KIND:RANK:STEP[:UNIT] makes world rank RANK misbehave at step STEP:
//   stop-forward  blocks forever when its forward of unit UNIT begins (a hung kernel);
//   stop-data     blocks forever when its step's data phase begins (a stuck data loader);
//   kill          raises SIGKILL when its step's data phase begins (a rank killed outright:
//                 no handler runs, no dump is written);
//   segv          raises SIGSEGV when its step begins;
//   skip          skips the step boundary's stop-flag agreement and hangs (the trainer asks);
//   size          issues the step's extra test broadcast with one more element, then hangs.
// The phase-bound kinds (stop-forward, stop-data, kill, segv) fire from SetFlightPhase on any
// device, so they work under --device cuda as well.
enum class FlightFault { kNone, kStopForward, kStopData, kKill, kSegv, kSkip, kSize };
// Reads the variable once (call after MPI_Init: it needs the world rank).
void ArmFlightFault(int world_rank);
// True on the faulty rank at its step, for the trainer's hooks.
bool FlightFaultAt(FlightFault kind, int64_t step);
// True when a fault of this kind is armed on any rank for this step (every rank issues the
// extra collective of `size`; only the faulty one changes its count).
bool FlightFaultArmedAt(FlightFault kind, int64_t step);

// SHARDGPT_TEST_SLOW=RANK:PHASE:MS makes world rank RANK sleep MS milliseconds once per step,
// when the step's first PHASE (data, forward, backward, optimizer) begins: a straggler whatever
// the machine's speed. Read by ArmFlightFault.

}  // namespace shardgpt
