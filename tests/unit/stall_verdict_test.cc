// The MPI watchdog's verdict (parallel/stall_verdict.h): which peers it names, and how.
#include "parallel/stall_verdict.h"

#include <gtest/gtest.h>

#include <vector>

namespace shardgpt {
namespace {

const std::vector<int> kWorldRanks = {4, 5, 6, 7};  // a split communicator: members 0..3 are world ranks 4..7

TEST(StallVerdict, APeerWhoseLatestNoteIsOfAnEarlierCallDidNotArrive) {
  const std::vector<PeerNotes> peers = {{0, 0}, {12, 0.1}, {11, 0.2}, {12, 0.1}};
  EXPECT_EQ(StallVerdict(12, 0, peers, 3.0, kWorldRanks), "rank(s) 6 did not arrive (stopped, hung or dead)");
}

TEST(StallVerdict, APeerThatNotedTheCallButFellSilentIsNamedAsStoppedInsideIt) {
  const std::vector<PeerNotes> peers = {{12, 0.1}, {0, 0}, {12, 11.6}, {12, 0.4}};
  EXPECT_EQ(StallVerdict(12, 1, peers, 3.0, kWorldRanks),
            "rank(s) 6 arrived but sent nothing for 12 s (stopped or hung inside the call)");
}

TEST(StallVerdict, BothKindsAreNamedTogetherAndSelfIsNever) {
  // self (member 3) is "quiet" and behind: it is not judged
  const std::vector<PeerNotes> peers = {{9, 0.1}, {12, 5.0}, {12, 4.0}, {0, 99}};
  EXPECT_EQ(StallVerdict(12, 3, peers, 3.0, kWorldRanks),
            "rank(s) 4 did not arrive (stopped, hung or dead); "
            "rank(s) 5, 6 arrived but sent nothing for 5 s (stopped or hung inside the call)");
}

TEST(StallVerdict, EmptyWhenEveryPeerIsWaitingOrPastTheCall) {
  // member 2 noted a later call and is quiet: its part of this call is done (a broadcast's
  // root), so it is not stuck inside it
  const std::vector<PeerNotes> peers = {{0, 0}, {12, 2.9}, {13, 50.0}, {12, 0.0}};
  EXPECT_EQ(StallVerdict(12, 0, peers, 3.0, kWorldRanks), "");
  EXPECT_TRUE(StallCulprits(12, 0, peers, 3.0, kWorldRanks).empty());
}

TEST(StallVerdict, CulpritsAreTheWorldRanksItNames) {
  const std::vector<PeerNotes> peers = {{9, 0.1}, {12, 5.0}, {12, 4.0}, {0, 99}};
  EXPECT_EQ(StallCulprits(12, 3, peers, 3.0, kWorldRanks), (std::vector<int>{4, 5, 6}));
  const std::vector<PeerNotes> one = {{0, 0}, {12, 0.1}, {11, 0.2}, {12, 0.1}};
  EXPECT_EQ(StallCulprits(12, 0, one, 3.0, kWorldRanks), (std::vector<int>{6}));
}

TEST(SelfPause, LooksEveryHeartbeatOrSoAreNoPause) {
  // looks every 0.5 ms, and a look late by two heartbeats (a busy machine): within the bound
  EXPECT_EQ(DetectSelfPause({0.0, 0.0005, 0.001, 1.0, 3.0, 3.0005}, 1.0).paused_s, 0);
  EXPECT_EQ(DetectSelfPause({}, 1.0).paused_s, 0);
  EXPECT_EQ(DetectSelfPause({5.0}, 1.0).paused_s, 0);
}

TEST(SelfPause, AGapPastThreeHeartbeatsIsThisRanksOwnPause) {
  const SelfPause p = DetectSelfPause({10.0, 10.5, 17.6, 18.0}, 1.0);
  EXPECT_DOUBLE_EQ(p.paused_s, 17.6 - 10.5);
  EXPECT_EQ(p.heartbeats, 7);
  EXPECT_EQ(SelfPauseText(p), "this rank was paused for 7.1 s (its own clock jumped past 7 heartbeats); not naming peers");
}

TEST(SelfPause, TheLongestGapCountsAndTheBoundScalesWithTheHeartbeat) {
  // heartbeat 0.25 s (--comm-timeout 1): a 0.8 s gap is past three heartbeats
  EXPECT_DOUBLE_EQ(DetectSelfPause({0.0, 0.8, 0.9, 2.9}, 0.25).paused_s, 2.0);
  EXPECT_EQ(DetectSelfPause({0.0, 0.8, 0.9, 2.9}, 0.25).heartbeats, 8);
  // the same gaps against a 1 s heartbeat: none past the bound
  EXPECT_EQ(DetectSelfPause({0.0, 0.8, 0.9, 2.9}, 1.0).paused_s, 0);
  // a custom bound: past one heartbeat
  EXPECT_DOUBLE_EQ(DetectSelfPause({0.0, 2.5}, 1.0, 1).paused_s, 2.5);
}

}  // namespace
}  // namespace shardgpt
