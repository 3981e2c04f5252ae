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

}  // namespace shardgpt
