#include "app/flight.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "app/diagnose.h"
#include "base/clock.h"
#include "parallel/flight_dump.h"
#include "parallel/flight_recorder.h"

namespace shardgpt {

Status SetUpFlightRecorder(Communicator& world, const std::string& dir, FlightJob* job_out) {
  constexpr size_t kHost = 64, kId = 32;
  char host[kHost] = {};
  gethostname(host, kHost - 1);
  // a run id from rank 0's clock and pid: every launch (and every requeue) differs
  char id[kId] = {};
  if (world.rank() == 0) {
    const auto t = static_cast<unsigned long long>(MonotonicSeconds() * 1e6);
    std::snprintf(id, kId, "%llx-%lx", t ^ (static_cast<unsigned long long>(time(nullptr)) << 20),
                  static_cast<long>(getpid()));
  }
  SHARDGPT_RETURN_IF_ERROR(world.ControlBroadcast(id, kId, 0));
  std::vector<char> hosts(kHost * world.world_size());
  SHARDGPT_RETURN_IF_ERROR(world.ControlAllGather(host, hosts.data(), kHost));
  FlightJob job;
  job.dir = dir;
  job.run_id.assign(id, strnlen(id, kId));
  int world_rank = world.rank();
  if (FlightRing* ring = world.flight_ring()) world_rank = ring->world_ranks()[world.rank()];
  job.world_rank = world_rank;
  job.world_size = world.world_size();
  job.host = host;
  for (int r = 0; r < world.world_size(); r++) job.hosts.emplace_back(&hosts[r * kHost], strnlen(&hosts[r * kHost], kHost));
  if (const char* s = std::getenv("SLURM_JOB_ID")) job.slurm_job_id = s;
  ConfigureFlightDumps(job);
  SetJobVerdictFn(&JobVerdictHeadline);  // the watchdog's one verdict: diagnose's analysis
  if (job_out != nullptr) *job_out = job;
  InstallFlightSignalHandlers();
  ArmFlightFault(world_rank);
  SetFlightPhase(FlightPhase::kSetup);
  return Status::OK();
}

}  // namespace shardgpt
