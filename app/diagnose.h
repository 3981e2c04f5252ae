// `shardgpt diagnose DIR`: reads every rank's flight dump (parallel/flight_dump.h) and says
// which rank, doing what, stopped the job: a one-word verdict first, then for each communicator
// the first sequence number where the ranks disagree and how (docs/DIAGNOSE.md).
//
// Pure functions of the files: no MPI, runs on one process.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

// One rank at the disagreement: where it is on that communicator, and its phase.
struct DiagnoseRank {
  int rank = -1;
  long long last_seq = 0;  // its latest entry on the communicator
  std::string op, dtype, state;  // its entry at the disagreement (mismatch, transport), else its last
  unsigned long long count = 0;
  int unit = -1;
  std::string phase;  // "forward unit 3"
  double phase_age_s = 0;
  long long step = -1;
};

// The first disagreement on one communicator (verdict "all-idle" when none).
struct DiagnoseComm {
  std::string name;
  std::vector<int> ranks;  // world ranks of its members
  std::string verdict;     // not-arrived, mismatch, stuck-in-transport, no-dump, all-idle
  long long seq = 0;       // where (0: none)
  std::string op, dtype;   // what the majority (or the ranks that arrived) issued there
  unsigned long long count = 0;
  int unit = -1;
  long long step = -1;
  std::vector<int> arrived;            // ranks that issued seq (the majority, for a mismatch)
  bool no_majority = false;            // a mismatch between groups of equal size
  std::vector<DiagnoseRank> culprits;  // not arrived / another op, size or dtype / waiting
  long long last_seq = 0;              // highest sequence number any member reached
};

struct DiagnoseReport {
  std::string verdict;  // the strongest over communicators and missing dumps
  std::string run_id, dir;
  int world_size = 0;
  std::vector<int> dumped, no_dump;
  std::vector<int> paused;  // ranks whose dump says the process itself was paused (reason "paused")
  std::vector<std::string> reasons;  // per dumped rank, "rank 1: comm_timeout"
  std::vector<DiagnoseComm> comms;
};

// Reads DIR (rank_XXXXX[.N].json; the highest N of each rank). Errors (one line naming the
// file): no dumps, a dump that does not parse (truncated), another schema or version, dumps
// of different runs.
// With `run_id` given, only that run's dumps count: a rank whose latest dump is of another run
// counts as having left none.
StatusOr<DiagnoseReport> Diagnose(const std::string& dir, const std::string& run_id = "");
std::string FormatDiagnose(const DiagnoseReport& report);
// The verdict in one line: its class, the culprit rank(s), where and in which phase, e.g.
// "not-arrived: culprit rank(s) 1: never reached seq 57 on world (allgather f32 x 4096, unit 2,
// step 3), phase forward unit 2 for 10.3 s".
std::string DiagnoseHeadline(const DiagnoseReport& report);
// The MPI watchdog's job verdict (parallel/flight_dump.h JobVerdictFn): the headline of this
// run's dumps in `dir`, or empty when they cannot be read.
std::string JobVerdictHeadline(const std::string& dir, const std::string& run_id);
nlohmann::json DiagnoseToJson(const DiagnoseReport& report);

// Exit status of `shardgpt diagnose`: 0 all-idle, 3 any other verdict (1: the dumps could not
// be read, 2: bad usage).
constexpr int kDiagnoseFound = 3;

}  // namespace shardgpt
