// Straggler scores on given numbers (parallel/straggler.h), and the timeline's per-rank trace and
// merge on hand-made spans (app/trace.h): the merge's refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/trace.h"
#include "parallel/straggler.h"

namespace shardgpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A window of `steps` steps with these per-step milliseconds (data, forward, backward, optimizer).
StragglerTimes Times(double data, double fwd, double bwd, double opt, int64_t steps = 10) {
  StragglerTimes t;
  const double ms[] = {data, fwd, bwd, opt};
  for (int f = 0; f < 4; f++) t.s[f] = ms[f] * 1e-3 * static_cast<double>(steps);
  t.s[static_cast<int>(StragglerFigure::kCommWait)] = 0.5 * static_cast<double>(steps);  // not scored
  t.steps = steps;
  return t;
}

TEST(Straggler, ScoresAgainstTheMedianCappedAtOne) {
  // busy per step: 10, 10, 40, 9 ms; the lower median of {9, 10, 10, 40} is 10
  const StragglerVerdict v =
      ScoreStragglers({Times(1, 3, 5, 1), Times(1, 3, 5, 1), Times(1, 33, 5, 1), Times(1, 3, 4, 1)}, 0.7);
  ASSERT_EQ(v.score.size(), 4u);
  EXPECT_DOUBLE_EQ(v.median_busy_s, 10e-3);
  EXPECT_DOUBLE_EQ(v.score[0], 1.0);
  EXPECT_DOUBLE_EQ(v.score[1], 1.0);
  EXPECT_NEAR(v.score[2], 10.0 / 40.0, 1e-12);
  EXPECT_DOUBLE_EQ(v.score[3], 1.0);  // faster than the median: capped
  EXPECT_EQ(v.stragglers, std::vector<int>{2});
  EXPECT_STREQ(StragglerFigureName(v.phase[2]), "forward");
}

TEST(Straggler, TwoRanksMeasureTheSlowOneAgainstTheOther) {
  const StragglerVerdict v = ScoreStragglers({Times(0, 2, 2, 1), Times(8, 2, 2, 1)}, 0.7);
  EXPECT_DOUBLE_EQ(v.score[0], 1.0);
  EXPECT_NEAR(v.score[1], 5.0 / 13.0, 1e-12);
  EXPECT_EQ(v.stragglers, std::vector<int>{1});
  EXPECT_STREQ(StragglerFigureName(v.phase[1]), "data");
}

TEST(Straggler, ThresholdAndEqualRanks) {
  // 8 ms against a median of 6: score 0.75, a straggler at 0.8 and not at 0.7
  const std::vector<StragglerTimes> ranks = {Times(0, 2, 3, 1), Times(0, 2, 3, 1), Times(0, 2, 3, 3)};
  EXPECT_TRUE(ScoreStragglers(ranks, 0.7).stragglers.empty());
  EXPECT_EQ(ScoreStragglers(ranks, 0.8).stragglers, std::vector<int>{2});
  EXPECT_STREQ(StragglerFigureName(ScoreStragglers(ranks, 0.8).phase[2]), "optimizer");
  const StragglerVerdict same = ScoreStragglers({Times(1, 1, 1, 1), Times(1, 1, 1, 1)}, 0.99);
  EXPECT_TRUE(same.stragglers.empty());
  EXPECT_DOUBLE_EQ(same.score[1], 1.0);
  const StragglerVerdict idle = ScoreStragglers({Times(0, 0, 0, 0), Times(0, 0, 0, 0)}, 0.7);
  EXPECT_TRUE(idle.stragglers.empty());
}

TEST(Straggler, WindowSumsPhasesLessTheirCollectiveWaits) {
  SetFlightPhaseTiming(true);
  StragglerWindow w;
  w.BeginStep();
  SetFlightPhase(FlightPhase::kForward, 0);
  usleep(20000);
  SetFlightPhase(FlightPhase::kOptimizer);
  usleep(5000);
  w.EndStep(/*forward_wait=*/0.010, 0, 0);
  SetFlightPhase(FlightPhase::kIdle);
  SetFlightPhaseTiming(false);
  const StragglerTimes t = w.Take();
  EXPECT_EQ(t.steps, 1);
  const double fwd = t.s[static_cast<int>(StragglerFigure::kForward)];
  EXPECT_GE(fwd, 0.010 - 1e-4);  // 20 ms or more, less the 10 ms wait
  EXPECT_GE(t.s[static_cast<int>(StragglerFigure::kOptimizer)], 0.005 - 1e-4);
  EXPECT_DOUBLE_EQ(t.s[static_cast<int>(StragglerFigure::kCommWait)], 0.010);
  EXPECT_EQ(w.Take().steps, 0);  // Take starts the next window
}

TEST(Straggler, StreaksCountReportsInARowPerHost) {
  using V = std::vector<std::string>;
  const V hosts = {"h1", "h1", "h2", "h3"};
  StragglerStreaks s(2);
  EXPECT_EQ(s.Report({"h2"}, hosts), V{});
  EXPECT_EQ(s.Report({}, hosts), V{});            // a report without it starts the count again
  EXPECT_EQ(s.Report({"h2", "h2"}, hosts), V{});  // two ranks of one host count once
  EXPECT_EQ(s.Report({"h2", "h3"}, hosts), V{"h2"});
  EXPECT_EQ(s.Report({"h3", "h2"}, hosts), (V{"h2", "h3"}));
  // never every host of the job: a one-host job, or all slow alike
  StragglerStreaks one(1);
  EXPECT_EQ(one.Report({"vm"}, {"vm", "vm"}), V{});
  EXPECT_EQ(one.Report({"h1", "h2"}, {"h1", "h2"}), V{});
  EXPECT_EQ(one.Report({"h2"}, {"h1", "h2"}), V{"h2"});
  StragglerStreaks off(0);
  EXPECT_EQ(off.Report({"h2"}, {"h1", "h2"}), V{});
}

TEST(Straggler, HostsToExcludeNeverEveryHost) {
  using V = std::vector<std::string>;
  EXPECT_EQ(HostsToExclude({1, 3}, {"h1", "h2", "h1", "h3"}), (V{"h2", "h3"}));
  EXPECT_EQ(HostsToExclude({1, 2}, {"h1", "h2", "h2"}), V{"h2"});
  EXPECT_EQ(HostsToExclude({0, 1}, {"h1", "h2"}), V{});  // every host
  EXPECT_EQ(HostsToExclude({1}, {"vm", "vm"}), V{});     // one host
  EXPECT_EQ(HostsToExclude({7}, {"h1", "h2"}), V{});     // no such rank
}

TEST(Straggler, RecordExcludedHostsAppendsOnceEach) {
  const fs::path dir = fs::temp_directory_path() / ("shardgpt_exclude_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "exclude_hosts").string();
  auto text = [&] {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_TRUE(RecordExcludedHosts(path, {"h2"}).ok());
  EXPECT_EQ(text(), "h2\n");
  ASSERT_TRUE(RecordExcludedHosts(path, {"h2", "h3"}).ok());
  EXPECT_EQ(text(), "h2\nh3\n");
  std::ofstream(path, std::ios::app) << "h4";  // written by hand, no final newline
  ASSERT_TRUE(RecordExcludedHosts(path, {"h4", "h5"}).ok());
  EXPECT_EQ(text(), "h2\nh3\nh4\nh5\n");
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "exclude_hosts");  // no temporary left
  const Status bad = RecordExcludedHosts((dir / "missing" / "exclude_hosts").string(), {"h2"});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("missing"), std::string::npos) << bad.message();
  fs::remove_all(dir);
}

class TraceMerge : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardgpt_trace_test_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  json RankTrace(int rank, const std::string& run_id) {
    FlightJob job;
    job.run_id = run_id, job.world_rank = rank, job.world_size = 2, job.host = "h" + std::to_string(rank);
    std::vector<FlightSpan> spans(2);
    spans[0].phase = FlightPhase::kForward, spans[0].unit = 1, spans[0].step = 2, spans[0].begin_ns = 1000000;
    spans[0].end_ns = 3000000;
    spans[1].phase = FlightPhase::kOptimizer, spans[1].step = 2, spans[1].begin_ns = 3000000, spans[1].end_ns = 3500000;
    return RankTraceJson(job, 2, 2, spans, 0, {"embed", "h.0", "final"});
  }
  std::string Merge(int* ranks) {
    const Status st = MergeTraces(dir_.string(), (dir_ / "merged.json").string(), ranks);
    return st.ok() ? "" : st.message();
  }

  fs::path dir_;
};

TEST_F(TraceMerge, MergesRanksIntoOneTrace) {
  for (int r = 0; r < 2; r++) ASSERT_TRUE(WriteTraceFile(TraceFileName(dir_.string(), r), RankTrace(r, "run1")).ok());
  int ranks = 0;
  ASSERT_EQ(Merge(&ranks), "");
  EXPECT_EQ(ranks, 2);
  std::ifstream in(dir_ / "merged.json");
  const json m = json::parse(in);
  std::set<int> pids;
  double earliest = 1e300;
  for (const json& e : m["traceEvents"]) {
    if (e["ph"] != "X") continue;
    pids.insert(e["pid"].get<int>());
    earliest = std::min(earliest, e["ts"].get<double>());
    if (e["cat"] == "phase" && e["args"].contains("unit")) {
      EXPECT_EQ(e["name"], "forward h.0");
      EXPECT_EQ(e["args"]["step"], 2);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2000.0);  // microseconds
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_DOUBLE_EQ(earliest, 0.0);
  EXPECT_EQ(m["otherData"]["run_id"], "run1");
}

TEST_F(TraceMerge, RefusesNoTracesOtherRunsAndTruncatedFiles) {
  int ranks = 0;
  EXPECT_NE(Merge(&ranks).find("no traces here"), std::string::npos);
  ASSERT_TRUE(WriteTraceFile(TraceFileName(dir_.string(), 0), RankTrace(0, "run1")).ok());
  ASSERT_TRUE(WriteTraceFile(TraceFileName(dir_.string(), 1), RankTrace(1, "run2")).ok());
  EXPECT_NE(Merge(&ranks).find("traces of different runs"), std::string::npos);
  const std::string whole = RankTrace(1, "run1").dump();
  std::ofstream(TraceFileName(dir_.string(), 1), std::ios::trunc) << whole.substr(0, whole.size() / 2);
  const std::string err = Merge(&ranks);
  EXPECT_NE(err.find("trace_rank_00001.json: not a complete trace"), std::string::npos) << err;
}

}  // namespace
}  // namespace shardgpt
