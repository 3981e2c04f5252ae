// The timeline (--trace DIR --trace-steps A:B, docs/DIAGNOSE.md): each rank writes the phases
// and collectives of steps A..B as a Chrome trace-event JSON, DIR/trace_rank_XXXXX.json, and
// `shardgpt diagnose --merge-trace DIR` merges the ranks' files into one (a process per rank)
// that Perfetto and chrome://tracing open; scripts/plot.py draws it as a Gantt chart.
//
// A rank's file: "traceEvents" with complete events ("ph": "X", "ts" and "dur" in microseconds
// on the rank's wall clock), pid = the world rank; tid 0 the phases (from the flight recorder's
// phase trace, FlightSpan), tid 1 + i the collectives of communicator i as they ran on its
// communication thread (started to completed, from the flight recorder's rings: with
// --flight-recorder 0 there are none); "otherData" the identity: schema "shardgpt-trace",
// version 1, run_id, world_rank, world_size, host, steps [A, B].
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/flight_dump.h"
#include "parallel/flight_recorder.h"

namespace shardgpt {

// DIR/trace_rank_XXXXX.json for a world rank.
std::string TraceFileName(const std::string& dir, int world_rank);

// The trace of one rank as JSON: the spans (CopyFlightTrace), the collectives of steps
// first..last that the registered rings still hold, unit names by unit index (for the event
// names: "forward h.3"). `dropped`: spans the buffer could not keep (stated in otherData).
nlohmann::json RankTraceJson(const FlightJob& job, int64_t first, int64_t last, const std::vector<FlightSpan>& spans,
                             size_t dropped, const std::vector<std::string>& unit_names);

// Writes `trace` to `path` through a temporary file and rename.
Status WriteTraceFile(const std::string& path, const nlohmann::json& trace);

// Reads DIR/trace_rank_*.json and writes their merge to `out` (rebased so that the earliest
// event is at 0; otherData names every rank). Errors, one line naming the folder or file: no
// traces, a file that does not parse (truncated), not a shardgpt trace, traces of different
// runs. *ranks: how many rank files were merged.
Status MergeTraces(const std::string& dir, const std::string& out, int* ranks);

}  // namespace shardgpt
