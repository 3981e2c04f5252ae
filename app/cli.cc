#include "app/cli.h"

#include "model/compute_precision.h"

#include <mpi.h>
#include <sched.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <new>
#include <thread>
#include <vector>

#include "app/ckpt_commands.h"
#include "app/cli_numbers.h"
#include "app/commands.h"
#include "app/hf_commands.h"
#include "app/report.h"
#include "app/train.h"
#include "model/device_factory.h"
#include "parallel/comm_factory.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {

namespace {

constexpr int kAutoGroup = -1;  // --shard-group-size auto, resolved per run from the nodes
const std::map<std::string, DType> kDTypes{{"fp32", DType::kF32}, {"bf16", DType::kBF16}};

// Numbers that must be finite and above (or at least) a bound: NaN and inf are refused too,
// which CLI11's Range/PositiveNumber let through for floating point.
CLI::Validator Finite(double lo, bool lo_inclusive, double hi = HUGE_VAL) {
  return CLI::Validator(
      [lo, lo_inclusive, hi](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (end == in.c_str() || *end != '\0') return "expected a number, got " + in;
        const bool ok = std::isfinite(v) && (lo_inclusive ? v >= lo : v > lo) && v <= hi;
        if (ok) return "";
        std::string want = std::string(lo_inclusive ? "a finite number >= " : "a finite number > ") +
                           CLI::detail::to_string(lo);
        if (hi != HUGE_VAL) want += " and <= " + CLI::detail::to_string(hi);
        return "expected " + want + ", got " + in;
      },
      lo_inclusive ? ">= " + std::to_string(lo) : "> " + std::to_string(lo));
}

// Flags that describe the model: a preset, then explicit overrides.
struct ModelFlags {
  std::string preset = "tiny";
  int n_layer = 0, n_head = 0, n_embd = 0, max_seq_len = 0, vocab_size = 0;
  void Add(CLI::App* app) {
    app->add_option("--model", preset, "preset: tiny, d6, d12 (GPT-2 124M), d24, d36, d48")->capture_default_str();
    app->add_option("--n-layer", n_layer, "override the preset's number of layers")->check(Finite(0, false));
    app->add_option("--n-head", n_head, "override the preset's number of heads")->check(Finite(0, false));
    app->add_option("--n-embd", n_embd, "override the preset's channels")->check(Finite(0, false));
    app->add_option("--max-seq-len", max_seq_len, "override the preset's maximum sequence length (position rows)")
        ->check(Finite(0, false));
    app->add_option("--vocab-size", vocab_size, "override the preset's vocabulary (256 for byte-level data)")
        ->check(Finite(0, false));
  }
  StatusOr<GPTConfig> Resolve(int seq_len) const {
    auto c = PresetConfig(preset);
    if (!c.ok()) return c.status();
    GPTConfig cfg = c.value();
    if (n_layer) cfg.n_layer = n_layer;
    if (n_head) cfg.n_head = n_head;
    if (n_embd) cfg.n_embd = n_embd;
    if (vocab_size) cfg.vocab_size = vocab_size;
    if (max_seq_len) cfg.max_seq_len = max_seq_len;  // a longer --seq-len is an error, never a silent raise
    (void)seq_len;
    SHARDGPT_RETURN_IF_ERROR(cfg.Validate());
    return cfg;
  }
};

// Flags of the data-parallel engine, shared by train and plan.
struct EngineFlags {
  int zero_stage = 0;
  std::string dtype = "fp32", reduce_dtype, reduce_grads = "every-micro", shard_layout = "flat";
  double bucket_mb = 25.0;
  bool reshard_after_forward = true;
  std::string shard_group_size;  // empty: all ranks
  std::string optimizer = "adamw";
  MuonConfig muon;
  void Add(CLI::App* app) {
    app->add_option("--optimizer", optimizer, "adamw, or muon (Muon for the blocks' 2-D weight matrices, AdamW for "
                                              "embeddings, head, LayerNorms and biases)")
        ->check(CLI::IsMember({"adamw", "muon"}))->capture_default_str();
    app->add_option("--muon-momentum", muon.momentum, "Muon's momentum mu (Nesterov)")
        ->check(Finite(0, true, 1))->capture_default_str();
    app->add_option("--muon-ns-steps", muon.ns_steps, "Muon's Newton-Schulz iterations")
        ->check(CLI::Range(1, 100))->capture_default_str();
    app->add_option("--zero-stage", zero_stage, "0 = DDP, 1 = shard optimizer state, 2 = + gradients, 3 = + parameters")
        ->check(CLI::Range(0, 3))->capture_default_str();
    app->add_option("--dtype", dtype, "parameter/gradient storage: fp32 or bf16 (bf16 keeps fp32 master weights "
                                      "and AdamW moments; see --compute-dtype)")
        ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
    app->add_option("--reduce-dtype", reduce_dtype, "dtype gradients travel in (default: --dtype)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    app->add_option("--bucket-mb", bucket_mb, "stage 0 gradient bucket size in MiB")->capture_default_str();
    app->add_option("--reshard-after-forward", reshard_after_forward,
                    "stage 3: free block parameters after forward (re-gathered in backward)")->capture_default_str();
    app->add_option("--reduce-grads", reduce_grads,
                    "stages 2/3 with --grad-accum > 1: every-micro (sharded memory, traffic x A) or last-micro "
                    "(traffic x 1, full-gradient memory)")
        ->check(CLI::IsMember({"every-micro", "last-micro"}))->capture_default_str();
    app->add_option("--shard-group-size", shard_group_size,
                    "HSDP (stages 1-3): shard within groups of G consecutive ranks (one node) and replicate "
                    "across the N/G groups: a number dividing the ranks, or auto (the ranks of a node); "
                    "default: all ranks (plain ZeRO)")
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
              if (v == "auto") return "";
              std::string why = StrictNumber("INT", &v);
              if (why.empty() && std::stol(v) < 1) why = "expected a rank count >= 1 or auto, got " + v;
              return why;
            },
            "G|auto"));
    app->add_option("--shard-layout", shard_layout,
                    "how stages >= 1 cut a unit into N shards: flat (the unit's flat buffer in N equal ranges, "
                    "FSDP1) or per-param (every parameter along dim 0, FSDP2)")
        ->check(CLI::IsMember({"flat", "per-param"}))->capture_default_str();
  }
  EngineOptions Resolve() const {
    EngineOptions e;
    e.zero_stage = zero_stage;
    e.dtype = kDTypes.at(dtype);
    e.reduce_dtype = reduce_dtype.empty() ? e.dtype : kDTypes.at(reduce_dtype);
    e.bucket_mb = bucket_mb;
    e.reshard_after_forward = reshard_after_forward;
    e.reduce_every_micro = reduce_grads == "every-micro";
    e.shard_group_size = shard_group_size.empty() ? 0 : shard_group_size == "auto" ? kAutoGroup : std::stoi(shard_group_size);
    e.optimizer = optimizer == "muon" ? OptimizerKind::kMuon : OptimizerKind::kAdamW;
    e.muon = muon;
    e.shard_layout = shard_layout == "per-param" ? ShardLayout::kPerParam : ShardLayout::kFlat;
    return e;
  }
};

// Flags of activation memory (issue 22), shared by train and plan: --recompute and --memory.
struct RecomputeFlags {
  std::string recompute = "none", memory;
  void Add(CLI::App* app, const char* memory_help) {
    app->add_option("--recompute", recompute,
                    "activations kept for backward: none (all), gelu (recompute the MLP's GELU in backward), block "
                    "(keep each block's input, re-run its forward before its backward)")
        ->check(CLI::IsMember({"none", "gelu", "block"}))->capture_default_str();
    app->add_option("--memory", memory, memory_help)->check(CLI::Validator(
        [](std::string& v) -> std::string {
          return ParseMemorySize(v).ok() ? "" : "expected a positive size such as 80GiB, 512MiB or 4096 (B, KiB, MiB, "
                                                "GiB, TiB, KB, MB, GB, TB), got " + v;
        },
        "SIZE"));
  }
  Recompute mode() const { return ParseRecompute(recompute).value(); }
  double memory_bytes() const { return memory.empty() ? 0 : ParseMemorySize(memory).value(); }
};

// This rank's index among the ranks of its node, and how many there are (MPI's shared-memory
// split, which is what Open MPI and Slurm use to place ranks on a node).
void NodeLocalRank(int* local_rank, int* local_size) {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, local_rank);
  MPI_Comm_size(local, local_size);
  MPI_Comm_free(&local);
}

// --shard-group-size auto: the ranks of one node (MPI's shared-memory split), which must be as
// many on every node and consecutive in rank order (the engine groups consecutive ranks).
// Collective over MPI_COMM_WORLD: every rank gets the same G or the same error.
StatusOr<int> AutoShardGroupSize(int rank, int local_rank, int local_size) {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int first = rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, local);
  MPI_Comm_free(&local);
  int v[3] = {local_size, -local_size, (first == rank - local_rank && first % local_size == 0) ? 1 : 0};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &v[2], 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (v[0] != -v[1])
    return Status::InvalidArgument("--shard-group-size auto: the nodes run different numbers of ranks (" +
                                   std::to_string(v[0]) + " to " + std::to_string(-v[1]) +
                                   "); start as many on each node or give --shard-group-size G");
  if (!v[2])
    return Status::InvalidArgument("--shard-group-size auto: the ranks of a node are not consecutive (map ranks by "
                                   "slot/node, e.g. mpirun --map-by slot) or give --shard-group-size G");
  return local_size;
}

// Rank 0 prints every rank's topology line, in rank order (gathered over the control plane).
void PrintTopology(Communicator& comm, const std::string& mine) {
  constexpr size_t kLine = 256;
  std::vector<char> all(kLine * comm.world_size(), '\0'), own(kLine, '\0');
  std::copy_n(mine.begin(), std::min(mine.size(), kLine - 1), own.begin());
  if (!comm.ControlAllGather(own.data(), all.data(), kLine).ok() || comm.rank() != 0) return;
  for (int r = 0; r < comm.world_size(); r++) std::printf("rank %d: %s\n", r, &all[r * kLine]);
}

// The cores this process may run on (its affinity mask: taskset, Slurm's cgroup binding),
// at least 1; hardware_concurrency() when the mask cannot be read.
int AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// --threads above this many per allowed core only oversubscribes (and, far above it, fails
// inside the thread pool: 40000 in libgomp, 100000 a segfault), so it is refused.
constexpr int kMaxThreadsPerCore = 4;

// Threads per rank: the cores of this node divided among the ranks on it.
int DefaultThreads(int local_size) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_size);
}

}  // namespace

int Main(int argc, char** argv) {
  InstallStopSignalHandlers();  // first: see train.h
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int local_rank = 0, local_size = 1;
  NodeLocalRank(&local_rank, &local_size);
  const int default_threads = DefaultThreads(local_size);

  CLI::App app{"shardgpt: train GPT models with DDP / ZeRO-1/2/3 over MPI"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all");
  // a flag given twice takes the last value, as argparse does (scripts append overrides)
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  // ---- train ----
  TrainOptions t;
  ModelFlags model_flags;
  EngineFlags engine_flags;
  std::string schedule = "cosine", device = "cpu", attention = "own", gelu = "separate";
  CommOptions comm_options;
  bool no_shuffle = false;
  CLI::App* train = app.add_subcommand("train", "train a GPT on token shards (llm.c format)");
  model_flags.Add(train);
  engine_flags.Add(train);
  train->add_option("--init", t.init_file, "start from an llm.c model .bin (version 3 fp32 or 5 bf16) or a Hugging Face "
                                          "GPT-2 directory (config.json + model.safetensors)");
  train->add_option("--data", t.data, "glob of training token shards")->capture_default_str();
  train->add_option("--val-data", t.val_data, "glob of validation token shards");
  std::string micro_batch_text = std::to_string(t.micro_batch);  // a number, or auto (see RecomputeFlags)
  train->add_option("-b,--micro-batch", micro_batch_text,
                    "sequences per rank per micro-batch, or auto: the largest whose predicted peak fits in --memory "
                    "(default: the device's free memory)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto") return "";
            std::string why = StrictNumber("INT", &v);
            if (why.empty() && (std::stoll(v) < 1 || std::stoll(v) > 1000000))
              why = "expected a micro-batch in [1, 1000000] or auto, got " + v;
            return why;
          },
          "B|auto"))
      ->capture_default_str();
  train->add_option("-t,--seq-len", t.seq_len, "tokens per sequence")->capture_default_str();
  train->add_option("--grad-accum", t.grad_accum, "micro-batches per step")->capture_default_str();
  train->add_option("--batch-tokens", t.batch_tokens, "global tokens per step (derives --grad-accum)")->check(Finite(0, false));
  train->add_option("--steps", t.steps, "optimizer steps")->capture_default_str();
  train->add_option("--lr", t.schedule.max_lr, "peak learning rate")->check(Finite(0, false))->capture_default_str();
  train->add_option("--min-lr-frac", t.schedule.min_lr_frac, "learning-rate floor as a fraction of --lr")
      ->check(Finite(0, true, 1))->capture_default_str();
  train->add_option("--warmup-steps", t.schedule.warmup_steps, "linear warmup steps")->check(Finite(0, true))->capture_default_str();
  train->add_option("--lr-schedule", schedule, "cosine, linear, constant or wsd")
      ->check(CLI::IsMember({"cosine", "linear", "constant", "wsd"}))->capture_default_str();
  train->add_option("--wsd-decay-frac", t.schedule.decay_frac, "wsd: fraction of steps spent decaying")->capture_default_str();
  train->add_option("--weight-decay", t.engine.adamw.weight_decay, "AdamW weight decay (2-D weights, embeddings)")->capture_default_str();
  train->add_option("--grad-clip", t.grad_clip, "global gradient-norm clip (0 disables)")->check(Finite(0, true))->capture_default_str();
  train->add_option("--eval-every", t.eval_every, "validation every N steps (0: only at the end)")->capture_default_str();
  train->add_option("--val-batches", t.val_batches, "micro-batches per validation")->check(Finite(0, false))->capture_default_str();
  train->add_option("--seed", t.seed, "seed of initialisation and data order")->capture_default_str();
  train->add_flag("--no-shuffle", no_shuffle, "visit the training windows in file order");
  train->add_option("--comm", comm_options.kind, "data-plane communicator: auto (nccl with --device cuda), mpi, nccl")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}))->capture_default_str();
  train->add_option("--comm-timeout", comm_options.timeout_s,
                    "seconds a collective may make no progress before the job is ended (a rank or GPU died, hung or stopped; NCCL and MPI)")
      ->capture_default_str();
  train->add_option("--device", device, "cpu, or cuda (one GPU per rank, chosen by node-local rank)")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  train->add_option("--attention", attention,
                    "attention kernels: own (this project's; on a GPU with --dtype bf16 the tensor-core ones) or "
                    "cudnn (cuDNN SDPA, --device cuda, bf16; only in nvcc builds that found the cuDNN frontend; not "
                    "yet run on a GPU)")
      ->check(CLI::IsMember({"own", "cudnn"}))->capture_default_str();
  train->add_option("--gelu", gelu,
                    "the MLP's GELU: separate (its own kernel) or fused (in the fc matmul's epilogue, cuBLASLt "
                    "GELU_AUX_BIAS forward and DGELU backward on --device cuda; the CPU runs the same arithmetic, no "
                    "faster; not with --recompute gelu; not yet run on a GPU)")
      ->check(CLI::IsMember({"separate", "fused"}))->capture_default_str();
  train->add_option("--ckpt-dir", t.ckpt_dir, "write sharded HDF5 checkpoints under DIR (every --ckpt-every steps and at the end)");
  train->add_option("--ckpt-every", t.ckpt_every, "checkpoint every N steps (0: only at the end)")->check(Finite(0, true))->capture_default_str();
  train->add_option("--keep-last", t.keep_last, "keep only the K newest checkpoints (0: all)")->check(Finite(0, true))->capture_default_str();
  train->add_option("--resume", t.resume, "resume from 'latest' (under --ckpt-dir; an error if there is none), 'auto' "
                                         "(latest if there is one, else start fresh: for requeued jobs) or a checkpoint directory");
  train->add_option("--stop-at-step", t.stop_at_step, "checkpoint and stop once this many steps are done, as if preempted (the schedule still follows --steps)")
      ->check(Finite(0, true));
  train->add_flag("--async-ckpt", t.async_ckpt,
                  "write the --ckpt-every checkpoints in the background while training continues (the final and "
                  "stop checkpoints are waited for)");
  train->add_flag("--allow-config-change", t.allow_config_change,
                  "resume even where the sequence length, seed, data files or shuffle setting changed since the "
                  "checkpoint (the data order then starts anew at the saved position)");
  train->add_flag("--quiet", t.quiet, "print only the final loss and sample");
  const int cores = AllowedCores(), max_threads = kMaxThreadsPerCore * cores;
  train->add_option("--threads", t.threads, "compute threads per rank (default: cores / ranks on the node)")
      ->check(CLI::Validator(
          [cores, max_threads](std::string& in) -> std::string {
            char* end = nullptr;
            const long v = std::strtol(in.c_str(), &end, 10);
            if (end != in.c_str() && *end == '\0' && v >= 1 && v <= max_threads) return "";
            return "expected 1 .. " + std::to_string(max_threads) + " (" + std::to_string(kMaxThreadsPerCore) +
                   " x the " + std::to_string(cores) + " core(s) this process may use), got " + in;
          },
          "1 .. " + std::to_string(max_threads)));
  train->add_option("--compute-dtype", t.compute_dtype,
                    "precision of the matmuls: fp32 or bf16 (bf16 inputs, fp32 accumulation); default: bf16 with "
                    "--dtype bf16 where the hardware has fast bf16 products (GPU, AVX512-BF16/AMX CPUs), else fp32")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  train->add_option("--act-dtype", t.act_dtype,
                    "dtype of the activations and their gradients: auto, fp32 or bf16 (fp32 maths inside the kernels; "
                    "LayerNorm statistics, softmax, loss fp32); auto: bf16 where the matmuls are bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  train->add_option("--log", t.log_file, "write one JSON line per step to this file");
  train->add_option("--save-model", t.save_model, "write the final model as an llm.c .bin (version 3)");
  train->add_option("--sample-tokens", t.sample_tokens, "print a sample of N tokens after training")->capture_default_str();
  train->add_option("--sample-prompt", t.sample_prompt, "prompt of that sample");
  RecomputeFlags recompute_flags;
  recompute_flags.Add(train, "per-rank memory for --micro-batch auto, e.g. 80GiB (default: the device's free memory; "
                             "on the CPU the memory available to the process, shared by the node's ranks)");

  // ---- prepare ----
  std::vector<std::string> prep_inputs;
  std::string prep_out;
  double val_fraction = 0.05;
  CLI::App* prepare = app.add_subcommand("prepare", "turn text files into byte-level token shards train.bin / val.bin");
  prepare->add_option("--input", prep_inputs, "text files")->required()->expected(1, -1);
  prepare->add_option("--output", prep_out, "output directory")->required();
  prepare->add_option("--val-fraction", val_fraction, "share of tokens (the end of the text) for val.bin")->capture_default_str();
  // ---- prepare --tokenizer (issue 21) ----
  std::string prep_tokenizer;
  int prep_threads = 0;
  prepare->add_option("--tokenizer", prep_tokenizer, "a Hugging Face byte-level BPE tokenizer.json (GPT-2's kind); "
                                                     "default: byte-level tokens");
  prepare->add_option("--threads", prep_threads, "encoding threads with --tokenizer (default: the cores)")
      ->check(CLI::Range(1, 1024));

  // ---- sample ----
  SampleOptions s;
  CLI::App* sample = app.add_subcommand("sample", "generate text from a trained model");
  auto* model_file_opt = sample->add_option("--model-file", s.model_file, "llm.c model .bin (as written by train --save-model)");
  sample->add_option("--checkpoint", s.checkpoint, "a checkpoint directory (or a --ckpt-dir: its latest)")->excludes(model_file_opt);
  sample->add_option("--tokenizer", s.tokenizer_file, "llm.c tokenizer .bin to decode GPT-2 ids, or a Hugging Face "
                                                    "tokenizer.json (BPE: also encodes --prompt); default: bytes");
  auto* prompt_opt = sample->add_option("--prompt", s.prompt, "prompt text (byte-level models) ")->capture_default_str();
  // one prompt: given both, the text one used to be dropped silently
  sample->add_option("--prompt-ids", s.prompt_ids, "prompt as token ids (any tokenizer)")->excludes(prompt_opt);
  sample->add_option("-n,--tokens", s.tokens, "tokens to generate")->capture_default_str();
  sample->add_option("--temperature", s.temperature, "softmax temperature (0: greedy)")->capture_default_str();
  sample->add_option("--top-k", s.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  sample->add_option("--seed", s.seed, "sampling seed")->capture_default_str();

  // ---- eval (issue 21) ----
  EvalOptions ev;
  CLI::App* eval = app.add_subcommand("eval", "mean loss and perplexity of a model over the consecutive windows of "
                                              "token files (one JSON line; 1-N ranks)");
  eval->add_option("model", ev.model, "llm.c model .bin, Hugging Face GPT-2 directory, checkpoint or --ckpt-dir")
      ->required();
  eval->add_option("--data", ev.data, "glob of token shards")->required();
  eval->add_option("-t,--seq-len", ev.seq_len, "tokens per window (default: the model's max_seq_len)")
      ->check(CLI::Range(1, 1 << 20));
  eval->add_option("-b,--micro-batch", ev.micro_batch, "windows per forward pass")->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  eval->add_option("--batches", ev.batches, "micro-batches in all, over every rank (default: every window)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  eval->add_option("--logits-out", ev.logits_out, "write the first micro-batch's logits [B, T, vocab] as raw fp32");
  eval->add_option("--threads", ev.threads, "compute threads per rank (default: cores / ranks on the node)")
      ->check(CLI::Range(1, 1024));

  // ---- plan ----
  PlanOptions p;
  ModelFlags plan_model;
  EngineFlags plan_engine;
  CLI::App* plan = app.add_subcommand("plan", "print per-rank memory and per-step traffic for a configuration, without training");
  plan_model.Add(plan);
  plan_engine.Add(plan);
  plan->add_option("--ranks", p.ranks, "data-parallel ranks")->capture_default_str();
  plan->add_option("-b,--micro-batch", p.micro_batch, "sequences per rank per micro-batch")->capture_default_str();
  plan->add_option("-t,--seq-len", p.seq_len, "tokens per sequence")->capture_default_str();
  plan->add_option("--grad-accum", p.grad_accum, "micro-batches per step")->capture_default_str();
  plan->add_option("--mem-gib", p.mem_gib, "memory per rank in GiB: mark which stages fit");
  std::string plan_act_dtype;
  plan->add_option("--act-dtype", plan_act_dtype,
                   "dtype of the activations counted: auto (bf16 with --dtype bf16, as on a GPU), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  RecomputeFlags plan_recompute;
  plan_recompute.Add(plan, "memory per rank, e.g. 80GiB: print the largest micro-batch that fits for each ZeRO stage "
                           "x --recompute mode");

  // ---- ckpt verify / inspect, export ----
  std::string ckpt_path;
  ExportOptions export_options;
  CLI::App* ckpt = app.add_subcommand("ckpt", "check or describe a sharded checkpoint");
  ckpt->require_subcommand(1);
  CLI::App* verify = ckpt->add_subcommand("verify", "verify every shard's checksum and size without training");
  verify->add_option("path", ckpt_path, "checkpoint directory (or a --ckpt-dir: its latest)")->required();
  CLI::App* inspect = ckpt->add_subcommand("inspect", "print a checkpoint's index");
  inspect->add_option("path", ckpt_path, "checkpoint directory (or a --ckpt-dir: its latest)")->required();
  CLI::App* exporter = app.add_subcommand("export", "write a checkpoint or model as one consolidated HDF5 file, an llm.c "
                                                     ".bin and/or a Hugging Face GPT-2 directory");
  exporter->add_option("path", ckpt_path, "checkpoint directory (or a --ckpt-dir: its latest), llm.c model .bin or HF "
                                          "GPT-2 directory")->required();
  exporter->add_option("--out", export_options.out_h5, "consolidated HDF5 file, one dataset per parameter at full shape");
  exporter->add_option("--llmc", export_options.out_llmc, "write an llm.c model .bin (version 3, fp32)");
  // ---- export --hf (issue 21) ----
  exporter->add_option("--hf", export_options.out_hf, "write a Hugging Face GPT-2 directory: config.json + "
                                                      "model.safetensors (GPT2LMHeadModel.from_pretrained loads it)");
  exporter->add_option("--export-dtype", export_options.hf_dtype, "dtype of the --hf weights: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();

  AddStrictNumberChecks(&app);  // plain decimal numbers only, on every subcommand
  int rc = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) {
      if (e.get_exit_code() == 0) app.exit(e);  // --help
      else std::fprintf(stderr, "shardgpt: error: %s (see --help)\n", e.what());
    }
    MPI_Finalize();
    return e.get_exit_code() == 0 ? 0 : 2;
  }

  Status st;
  if (!*train) RestoreDefaultStopSignalHandlers();
  if (*train) {
    // The device first: the communicator must know where the buffers it moves live. Every
    // rank learns whether all devices came up before any communicator collective starts.
    st = CheckAttentionChoice(attention, device);
    auto dev = st.ok() ? CreateDevice(device, local_rank, local_size) : StatusOr<std::unique_ptr<Device>>(st);
    if (!dev.ok()) st = dev.status();
    else st = ApplyAttentionChoice(attention, *dev.value());
    int all_ok = st.ok() ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    std::unique_ptr<Communicator> comm;
    const std::string comm_kind = dev.ok() ? ResolveCommKind(comm_options.kind, *dev.value()) : "mpi";
    if (all_ok) {
      auto c = CreateCommunicator(comm_options, MPI_COMM_WORLD, *dev.value(), local_size, VisibleGpuCount());
      if (c.ok()) comm = std::move(c.value());
      else st = c.status();
    }
    if (!comm) {  // agree on the error over a plain host communicator: one line, every rank exits
      auto host = MpiCommunicator::Create(MPI_COMM_WORLD);
      st = host.ok() ? Agree(*host.value(), st) : host.status();
    } else {
      if (dev.value()->is_cuda() && !t.quiet)
        PrintTopology(*comm, TopologyLine(*dev.value(), local_rank, local_size, comm_kind));
      auto cfg = model_flags.Resolve(t.seq_len);
      if (st.ok() && !cfg.ok()) st = cfg.status();
      if (st.ok()) {
        t.model = cfg.value();
        t.engine = [&] { EngineOptions e = engine_flags.Resolve(); e.adamw = t.engine.adamw; return e; }();
        if (t.engine.shard_group_size == kAutoGroup) {
          auto g = AutoShardGroupSize(rank, local_rank, local_size);
          if (g.ok()) t.engine.shard_group_size = g.value();
          else st = g.status();
        }
        t.recompute = recompute_flags.mode();
        t.gelu_fused = gelu == "fused";
        t.memory_bytes = recompute_flags.memory_bytes();
        t.micro_batch_auto = micro_batch_text == "auto";
        if (!t.micro_batch_auto) t.micro_batch = std::stoi(micro_batch_text);
        t.ranks_per_node = local_size;
        if (st.ok() && t.memory_bytes > 0 && !t.micro_batch_auto)
          st = Status::InvalidArgument("--memory is the budget of --micro-batch auto: give --micro-batch auto too");
        t.shuffle = !no_shuffle;
        t.schedule.kind = LrSchedule::ParseKind(schedule).value();
        if (t.threads <= 0) t.threads = default_threads;
        if (st.ok()) try {
          st = RunTrain(t, *comm, *dev.value(), &rc);
        } catch (const DeviceOutOfMemory& e) {
          // Mid-step: the other ranks wait inside a collective and cannot agree; end them all.
          std::fprintf(stderr, "shardgpt: error: rank %d: %s\n", rank, e.what());
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, 1);
        } catch (const std::bad_alloc&) {  // any other host allocation: one line, not an abort trace
          std::fprintf(stderr,
                       "shardgpt: error: rank %d: out of host memory (std::bad_alloc); try a higher --zero-stage, a "
                       "smaller --micro-batch or fewer ranks per node\n",
                       rank);
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
      st = Agree(*comm, st);
    }
  } else if (*prepare) {
    if (rank == 0 && !prep_tokenizer.empty())  // issue 21
      st = RunPrepareTokenizer(prep_tokenizer, prep_inputs, prep_out, val_fraction,
                               prep_threads > 0 ? prep_threads : std::max(1u, std::thread::hardware_concurrency()));
    else if (rank == 0) st = RunPrepare(prep_inputs, prep_out, val_fraction);
  } else if (*ckpt) {
    if (rank == 0) st = *verify ? RunCkptVerify(ckpt_path) : RunCkptInspect(ckpt_path);
  } else if (*exporter) {
    if (rank == 0) st = RunExport(ckpt_path, export_options);
  } else if (*sample) {
    if (rank == 0) st = RunSample(s, default_threads);
  } else if (*eval) {  // issue 21
    if (ev.threads <= 0) ev.threads = default_threads;
    st = RunEval(ev);
  } else if (*plan) {
    auto cfg = plan_model.Resolve(p.seq_len);
    if (!cfg.ok()) st = cfg.status();
    else {
      p.model = cfg.value();
      p.engine = plan_engine.Resolve();
      p.recompute = plan_recompute.mode();
      p.memory_bytes = plan_recompute.memory_bytes();
      auto act = PlannedActivationDType(plan_act_dtype, p.engine.dtype);
      if (act.ok()) p.engine.act_dtype = act.value();
      if (!act.ok()) st = act.status();
      else if (p.engine.shard_group_size == kAutoGroup)
        st = Status::InvalidArgument("plan --shard-group-size auto: plan runs on no nodes; give the ranks per node as a number");
      else if (rank == 0) st = RunPlan(p);
    }
  }
  if (!st.ok()) {
    if (!st.message().empty()) std::fprintf(stderr, "shardgpt: error: %s\n", st.message().c_str());
    rc = 1;
  }
  std::fflush(stdout);
  MPI_Finalize();
  return rc;
}

}  // namespace shardgpt
