// CheckpointManager: the one owner of a training run's checkpoint directory (--ckpt-dir).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/checkpoint_index.h"
#include "model/config.h"
#include "model/device.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/engine.h"

namespace shardgpt {

class AsyncCheckpointer;
class CheckpointDirLock;

// The checkpoint flags of `train`.
struct CheckpointOptions {
  std::string dir;      // --ckpt-dir: where the run's checkpoints live; empty: no checkpoints
  int every = 0;        // --ckpt-every: a periodic checkpoint every N steps (0: only at stop and end)
  int keep_last = 0;    // --keep-last: the K newest complete checkpoints stay (0: all)
  bool async = false;   // --async-ckpt: periodic checkpoints written in the background
  std::string resume;   // --resume: "" (fresh), "latest", "auto" or a checkpoint directory
  bool quiet = false;   // --quiet: no throughput lines
  int fail_limit = 3;   // --ckpt-fail-limit: periodic saves that may fail in a row before the run ends
};

// Owns everything about DIR: the lock (one job per directory), the cadence, keep-last, the
// `latest` pointer, which checkpoint a resume reads (--resume auto's fallback over damaged
// checkpoints and their quarantine as DIR/step_*.bad-<reason>), and the background writer.
// The caller (the training loop) hands it the engine and the run's TrainState and never
// names a file. The format and the collective save and load are ckpt/checkpoint.h's.
//
// A run calls, in order: PlanResume (before the engine exists), Open, Load (after the engine
// is allocated and initialised), then Save and WaitStaged as it trains. Every call but the
// queries, WaitStaged and TakeCost is collective over the communicator given at construction
// and fails on every rank when it fails on any (the message may be on one rank only, empty on
// the others). Without --ckpt-dir, Open and Save do nothing (a
// --resume PATH still loads).
// The manager borrows the communicator and, from Open on, the device; both must outlive it.
class CheckpointManager {
 public:
  CheckpointManager(CheckpointOptions options, Communicator& comm);
  // Waits for a background save in flight, then releases the directory's lock.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // The flags that need --ckpt-dir: one line naming the first given without it, or OK. Local.
  static Status ValidateOptions(const CheckpointOptions& o);
  // Paths inside the run's directory that others write or guard ("" without --ckpt-dir):
  // where flight-recorder dumps go by default, and the `latest` pointer a save writes.
  static std::string FlightDir(const CheckpointOptions& o);
  static std::string LatestPath(const CheckpointOptions& o);

  // Which checkpoint the run resumes from, checked against `model` before any engine exists.
  // --resume latest or PATH: that checkpoint (an error when there is none, when it is damaged
  // or when it is for another model). --resume auto: every candidate, newest first (none:
  // prints that the run starts from step 0; which one loads is Load's to find). Collective.
  Status PlanResume(const GPTConfig& model);

  // Rank 0 takes the directory's lock (creating the directory, checking it is writable);
  // with --async-ckpt the background writer is created. Errors: a directory in use by a live
  // job, not writable, a communicator that cannot carry the writer. Collective.
  Status Open(Device& device);

  // Loads the planned checkpoint into `engine` and *state. --resume auto takes the first
  // candidate that loads; the damaged ones before it are renamed DIR/step_*.bad-<reason> and
  // `latest` then names the one loaded; when none loads, nothing is renamed and the error
  // lists each. Anything that is not damage (another model, ...) is an error. A fresh run
  // loads nothing and returns OK. Collective.
  Status Load(Engine& engine, const ParamLayout& layout, TrainState* state);

  // The checkpoint directory the run resumes from: after PlanResume the explicit choice
  // (empty for a fresh start and for --resume auto), after Load the one loaded.
  const std::string& resume_path() const { return resume_path_; }
  bool resuming() const { return !resume_path_.empty(); }
  // After PlanResume: whether Load will load a checkpoint (or fail): an explicit --resume, or
  // --resume auto with at least one candidate.
  bool plans_resume() const { return !resume_path_.empty() || !candidates_.empty(); }
  // After Load: the resume as the first JSONL row records it ("from", "skipped" and, when
  // `latest` could not be used, "latest_problem"); null for a fresh run.
  const nlohmann::json& resume_record() const { return resume_record_; }
  // After Load, on rank 0: what the "resumed from" line says after the run's own figures:
  // " (saved by R rank(s), zero stage S[, shard groups of G])" and the damaged checkpoints
  // passed over. Reads the index.
  std::string ResumeDetails() const;

  // Whether the run writes checkpoints at all (--ckpt-dir given).
  bool enabled() const { return !o_.dir.empty(); }
  // Whether the step just completed, `step` of `last_step`, takes a periodic checkpoint
  // (--ckpt-every; the last step's checkpoint is the final one, not a periodic one).
  bool DuePeriodic(int64_t step, int64_t last_step) const;

  // Writes DIR/step_XXXXXXXX for state.step, publishes it as `latest` and applies
  // --keep-last. background (with --async-ckpt): returns once this rank's state is staged and
  // writes while training continues; the result of that write is taken by the next Save.
  // Otherwise returns when the checkpoint is complete (after any background save in flight).
  // A periodic save (periodic = true) that fails with an I/O error (a full disk, a quota, EIO)
  // does not end the run: one warning line on every rank, the partial DIR/.tmp.step_* removed,
  // `latest` unchanged, OK returned and the next save tries again; after fail_limit such
  // failures in a row it returns the error, and fail_limit_reached() says why. Any other
  // failure, and the failure of a stop or final save, is returned. Collective.
  Status Save(const TrainState& state, Engine& engine, const ParamLayout& layout, bool background,
              bool periodic = false);
  // Whether the last Save's error is the end of --ckpt-fail-limit failed saves in a row.
  bool fail_limit_reached() const { return fail_limit_reached_; }

  // Returns once a background save's copy of the owned state is complete: call it before
  // anything writes that state (the optimizer step). Local.
  void WaitStaged();

  // What checkpointing cost since the previous call: whether a save ran, the milliseconds
  // training was blocked by it, and the duration of the last write that finished (-1: none).
  struct Cost {
    bool saved = false;
    double stall_ms = 0, write_ms = -1;
    std::vector<std::pair<int64_t, std::string>> failures;  // the saves that failed: step, error
  };
  Cost TakeCost();

 private:
  // A damaged --resume auto candidate that was passed over.
  struct Skipped {
    std::string dir, reason, error, renamed_to;
  };
  Status LoadAuto(Engine& engine, const ParamLayout& layout, TrainState* state);
  // A periodic save of `step` failed with `st` (agreed): the warning, the partial save removed,
  // the count; OK while under --ckpt-fail-limit. Collective.
  Status Tolerate(int64_t step, const Status& st);

  const CheckpointOptions o_;
  Communicator& comm_;
  const bool lead_;
  std::string resume_path_;
  std::vector<std::string> candidates_;  // --resume auto: what Load tries, in order
  std::string latest_problem_;           // --resume auto: why DIR/latest cannot be used, if it cannot
  std::vector<Skipped> skipped_;
  nlohmann::json resume_record_;
  double stall_ms_ = 0, write_ms_ = -1;  // since the last TakeCost
  bool saved_ = false;
  std::vector<std::pair<int64_t, std::string>> failures_;  // since the last TakeCost
  int failed_in_a_row_ = 0;
  bool fail_limit_reached_ = false;
  int64_t pending_step_ = -1;  // --async-ckpt: the step of the background save in flight
  bool pending_periodic_ = false;
  std::unique_ptr<CheckpointDirLock> lock_;     // rank 0, from Open on
  std::unique_ptr<AsyncCheckpointer> async_;    // --async-ckpt; destroyed first (waits for its save)
};

}  // namespace shardgpt
