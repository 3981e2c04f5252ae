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

}  // namespace shardgpt
