// Flight dumps: each rank's flight recorder (parallel/flight_recorder.h) written as one JSON file,
// DIR/rank_XXXXX.json (then rank_XXXXX.1.json, .2 ... : an earlier dump is never overwritten),
// for `shardgpt diagnose` (docs/DIAGNOSE.md has the schema).
//
// Written on a watchdog expiry (MPI, NCCL), a job-ending collective failure, a divergence stop,
// SIGUSR2 (the run goes on) and, best effort, SIGSEGV / SIGBUS / SIGABRT. The writer is
// async-signal-safe: the job's identity is formatted once by ConfigureFlightDumps; the dump
// itself uses only open, write, link, rename, unlink, mkdir and clock_gettime on stack buffers,
// into a temporary file that is linked to its final name (so a reader never sees half a dump).
// One dump at a time per process: a dump that starts while another is being written is skipped.
#pragma once

#include <string>
#include <vector>

namespace shardgpt {

// Who this process is, as every dump of the run states it (diagnose refuses to mix runs).
struct FlightJob {
  std::string dir;      // where dumps go (created on the first dump); empty: no dumps
  std::string run_id;   // the same on every rank of one launch
  int world_rank = 0;
  int world_size = 1;
  std::string host;
  std::vector<std::string> hosts;  // by world rank
  std::string slurm_job_id;        // empty outside Slurm
};

// Sets the identity for later dumps; not async-signal-safe (call at setup, before the run).
void ConfigureFlightDumps(const FlightJob& job);
bool FlightDumpsConfigured();

// Writes one dump; `reason` is a short token ("sigusr2", "comm_timeout", ...). Returns the
// dump's index (0 for rank_XXXXX.json, N for .N.json), or -1 when nothing was written
// (no directory configured, a dump already in progress, a write failing). Prints one line on
// stderr naming the file. Async-signal-safe.
int WriteFlightDump(const char* reason);
// The same, at most once per process over all calls (the job-ending paths, which may race:
// the watchdog of two communicators, a peer's request, a crash signal).
int WriteFlightDumpOnce(const char* reason);

// SIGUSR2: a dump, and the run goes on. SIGSEGV, SIGBUS, SIGABRT: a dump (once), then the
// default action (the process dies by the same signal). On an alternate signal stack, so a
// stack overflow still dumps.
void InstallFlightSignalHandlers();

// One verdict for the job when a watchdog expires. Each rank whose watchdog expired writes its
// dump; the first of them to claim the verdict (a file created once per run in the dump
// directory) asks every peer for its dump, waits a bounded time for them, and prints one line
// from the dumps' analysis; the others print a line naming that rank and wait, bounded, for it
// to finish before the job ends.
//
// The analysis: a function of the dump directory and the run id (only that run's dumps count)
// returning one line ("not-arrived: rank 2 ..."), or empty when the dumps cannot tell. Set by
// the program before the run (the trainer passes `shardgpt diagnose`'s analysis); unset, or
// without a dump directory, every rank states its own view instead.
using JobVerdictFn = std::string (*)(const std::string& dir, const std::string& run_id);
void SetJobVerdictFn(JobVerdictFn fn);
// The analysis of this run's dumps; empty without a function or a dump directory.
std::string JobVerdictFromDumps();
// The dump directory and run id ConfigureFlightDumps was given (empty before).
std::string FlightDumpDir();
std::string FlightRunId();
// Claims this run's verdict for `world_rank`: returns the claiming rank, *claimed true only for
// the one call (over all ranks and threads) that made the claim; -1 when the directory cannot
// be written (no one leads: each rank states its own view).
int ClaimJobVerdict(int world_rank, bool* claimed);
// The leader marks the verdict printed; the others poll JobVerdictPrinted.
void MarkJobVerdictPrinted();
bool JobVerdictPrinted();

}  // namespace shardgpt
