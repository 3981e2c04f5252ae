// StallVerdict: the MPI watchdog's judgement of a call that made no progress, as a pure function
// of what the side channel told it, so that each case can be tested without stopping a process.
//
// Each rank notes to its peers every call it enters and, while it waits inside a call, notes it
// again every heartbeat. So at the deadline of call `call` a peer is one of:
//   - missing: its latest note is of an earlier call: it never arrived (still computing, stopped
//     or hung before the call, or dead);
//   - silent: it noted this very call but has sent nothing for more than `silence_s`, though a
//     waiting rank notes every heartbeat: it was stopped or hung inside the call;
//   - waiting: it noted this call recently (or a later one: its part is done).
// A SIGSTOP can land before or after the stopped rank's arrival note; both verdicts name it.
#pragma once

#include <string>
#include <vector>

namespace shardgpt {

struct PeerNotes {
  long long latest_call = 0;  // the latest call the peer noted (0: none yet)
  double quiet_s = 0;         // seconds since its last note came in
};

// "rank(s) 1, 3 did not arrive (stopped, hung or dead)" and/or "rank(s) 2 arrived but sent
// nothing for 12 s (stopped or hung inside the call)", joined by "; "; empty when every peer is
// waiting (MPI itself is stuck). peers[self] is ignored; world_ranks names each member.
std::string StallVerdict(long long call, int self, const std::vector<PeerNotes>& peers, double silence_s,
                         const std::vector<int>& world_ranks);
// The world ranks that verdict names (missing, then silent), in peer order; empty when it names none.
std::vector<int> StallCulprits(long long call, int self, const std::vector<PeerNotes>& peers, double silence_s,
                               const std::vector<int>& world_ranks);

// A pause of this process itself (SIGSTOP and SIGCONT, a frozen VM, swapped out): the watchdog
// thread looks at its monotonic clock at least every heartbeat while it waits, so a gap between
// two consecutive looks of more than `max_heartbeats` heartbeats means the process did not run.
// What it heard of its peers before the gap is stale: such a rank names no peer.
struct SelfPause {
  double paused_s = 0;  // the longest gap (0: none past the bound)
  int heartbeats = 0;   // whole heartbeats in it
};
// `looks_s`: the times of consecutive looks, ascending (any origin). heartbeat_s > 0.
SelfPause DetectSelfPause(const std::vector<double>& looks_s, double heartbeat_s, int max_heartbeats = 3);
// "this rank was paused for 7.1 s (its own clock jumped past 7 heartbeats); not naming peers"
std::string SelfPauseText(const SelfPause& pause);

}  // namespace shardgpt
