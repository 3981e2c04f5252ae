#include "app/train_flags.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "app/cli_numbers.h"
#include "model/optimizer.h"
#include "parallel/flight_recorder.h"

namespace shardgpt {

namespace {

// The cores this process may run on (its affinity mask: taskset, Slurm's cgroup binding),
// at least 1; hardware_concurrency() when the mask cannot be read.
int AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// --threads above this many per allowed core only oversubscribes (and, far above it, fails
// inside the thread pool), so it is refused.
constexpr int kMaxThreadsPerCore = 4;

}  // namespace

void TrainFlags::Register(CLI::App& app) {
  command = app.add_subcommand("train", "train a GPT on token shards (llm.c format)");
  model.Add(command);
  engine.Add(command);
  command->add_option("--init", options.init_file, "start from an llm.c model .bin (version 3 fp32 or 5 bf16) or a Hugging Face "
                                          "GPT-2 or Llama directory (config.json + safetensors)");
  command->add_option("--data", options.data, "glob of training token shards")->capture_default_str();
  command->add_option("--val-data", options.val_data, "glob of validation token shards");
  command->add_option("-b,--micro-batch", micro_batch,
                    "sequences per rank per micro-batch, or auto: the largest whose predicted peak fits in --memory "
                    "(default: the device's free memory)")
      ->check(IntOrAuto(1, 1000000, "a micro-batch"))
      ->capture_default_str();
  command->add_option("-t,--seq-len", options.seq_len, "tokens per sequence")->capture_default_str();
  command->add_option("--grad-accum", options.grad_accum, "micro-batches per step")->capture_default_str();
  command->add_option("--batch-tokens", options.batch_tokens, "global tokens per step (derives --grad-accum)")->check(Finite(0, false));
  command->add_option("--steps", options.steps, "optimizer steps")->capture_default_str();
  command->add_option("--lr", options.schedule.max_lr, "peak learning rate")->check(Finite(0, false))->capture_default_str();
  command->add_option("--min-lr-frac", options.schedule.min_lr_frac, "learning-rate floor as a fraction of --lr")
      ->check(Finite(0, true, 1))->capture_default_str();
  command->add_option("--warmup-steps", options.schedule.warmup_steps, "linear warmup steps")->check(Finite(0, true))->capture_default_str();
  command->add_option("--lr-schedule", schedule, "cosine, linear, constant or wsd")
      ->check(CLI::IsMember({"cosine", "linear", "constant", "wsd"}))->capture_default_str();
  command->add_option("--wsd-decay-frac", options.schedule.decay_frac, "wsd: fraction of steps spent decaying")
      ->check(Finite(0, false, 1))->capture_default_str();
  command->add_option("--weight-decay", options.engine.adamw.weight_decay, "AdamW weight decay (2-D weights, embeddings)")
      ->check(Finite(0, true))->capture_default_str();
  command->add_option("--grad-clip", options.grad_clip, "global gradient-norm clip (0 disables)")->check(Finite(0, true))->capture_default_str();
  command->add_option("--eval-every", options.eval_every, "validation every N steps (0: only at the end)")
      ->check(Finite(0, true))->capture_default_str();
  command->add_option("--val-batches", options.val_batches, "micro-batches per validation")->check(Finite(0, false))->capture_default_str();
  command->add_option("--seed", options.seed, "seed of initialisation and data order")->capture_default_str();
  command->add_flag("--no-shuffle", no_shuffle, "visit the training windows in file order");
  command->add_option("--comm", device.comm.kind, "data-plane communicator: auto (nccl with --device cuda), mpi, nccl")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}))->capture_default_str();
  command->add_option("--comm-timeout", device.comm.timeout_s,
                    "seconds a collective may make no progress before the job is ended (a rank or GPU died, hung or stopped; NCCL and MPI)")
      ->capture_default_str();
  command->add_option("--device", device.device, "cpu, or cuda (one GPU per rank, chosen by node-local rank)")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  command->add_option("--attention", device.attention,
                    "attention kernels: own (this project's; on a GPU with --dtype bf16 the tensor-core ones) or "
                    "cudnn (cuDNN SDPA, --device cuda, bf16; only in nvcc builds that found the cuDNN frontend; not "
                    "yet run on a GPU)")
      ->check(CLI::IsMember({"own", "cudnn"}))->capture_default_str();
  command->add_option("--gelu", gelu,
                    "the MLP's GELU: separate (its own kernel) or fused (in the fc matmul's epilogue, cuBLASLt "
                    "GELU_AUX_BIAS forward and DGELU backward on --device cuda; the CPU runs the same arithmetic, no "
                    "faster; not with --recompute gelu; not yet run on a GPU)")
      ->check(CLI::IsMember({"separate", "fused"}))->capture_default_str();
  command->add_option("--ckpt-dir", options.checkpoint.dir, "write sharded HDF5 checkpoints under DIR (every --ckpt-every steps and at the end)");
  command->add_option("--ckpt-every", options.checkpoint.every, "checkpoint every N steps (0: only at the end)")->check(Finite(0, true))->capture_default_str();
  command->add_option("--keep-last", options.checkpoint.keep_last, "keep only the K newest checkpoints (0: all)")->check(Finite(0, true))->capture_default_str();
  command->add_option("--resume", options.checkpoint.resume, "resume from 'latest' (under --ckpt-dir; an error if there is none), 'auto' "
                                         "(latest if there is one, else start fresh: for requeued jobs) or a checkpoint directory");
  command->add_option("--stop-at-step", options.stop_at_step, "checkpoint and stop once this many steps are done, as if preempted (the schedule still follows --steps)")
      ->check(Finite(0, true));
  command->add_option("--ckpt-fail-limit", options.checkpoint.fail_limit,
                      "periodic checkpoints that may fail in a row (a full disk, a quota, an I/O error) before the "
                      "run ends with status 75 (each failure is a warning; training goes on)")
      ->check(Finite(0, false))->capture_default_str();
  command->add_flag("--async-ckpt", options.checkpoint.async,
                  "write the --ckpt-every checkpoints in the background while training continues (the final and "
                  "stop checkpoints are waited for)");
  command->add_flag("--allow-config-change", options.allow_config_change,
                  "resume even where the sequence length, seed, data files or shuffle setting changed since the "
                  "checkpoint (the data order then starts anew at the saved position)");
  command->add_flag("--quiet", options.quiet, "print only the final loss and sample");
  command->add_option("--flight-recorder", options.flight_entries,
                      "entries kept per communicator by the flight recorder, dumped on a hang, crash or SIGUSR2 for "
                      "`shardgpt diagnose` (0: off)")
      ->check(CLI::Range(0, 1000000))->capture_default_str();
  command->add_option("--flight-dir", options.flight_dir, "where flight recorder dumps go (default: --ckpt-dir/flight)");
  command->add_option("--straggler-every", options.straggler_every,
                      "every N steps compare the ranks' phase times and name a rank slower than the others "
                      "(--straggler-threshold) in a log line and the --log rows (0: off)")
      ->check(Finite(0, true))->capture_default_str();
  command->add_option("--straggler-threshold", options.straggler_threshold,
                      "a rank whose score (the median rank's busy time / its own, at most 1) is below this is a straggler")
      ->check(Finite(0, false, 1))->capture_default_str();
  command->add_option("--straggler-exclude-after", options.straggler_exclude_after,
                      "a host named a straggler in K reports in a row is written to --ckpt-dir/exclude_hosts and the "
                      "run checkpoints and exits 76, for a requeue without that host (slurm/*.sbatch; 0: off)")
      ->check(CLI::Range(0, 1000000))->capture_default_str();
  command->add_option("--trace", options.trace_dir,
                      "write each rank's phases and collectives of --trace-steps as a Chrome trace, "
                      "DIR/trace_rank_XXXXX.json (merge: shardgpt diagnose --merge-trace DIR)");
  command->add_option("--trace-steps", trace_steps, "the steps A:B (from 1, inclusive) that --trace records (default 2:4)");
  const int cores = AllowedCores(), max_threads = kMaxThreadsPerCore * cores;
  command->add_option("--threads", options.threads, "compute threads per rank (default: cores / ranks on the node)")
      ->check(CLI::Validator(
          [cores, max_threads](std::string& in) -> std::string {
            char* end = nullptr;
            const long v = std::strtol(in.c_str(), &end, 10);
            if (end != in.c_str() && *end == '\0' && v >= 1 && v <= max_threads) return "";
            return "expected 1 .. " + std::to_string(max_threads) + " (" + std::to_string(kMaxThreadsPerCore) +
                   " x the " + std::to_string(cores) + " core(s) this process may use), got " + in;
          },
          "1 .. " + std::to_string(max_threads)));
  command->add_option("--compute-dtype", options.compute_dtype,
                    "precision of the matmuls: fp32 or bf16 (bf16 inputs, fp32 accumulation); default: bf16 with "
                    "--dtype bf16 where the hardware has fast bf16 products (GPU, AVX512-BF16/AMX CPUs), else fp32")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  command->add_option("--act-dtype", options.act_dtype,
                    "dtype of the activations and their gradients: auto, fp32 or bf16 (fp32 maths inside the kernels; "
                    "LayerNorm statistics, softmax, loss fp32); auto: bf16 where the matmuls are bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  command->add_option("--log", options.log_file, "write one JSON line per step to this file");
  command->add_flag("--log-overwrite", options.log_overwrite,
                    "let a run that does not resume replace an existing --log file (by default only the run "
                    "that wrote it, resuming, appends to it)");
  command->add_option("--save-model", options.save_model, "write the final model as an llm.c .bin (version 3)");
  command->add_option("--sample-tokens", options.sample_tokens, "print a sample of N tokens after training")
      ->check(Finite(0, true))->capture_default_str();
  command->add_option("--sample-prompt", options.sample_prompt, "prompt of that sample");
  recompute.Add(command, "per-rank memory for --micro-batch auto, e.g. 80GiB (default: the device's free memory; "
                             "on the CPU the memory available to the process, shared by the node's ranks)");
}

StatusOr<TrainOptions> TrainFlags::Resolve(const Launcher& launcher) const {
  TrainOptions t = options;
  auto cfg = model.Resolve();
  if (!cfg.ok()) return cfg.status();
  t.model = cfg.value();
  t.engine = engine.Resolve();
  t.engine.adamw = options.engine.adamw;
  if (t.engine.shard_group_size == kAutoShardGroup) {
    auto g = launcher.AutoShardGroupSize();
    if (!g.ok()) return g.status();
    t.engine.shard_group_size = g.value();
  }
  t.recompute = recompute.mode();
  t.gelu_fused = gelu == "fused";
  t.memory_bytes = recompute.memory_bytes();
  t.micro_batch_auto = micro_batch == "auto";
  if (!t.micro_batch_auto) t.micro_batch = std::stoi(micro_batch);
  t.ranks_per_node = launcher.local_size();
  if (t.memory_bytes > 0 && !t.micro_batch_auto)
    return Status::InvalidArgument("--memory is the budget of --micro-batch auto: give --micro-batch auto too");
  for (const ModelFlags::Given& g : model.GivenShape()) t.shape_flags.push_back({g.flag, g.value, g.field});
  {
    ModelFlags m = model;
    m.app = nullptr;
    const bool arch_given = command->count("--arch") > 0;
    t.arch_flag_conflicts = [m, arch_given](const GPTConfig& c) { return m.GivenArch(c, arch_given); };
  }
  // flags that mean nothing in this combination: refused before any work
  if (t.batch_tokens > 0 && command->count("--grad-accum") > 0)
    return Status::InvalidArgument("--grad-accum " + std::to_string(t.grad_accum) + " with --batch-tokens " +
                                   std::to_string(t.batch_tokens) +
                                   ": --batch-tokens derives the accumulation; give one of the two");
  if (t.eval_every > 0 && t.val_data.empty())
    return Status::InvalidArgument("--eval-every " + std::to_string(t.eval_every) +
                                   " needs --val-data (the validation shards to evaluate)");
  if (t.stop_at_step > t.steps)
    return Status::InvalidArgument("--stop-at-step " + std::to_string(t.stop_at_step) + " is beyond --steps " +
                                   std::to_string(t.steps) + ": expected a step in [1, " + std::to_string(t.steps) + "]");
  SHARDGPT_RETURN_IF_ERROR(CheckpointManager::ValidateOptions(t.checkpoint));
  if (!trace_steps.empty()) {
    if (t.trace_dir.empty()) return Status::InvalidArgument("--trace-steps " + trace_steps + " needs --trace DIR");
    long long a = 0, b = 0;
    char rest = 0;
    if (std::sscanf(trace_steps.c_str(), "%lld:%lld%c", &a, &b, &rest) != 2 || a < 1 || b < a)
      return Status::InvalidArgument("--trace-steps " + trace_steps + ": expected A:B, steps from 1 with A <= B (e.g. 2:4)");
    t.trace_first = a, t.trace_last = b;
  }
  t.shuffle = !no_shuffle;
  t.schedule.kind = LrSchedule::ParseKind(schedule).value();
  if (t.threads <= 0) t.threads = launcher.default_threads();
  return t;
}

Status TrainFlags::Run(Launcher& launcher, int* exit_code) const {
  Launcher::DeviceChoice choice = device;
  choice.quiet = options.quiet;
  SetFlightCapacity(options.flight_entries);  // before the communicators exist
  return launcher.RunOnDevice(choice, [&](Communicator& comm, Device& dev) -> Status {
    auto t = Resolve(launcher);
    if (!t.ok()) return t.status();
    return RunTrain(std::move(t.value()), comm, dev, exit_code);
  });
}

}  // namespace shardgpt
