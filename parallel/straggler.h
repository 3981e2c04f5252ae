// Straggler detection: a rank that is slow but never hangs (a bad host, a throttled device, a
// shared core) is named, with the phase it loses its time in (--straggler-every,
// docs/DIAGNOSE.md).
//
// StragglerWindow: each rank sums, over the steps of a window, its own time per phase (data,
// forward, backward, optimizer) less the time it waited for collectives in it, and that wait
// (comm_wait). The times come from the flight recorder's phase clock (ReadFlightPhaseTotals):
// one snapshot per step, no allocation.
//
// ScoreStragglers: the figures of every rank (gathered by the trainer in one small control
// collective) scored NVRx-style: a rank's busy time (data + forward + backward + optimizer, its
// collective waits excluded) against the median busy time over ranks, score = median / busy,
// capped at 1. The median of an even count is the lower of the two middle values, so that of
// two ranks the slow one is measured against the other. A rank scoring below the threshold is
// a straggler; its phase is the one where its time exceeds that phase's median the most.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/flight_recorder.h"

namespace shardgpt {

// The figures kept per rank, in this order (the JSONL's names: StragglerFigureName).
enum class StragglerFigure : int { kData, kForward, kBackward, kOptimizer, kCommWait, kCount };
constexpr int kStragglerFigures = static_cast<int>(StragglerFigure::kCount);
const char* StragglerFigureName(int figure);  // "data", "forward", "backward", "optimizer", "comm_wait"

// One rank's window: seconds per figure summed over `steps` steps.
struct StragglerTimes {
  double s[kStragglerFigures] = {};
  int64_t steps = 0;
  double busy() const;  // data + forward + backward + optimizer
};

// The per-step accounting of one rank. BeginStep and EndStep from the training thread, around
// each optimizer step; Take hands the window over and starts the next.
class StragglerWindow {
 public:
  void BeginStep();
  // forward_wait / backward_wait / after_backward_wait: the step's collective waits (seconds)
  // inside forward, backward, and gradient sync + optimizer (the engine's StepReport).
  void EndStep(double forward_wait, double backward_wait, double after_backward_wait);
  StragglerTimes Take();

 private:
  int64_t at_begin_[kFlightPhases] = {};
  StragglerTimes window_;
};

struct StragglerVerdict {
  std::vector<double> score;      // by rank, in (0, 1]
  std::vector<int> phase;         // by rank: the figure (data .. optimizer) it is slowest in
  std::vector<int> stragglers;    // ranks scoring below the threshold, ascending
  double median_busy_s = 0;       // per step
};

// ranks: every rank's window (the same number of steps each, > 0). Pure.
StragglerVerdict ScoreStragglers(const std::vector<StragglerTimes>& ranks, double threshold);

// --straggler-exclude-after K: how many reports in a row have named each host. Report() takes
// one report: the hosts of the ranks it named (repeats count once) and the hosts of every rank
// of the job. A host named counts one more, any other host drops back to 0. It returns the
// hosts that have now been named in K reports in a row, ascending, except when that would be
// every host of the job (a single-host job, or all hosts slow alike: no host to leave out).
class StragglerStreaks {
 public:
  explicit StragglerStreaks(int k) : k_(k) {}
  std::vector<std::string> Report(const std::vector<std::string>& named, const std::vector<std::string>& all_hosts);

 private:
  int k_;
  std::vector<std::pair<std::string, int>> streak_;  // host, reports in a row (named ones only)
};

// The file of hosts to leave out of a requeued job (slurm/*.sbatch read it): one host name a
// line. Appends each of `hosts` not already in it; a missing file is created; written
// atomically (a temporary, then a rename). Returns the error naming the path.
Status RecordExcludedHosts(const std::string& path, const std::vector<std::string>& hosts);

// The hosts of `ranks` (world ranks; hosts_by_rank[r] is rank r's host), ascending and once
// each; empty when they would be every host of the job. Pure.
std::vector<std::string> HostsToExclude(const std::vector<int>& ranks, const std::vector<std::string>& hosts_by_rank);

}  // namespace shardgpt
