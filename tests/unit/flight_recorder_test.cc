// The flight recorder's ring (wrap-around, states, the registry) and diagnose's verdicts on
// hand-written dumps: each class, the culprit of a mismatch, and the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/diagnose.h"
#include "parallel/flight_recorder.h"

namespace shardgpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(FlightRing, KeepsTheLastEntriesAndTheirStates) {
  FlightRing ring("world", 1, {0, 1}, 4);
  SetFlightStep(7);
  SetFlightUnit(3);
  for (int i = 0; i < 6; i++) {
    const uint64_t seq = ring.Record(FlightOp::kAllGather, DType::kBF16, 10 + i, 20 + i);
    EXPECT_EQ(seq, static_cast<uint64_t>(i + 1));
    ring.Started(seq);
    if (i < 5) ring.Completed(seq, true);
  }
  SetFlightUnit(-1);
  SetFlightStep(-1);
  EXPECT_EQ(ring.last_seq(), 6u);
  FlightEntry e;
  EXPECT_FALSE(ring.Read(2, &e));  // overwritten: the ring holds 3..6
  ASSERT_TRUE(ring.Read(3, &e));
  EXPECT_EQ(e.count, 12u);
  EXPECT_EQ(e.state, FlightState::kCompleted);
  EXPECT_EQ(e.unit, 3);
  EXPECT_EQ(e.step, 7);
  ASSERT_TRUE(ring.Read(6, &e));
  EXPECT_EQ(e.state, FlightState::kStarted);
  EXPECT_EQ(e.dtype, DType::kBF16);
  EXPECT_FALSE(ring.Read(7, &e));
  bool registered = false;
  for (int i = 0; i < kMaxFlightRings; i++) registered = registered || FlightRingAt(i) == &ring;
  EXPECT_TRUE(registered);
}

TEST(FlightRing, OffMeansNoRing) {
  const size_t was = FlightCapacity();
  SetFlightCapacity(0);
  EXPECT_EQ(MakeFlightRing("world", 0, {0}), nullptr);
  SetFlightCapacity(was);
}

// A dump as flight_dump.cc writes it, with the entries given as (op, dtype, count, state).
struct E {
  std::string op, dtype;
  int count;
  std::string state;
};
json MakeDump(int rank, int world, const std::vector<E>& entries, const std::string& run = "run-a",
              const std::string& phase = "forward", int unit = 2) {
  json ranks = json::array();
  for (int r = 0; r < world; r++) ranks.push_back(r);
  json list = json::array();
  for (size_t i = 0; i < entries.size(); i++)
    list.push_back({{"seq", i + 1}, {"op", entries[i].op}, {"dtype", entries[i].dtype}, {"count", entries[i].count},
                    {"bytes", entries[i].count * 4}, {"unit", 1}, {"step", 5}, {"micro", 0},
                    {"state", entries[i].state}, {"queued_ns", 1}, {"started_ns", 2}, {"completed_ns", 3}});
  return {{"schema", "shardgpt-flight"}, {"version", 1}, {"run_id", run}, {"world_rank", rank}, {"world_size", world},
          {"host", "h"}, {"hosts", json::array()}, {"slurm_job_id", ""}, {"reason", "comm_timeout"}, {"pid", 1},
          {"time_unix", 0}, {"now_ns", 4000000000LL},
          {"phase", {{"name", phase}, {"unit", unit}, {"since_ns", 1000000000LL}, {"step", 5}, {"micro", 0}}},
          {"communicators", json::array({{{"name", "world"}, {"rank", rank}, {"ranks", ranks}, {"capacity", 100},
                                          {"last_seq", entries.size()}, {"entries", list}}})}};
}

class DiagnoseDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("flight_test_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(int rank, const json& j, const std::string& suffix = "") {
    char name[32];
    std::snprintf(name, sizeof(name), "rank_%05d%s.json", rank, suffix.c_str());
    std::ofstream(dir_ / name) << j.dump();
  }
  DiagnoseReport Run() {
    auto r = Diagnose(dir_.string());
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r.value() : DiagnoseReport();
  }
  fs::path dir_;
};

const E kDone{"all_gather", "f32", 8, "completed"};

TEST_F(DiagnoseDir, AllCompletedIsAllIdle) {
  for (int r = 0; r < 2; r++) Write(r, MakeDump(r, 2, {kDone, kDone}));
  const DiagnoseReport rep = Run();
  EXPECT_EQ(rep.verdict, "all-idle");
  EXPECT_TRUE(rep.no_dump.empty());
}

TEST_F(DiagnoseDir, TheMinorityOfAMismatchIsTheCulprit) {
  Write(0, MakeDump(0, 3, {kDone, {"all_reduce", "f32", 8, "started"}}));
  Write(1, MakeDump(1, 3, {kDone, {"all_reduce", "bf16", 8, "started"}}, "run-a", "backward", 4));
  Write(2, MakeDump(2, 3, {kDone, {"all_reduce", "f32", 8, "started"}}));
  const DiagnoseReport rep = Run();
  EXPECT_EQ(rep.verdict, "mismatch");
  ASSERT_EQ(rep.comms.size(), 1u);
  EXPECT_EQ(rep.comms[0].seq, 2);
  ASSERT_EQ(rep.comms[0].culprits.size(), 1u);
  EXPECT_EQ(rep.comms[0].culprits[0].rank, 1);
  EXPECT_EQ(rep.comms[0].culprits[0].dtype, "bf16");
  EXPECT_EQ(rep.comms[0].culprits[0].phase, "backward unit 4");
  EXPECT_FALSE(rep.comms[0].no_majority);
  EXPECT_NE(FormatDiagnose(rep).find("rank 1 issued all_reduce bf16 x 8"), std::string::npos) << FormatDiagnose(rep);
}

TEST_F(DiagnoseDir, AnEvenSplitHasNoMajority) {
  Write(0, MakeDump(0, 2, {{"all_gather", "f32", 8, "started"}}));
  Write(1, MakeDump(1, 2, {{"all_gather", "f32", 9, "started"}}));
  const DiagnoseReport rep = Run();
  EXPECT_EQ(rep.verdict, "mismatch");
  EXPECT_TRUE(rep.comms[0].no_majority);
}

TEST_F(DiagnoseDir, ARankBehindNeverArrived) {
  Write(0, MakeDump(0, 2, {kDone, {"all_gather", "f32", 8, "started"}}));
  Write(1, MakeDump(1, 2, {kDone}, "run-a", "data", -1));
  const DiagnoseReport rep = Run();
  EXPECT_EQ(rep.verdict, "not-arrived");
  ASSERT_EQ(rep.comms[0].culprits.size(), 1u);
  EXPECT_EQ(rep.comms[0].culprits[0].rank, 1);
  EXPECT_EQ(rep.comms[0].culprits[0].phase, "data");
  EXPECT_DOUBLE_EQ(rep.comms[0].culprits[0].phase_age_s, 3.0);
}

TEST_F(DiagnoseDir, AllArrivedNoneCompletedIsTheTransport) {
  for (int r = 0; r < 2; r++) Write(r, MakeDump(r, 2, {kDone, {"reduce_scatter", "f32", 8, "started"}}));
  EXPECT_EQ(Run().verdict, "stuck-in-transport");
}

TEST_F(DiagnoseDir, AMissingRankIsNoDump) {
  Write(0, MakeDump(0, 3, {kDone, {"all_gather", "f32", 8, "started"}}));
  Write(1, MakeDump(1, 3, {kDone, {"all_gather", "f32", 8, "started"}}));
  const DiagnoseReport rep = Run();
  EXPECT_EQ(rep.verdict, "no-dump");
  EXPECT_EQ(rep.no_dump, std::vector<int>{2});
}

TEST_F(DiagnoseDir, TheLatestDumpOfEachRankCounts) {
  Write(0, MakeDump(0, 2, {kDone}));
  Write(1, MakeDump(1, 2, {kDone}));
  Write(0, MakeDump(0, 2, {kDone, {"all_gather", "f32", 8, "started"}}), ".1");
  EXPECT_EQ(Run().verdict, "not-arrived");
}

TEST_F(DiagnoseDir, TheHeadlineIsOneLineNamingTheCulprit) {
  Write(0, MakeDump(0, 2, {kDone, {"all_gather", "f32", 8, "started"}}));
  Write(1, MakeDump(1, 2, {kDone}, "run-a", "data", -1));
  EXPECT_EQ(DiagnoseHeadline(Run()),
            "not-arrived: culprit rank(s) 1: never reached seq 2 on world (all_gather f32 x 8, unit 1, step 5), "
            "phase data for 3.0 s");
}

TEST_F(DiagnoseDir, TheHeadlineOfAMissingDumpNamesThatRank) {
  Write(0, MakeDump(0, 3, {kDone, {"all_gather", "f32", 8, "started"}}));
  Write(1, MakeDump(1, 3, {kDone, {"all_gather", "f32", 8, "started"}}));
  const std::string h = DiagnoseHeadline(Run());
  EXPECT_EQ(h.find("no-dump: culprit rank(s) 2: left no dump"), 0u) << h;
  EXPECT_EQ(h.find('\n'), std::string::npos) << h;
}

TEST_F(DiagnoseDir, ARankThatWasItselfPausedIsTheCulprit) {
  // every rank in the same call, none completed: the transport, but for rank 2's own pause
  for (int r = 0; r < 3; r++) {
    json j = MakeDump(r, 3, {kDone, {"reduce_scatter", "f32", 8, "started"}});
    if (r == 2) j["reason"] = "paused";
    Write(r, j);
  }
  const DiagnoseReport rep = Run();
  EXPECT_EQ(rep.verdict, "paused");
  EXPECT_EQ(rep.paused, std::vector<int>{2});
  EXPECT_EQ(DiagnoseHeadline(rep),
            "paused: culprit rank(s) 2: the process itself was paused (SIGSTOP, a frozen VM, swapped out); "
            "rank(s) 0, 1, 2 wait in seq 2 on world (reduce_scatter f32 x 8, unit 1, step 5)");
  EXPECT_NE(FormatDiagnose(rep).find("rank(s) 2 paused"), std::string::npos) << FormatDiagnose(rep);
}

TEST_F(DiagnoseDir, AMismatchOutranksAPause) {
  Write(0, MakeDump(0, 2, {{"all_gather", "f32", 8, "started"}}));
  json j = MakeDump(1, 2, {{"all_gather", "f32", 9, "started"}});
  j["reason"] = "paused";
  Write(1, j);
  EXPECT_EQ(Run().verdict, "mismatch");
}

TEST_F(DiagnoseDir, TheJobVerdictCountsOnlyItsRunsDumps) {
  // rank 1's latest dump is of an earlier run in the same folder: this run has none from it
  Write(0, MakeDump(0, 2, {kDone, {"all_gather", "f32", 8, "started"}}, "run-b"));
  Write(1, MakeDump(1, 2, {kDone}, "run-a"));
  EXPECT_FALSE(Diagnose(dir_.string()).ok());  // diagnose by hand refuses to mix runs
  auto r = Diagnose(dir_.string(), "run-b");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value().no_dump, std::vector<int>{1});
  EXPECT_EQ(JobVerdictHeadline(dir_.string(), "run-b").find("no-dump: culprit rank(s) 1: "), 0u);
  EXPECT_EQ(JobVerdictHeadline(dir_.string(), "run-c"), "");  // none of that run
}

TEST_F(DiagnoseDir, Refusals) {
  auto message = [this]() {
    auto r = Diagnose(dir_.string());
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(message().find("no flight dumps here"), std::string::npos);
  std::ofstream(dir_ / "rank_00000.json") << MakeDump(0, 2, {kDone}).dump().substr(0, 40);
  EXPECT_NE(message().find("rank_00000.json: not a complete flight dump"), std::string::npos);
  Write(0, MakeDump(0, 2, {kDone}, "run-a"));
  Write(1, MakeDump(1, 2, {kDone}, "run-b"));
  EXPECT_NE(message().find("flight dumps of different runs"), std::string::npos);
  json other = MakeDump(1, 2, {kDone}, "run-a");
  other["version"] = 9;
  Write(1, other);
  EXPECT_NE(message().find("version 9"), std::string::npos);
  EXPECT_NE(Diagnose((dir_ / "nope").string()).status().message().find("no such directory"), std::string::npos);
}

}  // namespace
}  // namespace shardgpt
