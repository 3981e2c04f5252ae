#include "parallel/stall_verdict.h"

#include <cstdio>

namespace shardgpt {

std::string StallVerdict(long long call, int self, const std::vector<PeerNotes>& peers, double silence_s,
                         const std::vector<int>& world_ranks) {
  std::string missing, silent;
  double longest_quiet = 0;
  for (size_t p = 0; p < peers.size(); p++) {
    if (static_cast<int>(p) == self) continue;
    const std::string name = std::to_string(world_ranks[p]);
    if (peers[p].latest_call < call) {
      missing += (missing.empty() ? "" : ", ") + name;
    } else if (peers[p].latest_call == call && peers[p].quiet_s > silence_s) {
      silent += (silent.empty() ? "" : ", ") + name;
      if (peers[p].quiet_s > longest_quiet) longest_quiet = peers[p].quiet_s;
    }
  }
  std::string verdict;
  if (!missing.empty()) verdict = "rank(s) " + missing + " did not arrive (stopped, hung or dead)";
  if (!silent.empty()) {
    char quiet[32];
    std::snprintf(quiet, sizeof(quiet), "%.0f", longest_quiet);
    verdict += (verdict.empty() ? "" : "; ") + std::string("rank(s) ") + silent + " arrived but sent nothing for " +
               quiet + " s (stopped or hung inside the call)";
  }
  return verdict;
}

std::vector<int> StallCulprits(long long call, int self, const std::vector<PeerNotes>& peers, double silence_s,
                               const std::vector<int>& world_ranks) {
  std::vector<int> missing, silent;
  for (size_t p = 0; p < peers.size(); p++) {
    if (static_cast<int>(p) == self) continue;
    if (peers[p].latest_call < call) missing.push_back(world_ranks[p]);
    else if (peers[p].latest_call == call && peers[p].quiet_s > silence_s) silent.push_back(world_ranks[p]);
  }
  missing.insert(missing.end(), silent.begin(), silent.end());
  return missing;
}

SelfPause DetectSelfPause(const std::vector<double>& looks_s, double heartbeat_s, int max_heartbeats) {
  SelfPause pause;
  if (heartbeat_s <= 0) return pause;
  for (size_t i = 1; i < looks_s.size(); i++) {
    const double gap = looks_s[i] - looks_s[i - 1];
    if (gap > max_heartbeats * heartbeat_s && gap > pause.paused_s) {
      pause.paused_s = gap;
      pause.heartbeats = static_cast<int>(gap / heartbeat_s);
    }
  }
  return pause;
}

std::string SelfPauseText(const SelfPause& pause) {
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "this rank was paused for %.1f s (its own clock jumped past %d heartbeats); not naming peers",
                pause.paused_s, pause.heartbeats);
  return buf;
}

}  // namespace shardgpt
