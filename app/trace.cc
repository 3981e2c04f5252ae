// The per-rank Chrome traces and their merge (see the header).
#include "app/trace.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

namespace shardgpt {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSchema = "shardgpt-trace";
constexpr int kVersion = 1;

std::string UnitName(int unit, const std::vector<std::string>& names) {
  if (unit < 0) return "";
  return unit < static_cast<int>(names.size()) ? names[unit] : "unit " + std::to_string(unit);
}

json Meta(const char* what, int pid, int tid, const json& args) {
  json e = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", args}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

}  // namespace

std::string TraceFileName(const std::string& dir, int world_rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "trace_rank_%05d.json", world_rank);
  return dir + "/" + name;
}

json RankTraceJson(const FlightJob& job, int64_t first, int64_t last, const std::vector<FlightSpan>& spans,
                   size_t dropped, const std::vector<std::string>& unit_names) {
  // the steady clock's nanoseconds as wall-clock microseconds, so that hosts' traces line up
  timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  const int64_t steady = FlightNowNs();
  const double offset_us = (static_cast<double>(wall.tv_sec) * 1e9 + static_cast<double>(wall.tv_nsec) -
                            static_cast<double>(steady)) * 1e-3;
  auto us = [&](int64_t ns) { return std::round(static_cast<double>(ns) + offset_us * 1e3) * 1e-3; };
  const int pid = job.world_rank;
  json events = json::array();
  events.push_back(Meta("process_name", pid, -1, {{"name", "rank " + std::to_string(pid) + " (" + job.host + ")"}}));
  events.push_back(Meta("process_sort_index", pid, -1, {{"sort_index", pid}}));
  events.push_back(Meta("thread_name", pid, 0, {{"name", "phases"}}));
  events.push_back(Meta("thread_sort_index", pid, 0, {{"sort_index", 0}}));
  for (const FlightSpan& s : spans) {
    const std::string unit = UnitName(s.unit, unit_names);
    std::string name = FlightPhaseName(s.phase);
    if (!unit.empty()) name += " " + unit;
    json args = {{"step", s.step}, {"micro", s.micro}};
    if (s.unit >= 0) args["unit"] = s.unit, args["unit_name"] = unit;
    events.push_back({{"ph", "X"}, {"cat", "phase"}, {"name", name}, {"pid", pid}, {"tid", 0}, {"ts", us(s.begin_ns)},
                      {"dur", std::max(0.0, (s.end_ns - s.begin_ns) * 1e-3)}, {"args", args}});
  }
  int track = 1;
  for (int i = 0; i < kMaxFlightRings; i++) {
    const FlightRing* ring = FlightRingAt(i);
    if (ring == nullptr) continue;
    const int tid = track++;
    events.push_back(Meta("thread_name", pid, tid, {{"name", std::string("comm ") + ring->name()}}));
    events.push_back(Meta("thread_sort_index", pid, tid, {{"sort_index", tid}}));
    std::vector<json> mine;
    FlightEntry e;
    for (uint64_t seq = ring->last_seq(); seq >= 1 && ring->Read(seq, &e); seq--) {
      if (e.step >= 0 && e.step < first) break;  // entries are in issue order: the window is behind
      if (e.step < first || e.step > last || e.started_ns == 0 || e.completed_ns == 0) continue;
      // the unit names data-plane collectives only (a control op keeps the last unit set)
      const bool data_plane = e.op < FlightOp::kBarrier;
      const std::string unit = data_plane ? UnitName(e.unit, unit_names) : "";
      std::string name = FlightOpName(e.op);
      if (!unit.empty()) name += " " + unit;
      json args = {{"comm", ring->name()}, {"seq", e.seq}, {"dtype", DTypeName(e.dtype)}, {"count", e.count},
                   {"bytes", e.bytes}, {"step", e.step}, {"micro", e.micro}, {"state", FlightStateName(e.state)},
                   {"queued_us", (e.started_ns - e.queued_ns) * 1e-3}};
      if (data_plane && e.unit >= 0) args["unit"] = e.unit, args["unit_name"] = unit;
      mine.push_back({{"ph", "X"}, {"cat", "collective"}, {"name", name}, {"pid", pid}, {"tid", tid},
                      {"ts", us(e.started_ns)}, {"dur", std::max(0.0, (e.completed_ns - e.started_ns) * 1e-3)},
                      {"args", args}});
    }
    for (auto it = mine.rbegin(); it != mine.rend(); ++it) events.push_back(std::move(*it));
  }
  json other = {{"schema", kSchema}, {"version", kVersion}, {"run_id", job.run_id}, {"world_rank", job.world_rank},
                {"world_size", job.world_size}, {"host", job.host}, {"steps", {first, last}},
                {"spans_dropped", dropped}};
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

Status WriteTraceFile(const std::string& path, const json& trace) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Status::IOError(tmp + ": cannot write the trace: " + std::strerror(errno));
    out << trace.dump() << "\n";
    out.close();
    if (!out) {
      const int err = errno;
      std::remove(tmp.c_str());
      return Status::IOError(path + ": cannot write the trace: " + std::strerror(err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::IOError(path + ": cannot write the trace: " + std::strerror(err));
  }
  return Status::OK();
}

Status MergeTraces(const std::string& dir, const std::string& out, int* ranks) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::InvalidArgument(dir + ": not a folder of traces");
  static const std::regex kName(R"(trace_rank_(\d{5})\.json)");
  std::map<int, fs::path> files;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = f.path().filename().string();
    if (std::regex_match(name, m, kName)) files[std::stoi(m[1].str())] = f.path();
  }
  if (files.empty())
    return Status::InvalidArgument(dir + ": no traces here (trace_rank_XXXXX.json, written by train --trace " + dir + ")");
  json events = json::array(), hosts = json::array(), rank_list = json::array();
  std::string run_id, run_file;
  json steps, world_size;
  double origin = 0;
  bool have_origin = false;
  for (const auto& [rank, path] : files) {
    std::ifstream in(path);
    if (!in) return Status::IOError(path.string() + ": cannot read the trace");
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return Status::InvalidArgument(path.string() + ": not a complete trace (truncated or not JSON)");
    const json other = j.value("otherData", json::object());
    if (other.value("schema", "") != kSchema || !j.contains("traceEvents") || !j["traceEvents"].is_array())
      return Status::InvalidArgument(path.string() + ": not a shardgpt trace (no \"otherData\": {\"schema\": \"" +
                                     std::string(kSchema) + "\"})");
    if (other.value("version", 0) != kVersion)
      return Status::InvalidArgument(path.string() + ": trace version " + std::to_string(other.value("version", 0)) +
                                     ", this shardgpt reads version " + std::to_string(kVersion));
    const std::string id = other.value("run_id", "");
    if (run_file.empty()) {
      run_id = id, run_file = path.string(), steps = other.value("steps", json()), world_size = other.value("world_size", json());
    } else if (id != run_id) {
      return Status::InvalidArgument(dir + ": traces of different runs (" + run_file + ": run " + run_id + ", " +
                                     path.string() + ": run " + id + "): move one run's traces to a folder of their own");
    }
    rank_list.push_back(rank);
    hosts.push_back(other.value("host", ""));
    for (json& e : j["traceEvents"]) {
      if (e.contains("ts") && e["ts"].is_number()) {
        const double ts = e["ts"].get<double>();
        if (!have_origin || ts < origin) origin = ts, have_origin = true;
      }
      events.push_back(std::move(e));
    }
  }
  for (json& e : events)
    if (e.contains("ts") && e["ts"].is_number()) e["ts"] = std::round((e["ts"].get<double>() - origin) * 1e3) * 1e-3;
  json other = {{"schema", "shardgpt-trace-merged"}, {"version", kVersion}, {"run_id", run_id}, {"world_size", world_size},
                {"ranks", rank_list}, {"hosts", hosts}, {"steps", steps}, {"origin_unix_us", origin}};
  *ranks = static_cast<int>(files.size());
  return WriteTraceFile(out, {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", other}});
}

}  // namespace shardgpt
