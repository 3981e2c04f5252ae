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

}  // namespace
}  // namespace shardgpt
