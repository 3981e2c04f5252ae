// Straggler windows and their scores (see the header).
#include "parallel/straggler.h"

#include <algorithm>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "io/json_fields.h"

namespace shardgpt {

namespace {

double LowerMedian(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t k = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

constexpr int kBusyFigures = static_cast<int>(StragglerFigure::kCommWait);  // data .. optimizer

}  // namespace

const char* StragglerFigureName(int figure) {
  switch (static_cast<StragglerFigure>(figure)) {
    case StragglerFigure::kData: return "data";
    case StragglerFigure::kForward: return "forward";
    case StragglerFigure::kBackward: return "backward";
    case StragglerFigure::kOptimizer: return "optimizer";
    case StragglerFigure::kCommWait: return "comm_wait";
    case StragglerFigure::kCount: break;
  }
  return "unknown";
}

double StragglerTimes::busy() const {
  double b = 0;
  for (int f = 0; f < kBusyFigures; f++) b += s[f];
  return b;
}

void StragglerWindow::BeginStep() { ReadFlightPhaseTotals(at_begin_); }

void StragglerWindow::EndStep(double forward_wait, double backward_wait, double after_backward_wait) {
  int64_t now[kFlightPhases];
  ReadFlightPhaseTotals(now);
  auto phase_s = [&](FlightPhase p) {
    const int i = static_cast<int>(p);
    return static_cast<double>(now[i] - at_begin_[i]) * 1e-9;
  };
  auto own = [](double t, double wait) { return std::max(0.0, t - wait); };
  double* s = window_.s;
  s[static_cast<int>(StragglerFigure::kData)] += phase_s(FlightPhase::kData);
  s[static_cast<int>(StragglerFigure::kForward)] += own(phase_s(FlightPhase::kForward), forward_wait);
  s[static_cast<int>(StragglerFigure::kBackward)] += own(phase_s(FlightPhase::kBackward), backward_wait);
  s[static_cast<int>(StragglerFigure::kOptimizer)] +=
      own(phase_s(FlightPhase::kGradSync) + phase_s(FlightPhase::kOptimizer), after_backward_wait);
  s[static_cast<int>(StragglerFigure::kCommWait)] += forward_wait + backward_wait + after_backward_wait;
  window_.steps++;
}

StragglerTimes StragglerWindow::Take() {
  const StragglerTimes t = window_;
  window_ = StragglerTimes();
  return t;
}

StragglerVerdict ScoreStragglers(const std::vector<StragglerTimes>& ranks, double threshold) {
  StragglerVerdict v;
  const size_t n = ranks.size();
  auto per_step = [](const StragglerTimes& t, double x) { return t.steps > 0 ? x / static_cast<double>(t.steps) : 0.0; };
  std::vector<double> busy(n);
  for (size_t r = 0; r < n; r++) busy[r] = per_step(ranks[r], ranks[r].busy());
  v.median_busy_s = LowerMedian(busy);
  double median[kBusyFigures];
  for (int f = 0; f < kBusyFigures; f++) {
    std::vector<double> x(n);
    for (size_t r = 0; r < n; r++) x[r] = per_step(ranks[r], ranks[r].s[f]);
    median[f] = LowerMedian(x);
  }
  for (size_t r = 0; r < n; r++) {
    v.score.push_back(busy[r] > v.median_busy_s && busy[r] > 0 ? v.median_busy_s / busy[r] : 1.0);
    int worst = 0;
    double excess = -1e300;
    for (int f = 0; f < kBusyFigures; f++) {
      const double e = per_step(ranks[r], ranks[r].s[f]) - median[f];
      if (e > excess) excess = e, worst = f;
    }
    v.phase.push_back(worst);
    if (v.score.back() < threshold) v.stragglers.push_back(static_cast<int>(r));
  }
  return v;
}

std::vector<std::string> StragglerStreaks::Report(const std::vector<std::string>& named,
                                                  const std::vector<std::string>& all_hosts) {
  const std::set<std::string> now(named.begin(), named.end());
  std::vector<std::pair<std::string, int>> next;
  for (const std::string& h : now) {
    int n = 1;
    for (const auto& [host, count] : streak_)
      if (host == h) n = count + 1;
    next.emplace_back(h, n);
  }
  streak_ = std::move(next);
  const std::set<std::string> every(all_hosts.begin(), all_hosts.end());
  std::vector<std::string> out;
  for (const auto& [host, count] : streak_)
    if (k_ > 0 && count >= k_) out.push_back(host);
  if (out.size() >= every.size()) out.clear();  // no host would be left
  return out;
}

Status RecordExcludedHosts(const std::string& path, const std::vector<std::string>& hosts) {
  std::string text;
  StatusOr<std::string> old = ReadTextFile(path, "the hosts to exclude");
  if (old.ok()) text = *old;
  else if (old.status().code() != Status::Code::kNotFound) return old.status();
  std::set<std::string> have;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) have.insert(line);
  if (!text.empty() && text.back() != '\n') text += '\n';
  for (const std::string& h : hosts)
    if (!h.empty() && have.insert(h).second) text += h + "\n";
  return WriteTextFileAtomic(path, text);  // ranks ended by the watchdog may record at once
}

std::vector<std::string> HostsToExclude(const std::vector<int>& ranks, const std::vector<std::string>& hosts_by_rank) {
  std::set<std::string> named, every(hosts_by_rank.begin(), hosts_by_rank.end());
  for (int r : ranks)
    if (r >= 0 && static_cast<size_t>(r) < hosts_by_rank.size()) named.insert(hosts_by_rank[r]);
  if (named.size() >= every.size()) return {};
  return {named.begin(), named.end()};
}

}  // namespace shardgpt
