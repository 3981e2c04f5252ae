// Start-up and per-step reports: measured model-state memory and traffic beside the seed's
// formulas (the measured figures come from the engine's ledgers, never from the formula).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/param_layout.h"
#include "parallel/engine.h"

namespace shardgpt {

// Prints, on the calling rank, its model-state bytes by kind (measured and formula), every
// rank's total, the traffic formula for one step, and the accumulation trade-off (stages 2, 3).
void PrintStartupReport(Engine& engine, const ParamLayout& layout, int grad_accum,
                        const std::vector<uint64_t>& state_bytes_per_rank);
// The ledger fields of one step's JSON line.
nlohmann::json StepJson(const StepReport& report, const Engine& engine, const ParamLayout& layout, int grad_accum);
// Every rank's value, on every rank. Collective.
std::vector<uint64_t> GatherPerRank(Communicator& comm, uint64_t value);

}  // namespace shardgpt
