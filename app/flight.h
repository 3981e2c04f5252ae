// The trainer's side of the flight recorder: the job's identity for the dumps, the signal
// handlers and the test fault hooks (parallel/flight_recorder.h, parallel/flight_dump.h).
#pragma once

#include <string>

#include "base/status.h"
#include "parallel/communicator.h"
#include "parallel/flight_dump.h"

namespace shardgpt {

// Collective over `world`: agrees on a run id (rank 0's, or SLURM_JOB_ID.SLURM_RESTART_COUNT
// style where Slurm sets them), gathers every rank's host name, configures the dumps to go to
// `dir` (empty: no dumps), installs SIGUSR2 / crash handlers and arms SHARDGPT_TEST_FAULT and
// SHARDGPT_TEST_SLOW. *job (if given): the identity the dumps state (run id, hosts by rank).
Status SetUpFlightRecorder(Communicator& world, const std::string& dir, FlightJob* job = nullptr);

}  // namespace shardgpt
