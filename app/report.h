// Start-up and per-step reports: measured model-state memory and traffic beside the seed's
// formulas (the measured figures come from the engine's ledgers, never from the formula).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/param_layout.h"
#include "parallel/engine.h"

namespace shardgpt {

// Prints, on the calling rank, model-state bytes by kind (measured and formula), the traffic
// formula for one step, and the accumulation trade-off for stages 2 and 3.
void PrintStartupReport(Engine& engine, const ParamLayout& layout, int grad_accum);
// The ledger fields of one step's JSON line.
nlohmann::json StepJson(const StepReport& report, const Engine& engine, const ParamLayout& layout, int grad_accum);
// Every rank's value, on every rank. Collective.
std::vector<uint64_t> GatherPerRank(Communicator& comm, uint64_t value);
// Makes every rank return an error when any rank has one; exactly one rank keeps the message.
Status Agree(Communicator& comm, Status local);

}  // namespace shardgpt
