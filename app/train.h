// The training loop and its options. The loop knows the model, the data and the Engine's
// step protocol; it does not know which ZeRO stage runs.
#pragma once

#include <functional>

#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/checkpoint_manager.h"
#include "model/config.h"
#include "model/device.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/engine.h"

namespace shardgpt {

// A model-shape flag as the command line gave it ("--n-layer" 3, or a field of a --model
// preset): with --init, the imported model must agree with each.
struct ShapeFlag {
  std::string flag;
  int value;
  int GPTConfig::*field;
};

struct TrainOptions {
  // model
  GPTConfig model;
  std::string init_file;  // llm.c .bin to start from (its config replaces `model`)
  std::vector<ShapeFlag> shape_flags;  // the shape flags given: refused when they disagree with --init's model
  // The architecture flags given that disagree with --init's model, one line each (empty: none
  // given, or all agree); null when no check is needed.
  std::function<std::vector<std::string>(const GPTConfig&)> arch_flag_conflicts;
  // data
  std::string data = "data/train.bin";
  std::string val_data;
  int micro_batch = 8;
  int seq_len = 128;
  int grad_accum = 1;
  long long batch_tokens = 0;  // if > 0, grad_accum = batch_tokens / (B*T*ranks)
  bool shuffle = true;
  uint64_t seed = 1337;
  // optimisation
  int steps = 100;
  LrSchedule schedule;
  float grad_clip = 1.0f;
  EngineOptions engine;
  // output
  int eval_every = 0;
  int val_batches = 8;
  std::string log_file;
  bool log_overwrite = false;  // --log-overwrite: a fresh run may replace an existing --log file
  std::string save_model;
  int sample_tokens = 0;
  std::string sample_prompt = "\n";
  int threads = 0;  // 0: cores / ranks on this node
  std::string compute_dtype;  // --compute-dtype: "fp32", "bf16", or "" (bf16 with --dtype bf16 where fast)
  std::string act_dtype;      // --act-dtype: "fp32", "bf16", or ""/"auto" (model/compute_precision.h)
  bool quiet = false;
  // the flight recorder (docs/DIAGNOSE.md): entries per communicator (0: off), and where dumps
  // go (default: DIR/flight under --ckpt-dir; neither: no dumps)
  size_t flight_entries = 2000;
  std::string flight_dir;
  // stragglers (docs/DIAGNOSE.md): every N steps (0: off) the ranks' phase times are compared;
  // a rank scoring below the threshold is named
  int straggler_every = 50;
  double straggler_threshold = 0.7;
  // > 0: a host named in this many reports in a row is recorded in --ckpt-dir/exclude_hosts and
  // the run checkpoints and exits kExitExcludeHost; the hosts a watchdog verdict names
  // (--comm-timeout) are recorded there too before the job ends (0: off)
  int straggler_exclude_after = 0;
  // the timeline: each rank's phases and collectives of steps trace_first..trace_last as a Chrome
  // trace in trace_dir (empty: none)
  std::string trace_dir;
  int64_t trace_first = 2, trace_last = 4;
  // checkpoints: --ckpt-dir, --ckpt-every, --keep-last, --async-ckpt, --resume (its quiet is --quiet)
  CheckpointOptions checkpoint;
  int stop_at_step = 0;    // > 0: checkpoint and stop after this step, as if preempted
  bool allow_config_change = false;  // resume although the data order cannot continue (seq len, seed, data, shuffle)
  // activation memory
  Recompute recompute = Recompute::kNone;  // --recompute (model/gpt.h)
  bool gelu_fused = false;  // --gelu fused: the MLP's GELU in the fc matmul's epilogue (Kernels::matmul_gelu_forward)
  bool micro_batch_auto = false;  // --micro-batch auto: the largest B whose predicted peak fits (parallel/memory_model.h)
  double memory_bytes = 0;        // --memory: that budget per rank (0: the device's free memory)
  int ranks_per_node = 1;         // on the CPU the node's ranks share its available memory
};

// Exit status after SIGUSR1/SIGTERM: all ranks saved a checkpoint at the next step boundary
// (or in the middle of a validation) and stopped; resubmit with --resume auto (EX_TEMPFAIL:
// "try again"; slurm/*.sbatch turn it into a requeue).
constexpr int kExitSignalled = 75;
// Exit status after the first SIGINT (Ctrl-C) on any rank: the same stop and checkpoint, but
// the shell's status for an interrupt (128 + SIGINT) and no requeue. A second SIGINT aborts.
constexpr int kExitInterrupted = 130;
// Exit status after --straggler-exclude-after: a host was named a straggler in that many reports
// in a row; it is in --ckpt-dir/exclude_hosts (kExcludeHostsFile), all ranks saved a checkpoint
// and stopped; resubmit without the hosts of that file (slurm/*.sbatch requeue with
// ExcludeNodeList) and --resume auto.
constexpr int kExitExcludeHost = 76;
constexpr const char* kExcludeHostsFile = "exclude_hosts";

// Runs training on every rank of comm, on `device` (the communicator must carry buffers of that
// device). Returns OK or the first error (already agreed on by
// all ranks where the error can differ between them). *exit_code is 0, or kExitSignalled
// (kExitInterrupted for SIGINT) when a signal stopped the run after a checkpoint, or
// kExitExcludeHost when a straggling host was recorded and the run stopped after a checkpoint.
Status RunTrain(TrainOptions opts, Communicator& comm, Device& device, int* exit_code);

// Installs the SIGUSR1 / SIGTERM / SIGINT handlers that ask the loop to checkpoint and stop. Called
// before MPI_Init: a Slurm --signal may arrive while the job is still starting, and SIGUSR1's
// default action would kill the rank instead of stopping the run cleanly.
void InstallStopSignalHandlers();
// Back to the default actions (commands other than train), re-raising a signal that arrived
// while the handlers were installed.
void RestoreDefaultStopSignalHandlers();

}  // namespace shardgpt
