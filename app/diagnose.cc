#include "app/diagnose.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace shardgpt {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Verdict strength: the report's verdict is the strongest one found.
int Strength(const std::string& v) {
  if (v == "mismatch") return 4;
  if (v == "not-arrived") return 3;
  if (v == "no-dump") return 2;
  if (v == "stuck-in-transport") return 1;
  return 0;
}

struct Entry {
  std::string op, dtype, state;
  unsigned long long count = 0;
  int unit = -1;
  long long step = -1;
};

struct Ring {
  long long last_seq = 0, first_seq = 0;
  std::map<long long, Entry> entries;
};

struct Dump {
  int rank = -1;
  std::string file;
  json j;
  std::map<std::string, Ring> rings;  // by communicator key
};

std::string Key(const std::string& name, const std::vector<int>& ranks) {
  std::string k = name + ":";
  for (int r : ranks) k += std::to_string(r) + ",";
  return k;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string Phase(const json& d, double* age, long long* step) {
  const json& p = d["phase"];
  std::string name = p.value("name", "unknown");
  const int unit = p.value("unit", -1);
  if (unit >= 0) name += " unit " + std::to_string(unit);
  *age = (d.value("now_ns", 0LL) - p.value("since_ns", 0LL)) * 1e-9;
  *step = p.value("step", -1LL);
  return name;
}

Status ReadDump(const fs::path& path, Dump* out) {
  std::ifstream in(path);
  if (!in) return Status::IOError(path.string() + ": cannot read the flight dump");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument(path.string() + ": not a complete flight dump (truncated or not JSON)");
  if (j.value("schema", "") != "shardgpt-flight")
    return Status::InvalidArgument(path.string() + ": not a shardgpt flight dump (no \"schema\": \"shardgpt-flight\")");
  if (j.value("version", 0) != 1)
    return Status::InvalidArgument(path.string() + ": flight dump version " + std::to_string(j.value("version", 0)) +
                                   ", this shardgpt reads version 1");
  try {
    out->rank = j.at("world_rank").get<int>();
    for (const json& c : j.at("communicators")) {
      Ring ring;
      ring.last_seq = c.at("last_seq").get<long long>();
      for (const json& e : c.at("entries")) {
        Entry x;
        x.op = e.at("op").get<std::string>();
        x.dtype = e.at("dtype").get<std::string>();
        x.state = e.at("state").get<std::string>();
        x.count = e.at("count").get<unsigned long long>();
        x.unit = e.at("unit").get<int>();
        x.step = e.at("step").get<long long>();
        ring.entries[e.at("seq").get<long long>()] = x;
      }
      ring.first_seq = ring.entries.empty() ? ring.last_seq + 1 : ring.entries.begin()->first;
      out->rings[Key(c.at("name").get<std::string>(), c.at("ranks").get<std::vector<int>>())] = std::move(ring);
    }
  } catch (const std::exception& e) {
    return Status::InvalidArgument(path.string() + ": a flight dump with a missing or mistyped field: " + e.what());
  }
  out->file = path.string();
  out->j = std::move(j);
  return Status::OK();
}

DiagnoseRank RankAt(const Dump& d, const Ring& ring, const Entry* e) {
  DiagnoseRank r;
  r.rank = d.rank;
  r.last_seq = ring.last_seq;
  if (e == nullptr && !ring.entries.empty()) e = &ring.entries.rbegin()->second;
  if (e != nullptr) r.op = e->op, r.dtype = e->dtype, r.state = e->state, r.count = e->count, r.unit = e->unit;
  r.phase = Phase(d.j, &r.phase_age_s, &r.step);
  return r;
}

// The first disagreement on one communicator.
DiagnoseComm Judge(const std::string& name, const std::vector<int>& members, const std::map<int, Dump>& dumps) {
  DiagnoseComm c;
  c.name = name;
  c.ranks = members;
  c.verdict = "all-idle";
  const std::string key = Key(name, members);
  std::vector<std::pair<const Dump*, const Ring*>> have;
  bool missing_dump = false;
  for (int r : members) {
    auto it = dumps.find(r);
    if (it == dumps.end() || !it->second.rings.count(key)) {
      missing_dump = true;
      continue;
    }
    have.push_back({&it->second, &it->second.rings.at(key)});
  }
  if (have.empty()) return c;
  long long lo = 1, hi = 0;
  for (auto& h : have) lo = std::max(lo, h.second->first_seq), hi = std::max(hi, h.second->last_seq);
  c.last_seq = hi;
  for (long long s = lo; s <= hi; s++) {
    // the signature (op, dtype, count) of each rank that issued s
    std::map<std::string, std::vector<std::pair<const Dump*, const Entry*>>> by_sig;
    std::vector<std::pair<const Dump*, const Ring*>> absent;
    bool all_done = true;
    for (auto& h : have) {
      auto e = h.second->entries.find(s);
      if (h.second->last_seq < s || e == h.second->entries.end()) {
        if (h.second->last_seq < s) absent.push_back(h);
        continue;
      }
      const Entry& x = e->second;
      by_sig[x.op + " " + x.dtype + " x " + std::to_string(x.count)].push_back({h.first, &x});
      if (x.state != "completed") all_done = false;
    }
    if (by_sig.empty()) continue;
    // the majority signature: what the arrived ranks agree on
    auto major = by_sig.begin();
    for (auto it = by_sig.begin(); it != by_sig.end(); ++it)
      if (it->second.size() > major->second.size()) major = it;
    const Entry& m = *major->second.front().second;
    c.seq = s, c.op = m.op, c.dtype = m.dtype, c.count = m.count, c.unit = m.unit, c.step = m.step;
    for (auto& p : major->second) c.arrived.push_back(p.first->rank);
    if (by_sig.size() > 1) {
      c.verdict = "mismatch";
      for (auto it = by_sig.begin(); it != by_sig.end(); ++it)
        if (it != major && it->second.size() == major->second.size()) c.no_majority = true;
      for (auto it = by_sig.begin(); it != by_sig.end(); ++it) {
        if (it == major) continue;
        for (auto& p : it->second) c.culprits.push_back(RankAt(*p.first, p.first->rings.at(key), p.second));
      }
      return c;
    }
    if (!absent.empty()) {
      c.verdict = "not-arrived";
      for (auto& a : absent) c.culprits.push_back(RankAt(*a.first, *a.second, nullptr));
      return c;
    }
    if (!all_done) {
      c.verdict = missing_dump ? "no-dump" : "stuck-in-transport";
      for (auto& p : major->second) c.culprits.push_back(RankAt(*p.first, p.first->rings.at(key), p.second));
      return c;
    }
    c.arrived.clear();
    c.seq = 0;
  }
  c.op.clear(), c.dtype.clear(), c.count = 0, c.unit = -1, c.step = -1;
  if (missing_dump) c.verdict = "no-dump";
  return c;
}

std::string Describe(const std::string& op, const std::string& dtype, unsigned long long count, int unit,
                     long long step) {
  std::string s = op + " " + dtype + " x " + std::to_string(count);
  if (unit >= 0) s += ", unit " + std::to_string(unit);
  if (step >= 0) s += ", step " + std::to_string(step);
  return s;
}

std::string Seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f s", s);
  return b;
}

}  // namespace

StatusOr<DiagnoseReport> Diagnose(const std::string& dir, const std::string& run_id) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::NotFound(dir + ": no such directory (give the flight dump folder, e.g. CKPT_DIR/flight)");
  const std::regex name(R"(rank_(\d{5})(\.(\d+))?\.json)");
  std::map<int, std::pair<int, fs::path>> latest;  // rank -> (index, path)
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string f = e.path().filename().string();
    if (!std::regex_match(f, m, name)) continue;
    const int rank = std::stoi(m[1]), index = m[3].matched ? std::stoi(m[3]) : 0;
    auto it = latest.find(rank);
    if (it == latest.end() || it->second.first < index) latest[rank] = {index, e.path()};
  }
  if (latest.empty()) return Status::NotFound(dir + ": no flight dumps here (rank_XXXXX.json files)");
  std::map<int, Dump> dumps;
  for (auto& [rank, at] : latest) {
    Dump d;
    SHARDGPT_RETURN_IF_ERROR(ReadDump(at.second, &d));
    if (!run_id.empty() && d.j.value("run_id", "") != run_id) continue;
    dumps[d.rank] = std::move(d);
  }
  if (dumps.empty()) return Status::NotFound(dir + ": no flight dumps of run " + run_id + " here");
  DiagnoseReport r;
  r.dir = dir;
  std::map<std::string, std::vector<int>> runs;
  for (auto& [rank, d] : dumps) runs[d.j.value("run_id", "")].push_back(rank);
  if (runs.size() > 1) {
    std::string what;
    for (auto& [id, ranks] : runs) what += (what.empty() ? "" : "; ") + std::string("run ") + id + ": rank(s) " + RankList(ranks);
    return Status::InvalidArgument(dir + ": flight dumps of different runs (" + what +
                                   "); move one run's dumps to a folder of their own");
  }
  r.run_id = runs.begin()->first;
  r.world_size = dumps.begin()->second.j.value("world_size", 0);
  for (auto& [rank, d] : dumps) {
    r.dumped.push_back(rank);
    r.reasons.push_back("rank " + std::to_string(rank) + ": " + d.j.value("reason", "?"));
    if (d.j.value("reason", "") == "paused") r.paused.push_back(rank);
  }
  for (int k = 0; k < r.world_size; k++)
    if (!dumps.count(k)) r.no_dump.push_back(k);
  // every communicator any dump names, once
  std::map<std::string, std::pair<std::string, std::vector<int>>> comms;
  for (auto& [rank, d] : dumps)
    for (const json& c : d.j["communicators"]) {
      auto ranks = c["ranks"].get<std::vector<int>>();
      comms[Key(c["name"], ranks)] = {c["name"].get<std::string>(), ranks};
    }
  r.verdict = r.no_dump.empty() ? "all-idle" : "no-dump";
  for (auto& [key, c] : comms) {
    DiagnoseComm j = Judge(c.first, c.second, dumps);
    if (Strength(j.verdict) > Strength(r.verdict)) r.verdict = j.verdict;
    r.comms.push_back(std::move(j));
  }
  // a rank that was itself paused explains its peers' stall; only a mismatch is stronger
  if (!r.paused.empty() && r.verdict != "mismatch") r.verdict = "paused";
  // the communicators with a finding first
  std::stable_sort(r.comms.begin(), r.comms.end(),
                   [](const DiagnoseComm& a, const DiagnoseComm& b) { return Strength(a.verdict) > Strength(b.verdict); });
  return r;
}

std::string FormatDiagnose(const DiagnoseReport& r) {
  std::ostringstream o;
  o << r.verdict << "\n";
  for (const DiagnoseComm& c : r.comms) {
    o << c.name << " (ranks " << RankList(c.ranks) << "): ";
    if (c.verdict == "all-idle") {
      o << "no disagreement (every collective up to seq " << c.last_seq << " completed)\n";
      continue;
    }
    if (c.seq == 0) {
      o << "no disagreement among the ranks that left a dump (up to seq " << c.last_seq << ")\n";
      continue;
    }
    const std::string what = Describe(c.op, c.dtype, c.count, c.unit, c.step);
    if (c.verdict == "not-arrived") {
      o << "seq " << c.seq << " (" << what << "): rank(s) " << RankList(c.arrived) << " arrived";
      for (const DiagnoseRank& x : c.culprits)
        o << "; rank " << x.rank << " never reached it (its last is seq " << x.last_seq << ", " << x.op << " "
          << x.state << "), phase " << x.phase << " for " << Seconds(x.phase_age_s) << " (step " << x.step << ")";
      o << "\n";
    } else if (c.verdict == "mismatch") {
      o << "seq " << c.seq << ": rank(s) " << RankList(c.arrived) << " issued " << what;
      for (const DiagnoseRank& x : c.culprits)
        o << "; rank " << x.rank << " issued " << Describe(x.op, x.dtype, x.count, x.unit, -1)
          << (c.no_majority ? " (no majority: either side may be the culprit)" : " (the culprit)") << ", phase "
          << x.phase << " for " << Seconds(x.phase_age_s);
      o << "\n";
    } else {  // stuck-in-transport, no-dump
      o << "seq " << c.seq << " (" << what << "): rank(s) " << RankList(c.arrived) << " arrived and none completed"
        << (c.verdict == "no-dump" ? " (a member left no dump: dead?)" : " (the network or MPI/NCCL itself)") << "\n";
    }
  }
  if (!r.paused.empty())
    o << "rank(s) " << RankList(r.paused)
      << " paused (the process itself did not run for several heartbeats: SIGSTOP, a frozen VM, swapped out)\n";
  if (!r.no_dump.empty()) o << "no dump from rank(s) " << RankList(r.no_dump) << " (dead, or killed before it could write)\n";
  o << "dumps: ";
  for (size_t i = 0; i < r.reasons.size(); i++) o << (i ? ", " : "") << r.reasons[i];
  o << " (run " << r.run_id << ", " << r.world_size << " rank(s))\n";
  return o.str();
}

std::string DiagnoseHeadline(const DiagnoseReport& r) {
  const DiagnoseComm* c = nullptr;  // the communicator the verdict comes from
  for (const DiagnoseComm& x : r.comms)
    if (x.verdict == r.verdict && x.seq != 0) {
      c = &x;
      break;
    }
  std::ostringstream o;
  o << r.verdict;
  auto where = [&](const DiagnoseComm& x) {
    return "seq " + std::to_string(x.seq) + " on " + x.name + " (" + Describe(x.op, x.dtype, x.count, x.unit, x.step) + ")";
  };
  if (r.verdict == "paused") {
    o << ": culprit rank(s) " << RankList(r.paused)
      << ": the process itself was paused (SIGSTOP, a frozen VM, swapped out)";
    for (const DiagnoseComm& x : r.comms)
      if (x.seq != 0) {
        o << "; rank(s) " << RankList(x.arrived) << " wait in " << where(x);
        break;
      }
  } else if ((r.verdict == "not-arrived" || r.verdict == "mismatch") && c != nullptr && !c->culprits.empty()) {
    std::vector<int> ranks;
    for (const DiagnoseRank& k : c->culprits) ranks.push_back(k.rank);
    const DiagnoseRank& k = c->culprits.front();
    o << ": culprit rank(s) " << RankList(ranks) << ": ";
    if (r.verdict == "not-arrived")
      o << "never reached " << where(*c);
    else
      o << "issued " << Describe(k.op, k.dtype, k.count, k.unit, -1) << " at " << where(*c) << " where rank(s) "
        << RankList(c->arrived) << " issued " << Describe(c->op, c->dtype, c->count, c->unit, -1)
        << (c->no_majority ? " (no majority: either side may be the culprit)" : "");
    o << ", phase " << k.phase << " for " << Seconds(k.phase_age_s);
  } else if (r.verdict == "no-dump") {
    if (!r.no_dump.empty())
      o << ": culprit rank(s) " << RankList(r.no_dump) << ": left no dump (stopped, dead or killed before it could write)";
    else
      o << ": a member left no record of a communicator";
    if (c != nullptr) o << "; rank(s) " << RankList(c->arrived) << " wait in " << where(*c);
  } else if (r.verdict == "stuck-in-transport" && c != nullptr) {
    o << ": every rank arrived at " << where(*c) << " and none completed (the network or MPI itself)";
  } else {
    o << ": no disagreement in the dumps";
  }
  return o.str();
}

std::string JobVerdictHeadline(const std::string& dir, const std::string& run_id) {
  StatusOr<DiagnoseReport> r = Diagnose(dir, run_id);
  return r.ok() ? DiagnoseHeadline(r.value()) : "";
}

json DiagnoseToJson(const DiagnoseReport& r) {
  json j;
  j["verdict"] = r.verdict;
  j["run_id"] = r.run_id;
  j["world_size"] = r.world_size;
  j["dumped"] = r.dumped;
  j["no_dump"] = r.no_dump;
  j["paused"] = r.paused;
  j["communicators"] = json::array();
  for (const DiagnoseComm& c : r.comms) {
    json x;
    x["name"] = c.name, x["ranks"] = c.ranks, x["verdict"] = c.verdict, x["seq"] = c.seq, x["last_seq"] = c.last_seq;
    x["op"] = c.op, x["dtype"] = c.dtype, x["count"] = c.count, x["unit"] = c.unit, x["step"] = c.step;
    x["arrived"] = c.arrived;
    x["no_majority"] = c.no_majority;
    x["culprits"] = json::array();
    for (const DiagnoseRank& k : c.culprits)
      x["culprits"].push_back({{"rank", k.rank}, {"last_seq", k.last_seq}, {"op", k.op}, {"dtype", k.dtype},
                               {"count", k.count}, {"unit", k.unit}, {"state", k.state}, {"phase", k.phase},
                               {"phase_age_s", k.phase_age_s}, {"step", k.step}});
    j["communicators"].push_back(x);
  }
  return j;
}

}  // namespace shardgpt
