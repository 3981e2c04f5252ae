#include "app/train.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "app/auto_micro_batch.h"
#include "app/flight.h"
#include "app/report.h"
#include "app/trace.h"
#include "base/clock.h"
#include "ckpt/checkpoint_manager.h"
#include "ckpt/ckpt_dir_lock.h"
#include "io/data_loader.h"
#include "io/llmc_model.h"
#include "io/path_guard.h"
#include "io/token_shard.h"
#include "io/tokenizer.h"
#include "model/compute_precision.h"
#include "model/device_factory.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/sampler.h"
#include "parallel/flight_dump.h"
#include "parallel/flight_recorder.h"
#include "parallel/memory_model.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_memory.h"
#include "parallel/straggler.h"

namespace shardgpt {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
// SIGUSR1/SIGTERM/SIGINT ask for a stop at the next step boundary. A second SIGINT (Ctrl-C
// twice at a terminal) aborts at once: back to the default action and re-raised, so the rank
// dies by SIGINT (status 130 in a shell) and mpirun ends the others. Async-signal-safe only.
void OnStopSignal(int sig) {
  if (sig == SIGINT && g_stop_signal == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_stop_signal = sig;
}

// Test hooks that make a signal test independent of the machine's speed: the run waits at a
// point the test can see (a logged step; a validation begun) until a stop signal has reached
// some rank, so the signal always lands there, however fast the steps are.
// SHARDGPT_TEST_HOLD_AT_STEP=K1[,K2,...]: a fresh run holds at the boundary after step K1; a
// run resumed from step Ki holds at K(i+1) (so a requeued job can be stopped again at a known
// step); a run resumed from any other step is not held (a resume from an older checkpoint must
// not wait for a signal that no one sends again).
// SHARDGPT_TEST_HOLD_IN_VALIDATION=1: every validation holds after its first micro-batch.
int TestHoldAtStep(bool resumed, int64_t start_step) {
  const char* v = std::getenv("SHARDGPT_TEST_HOLD_AT_STEP");
  if (v == nullptr) return -1;
  std::vector<int64_t> steps;
  for (const char* p = v; *p != '\0';) {
    char* end = nullptr;
    steps.push_back(std::strtoll(p, &end, 10));
    if (end == p) return -1;
    p = *end == ',' ? end + 1 : end;
  }
  if (!resumed) return steps.empty() ? -1 : static_cast<int>(steps[0]);
  for (size_t i = 0; i + 1 < steps.size(); i++)
    if (steps[i] == start_step) return static_cast<int>(steps[i + 1]);
  return -1;
}
bool TestHoldInValidation() {
  const char* v = std::getenv("SHARDGPT_TEST_HOLD_IN_VALIDATION");
  return v != nullptr && std::string(v) == "1";
}


// Text from the trained model, on rank 0 (parameters gathered first: a collective).
std::string Sample(const ParamLayout& layout, Engine& engine, const TrainOptions& o) {
  LocalParams local(layout);
  engine.GatherFullParams(local.params());
  if (engine.comm().rank() != 0) return "";
  Tokenizer tok = Tokenizer::ByteLevel();
  std::vector<int32_t> ctx;
  for (uint16_t t : ByteLevelTokenizer::Encode(o.sample_prompt))
    if (t < layout.config().vocab_size) ctx.push_back(t);
  if (ctx.empty()) ctx.push_back(0);
  GPT model(layout.config(), 1, layout.config().max_seq_len);
  Rng rng(o.seed, 7);
  std::string text;
  SamplingOptions so;
  so.tokens = o.sample_tokens;
  Generate(model, local, ctx, so, rng, [&](int id) { text += tok.Decode(id); });
  return text;
}

const char* NonFinite(float x) { return std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf"; }

// Rewrites the JSONL log `path` keeping only the rows of steps <= last_step (a row cut short by a
// kill does not parse and goes too), via a temporary file and rename so that a crash leaves
// either the old or the new log. A missing file is fine (nothing to keep).
Status KeepLogRowsUpTo(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return access(path.c_str(), F_OK) == 0 ? Status::IOError(path + ": cannot read the --log file: " + std::strerror(errno)) : Status::OK();
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  if (!out) return Status::IOError(tmp + ": cannot write next to the --log file: " + std::strerror(errno));
  int64_t kept = 0, dropped = 0;
  bool has_last = false;  // the row of the checkpoint's step: this log is the resumed run's
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                      j["step"].get<int64_t>() <= last_step;
    if (keep) out << line << "\n", kept++, has_last = has_last || j["step"].get<int64_t>() == last_step;
    else dropped++;
  }
  out.close();
  if (!has_last && last_step > 0 && kept + dropped > 0) {  // rows of another run: never mixed into this one's
    std::remove(tmp.c_str());
    return Status::InvalidArgument("--log " + path + " has no row of step " + std::to_string(last_step) +
                                   ", the step resumed from: it is not the log of the run that wrote that checkpoint "
                                   "(give another --log path, or --log-overwrite to replace it)");
  }
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());  // a full disk: no half-written copy left beside the log
    return Status::IOError(path + ": cannot rewrite the --log file: " + std::strerror(err));
  }
  std::printf("log %s: kept %lld row(s) up to step %lld, dropped %lld written after that checkpoint; appending\n",
              path.c_str(), static_cast<long long>(kept), static_cast<long long>(last_step), static_cast<long long>(dropped));
  return Status::OK();
}

// The JSONL --log file (rank 0): one write(2) per row, every result checked. A row that cannot
// be written in full (a full disk) is cut off again, so the file keeps whole rows only, and the
// error, with the path and strerror, stops the run on every rank before that step's checkpoint.
class JsonlLog {
 public:
  JsonlLog() = default;
  JsonlLog(const JsonlLog&) = delete;
  JsonlLog& operator=(const JsonlLog&) = delete;
  ~JsonlLog() {
    if (fd_ >= 0) ::close(fd_);
  }

  bool is_open() const { return fd_ >= 0; }

  Status Open(const std::string& path, bool append) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd_ < 0) return Error("cannot open the --log file for writing");
    end_ = ::lseek(fd_, 0, SEEK_END);
    if (end_ < 0) return Error("cannot seek in the --log file");
    return Status::OK();
  }

  // Appends `row` and a newline; on failure the file is truncated back to its last whole row.
  Status Append(const std::string& row, int64_t step) {
    const std::string line = row + "\n";
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;  // a write of 0 bytes to a regular file: no room
        if (::ftruncate(fd_, end_) == 0) ::lseek(fd_, end_, SEEK_SET);
        errno = err;
        return Error("cannot write the row of step " + std::to_string(step) + " (the file keeps the rows before it)");
      }
      done += static_cast<size_t>(n);
    }
    end_ += static_cast<off_t>(line.size());
    return Status::OK();
  }

  // fsync and close: a delayed write error (NFS, a full disk at writeback) shows here.
  Status Close() {
    if (fd_ < 0) return Status::OK();
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0 && errno != EINVAL) {
      const Status st = Error("cannot flush the --log file to disk");
      ::close(fd);
      return st;
    }
    if (::close(fd) != 0) return Error("cannot close the --log file");
    return Status::OK();
  }

 private:
  Status Error(const std::string& what) const {
    return Status::IOError("--log " + path_ + ": " + what + ": " + std::strerror(errno));
  }

  std::string path_;
  int fd_ = -1;
  off_t end_ = 0;  // the end of the last whole row
};

std::string ProgressBar(int step, int total) {
  const int width = 20, filled = total > 0 ? width * step / total : width;
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
}

}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void RestoreDefaultStopSignalHandlers() {
  std::signal(SIGUSR1, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  if (g_stop_signal != 0) std::raise(g_stop_signal);
}

namespace {

// Setup phase 1: the model config, from --init or the flags, agreed on by every rank.
Status ResolveModel(TrainOptions& o, Communicator& comm, std::unique_ptr<LlmcModelReader>* init) {
  if (!o.init_file.empty()) {  // the header now; each rank reads its owned ranges in Setup
    auto m = LlmcModelReader::Open(o.init_file);
    SHARDGPT_RETURN_IF_ERROR(Agree(comm, m.status()));
    *init = std::move(m.value());
    const GPTConfig& imported = (*init)->config();
    for (const ShapeFlag& f : o.shape_flags)  // every rank read the same header: the same answer
      if (imported.*f.field != f.value)
        return Status::InvalidArgument(f.flag + " " + std::to_string(f.value) + " disagrees with --init " + o.init_file +
                                       ", whose model has " + std::to_string(imported.*f.field) +
                                       " (the imported model sets the shape: drop the flag or give the same value)");
    const std::vector<std::string> conflicts = o.arch_flag_conflicts ? o.arch_flag_conflicts(imported)
                                                                     : std::vector<std::string>();
    if (!conflicts.empty())
      return Status::InvalidArgument(conflicts[0] + " (--init " + o.init_file +
                                     " sets the architecture: drop the flag or give the same value)");
    o.model = imported;
  }
  return o.model.Validate();
}

// What a resume changes in what the data order depends on, one line each. Blocking changes
// are those after which the saved position no longer names the same place in the data order
// (another T cuts other windows; other files, another shuffle setting or, when shuffled,
// another seed give another permutation): errors unless --allow-config-change. Another global
// batch only changes how many samples a step takes: the order continues, so a warning.
// Fields an older checkpoint does not record are not checked.
struct ConfigChange {
  bool blocking;
  std::string line;
};
std::vector<ConfigChange> ResumeChanges(const TrainState& saved, const TrainState& now) {
  std::vector<ConfigChange> out;
  const std::string at = " (the saved data position " + std::to_string(saved.loader_position);
  if (saved.batch_samples > 0 && saved.batch_samples != now.batch_samples)
    out.push_back({false, "the global batch changes from " + std::to_string(saved.batch_samples) + " to " +
                              std::to_string(now.batch_samples) +
                              " sequences per step: the data order continues, but a step now covers another "
                              "number of tokens (the learning-rate schedule still counts steps)"});
  if (saved.seq_len > 0 && saved.seq_len != now.seq_len)
    out.push_back({true, "the sequence length changes from " + std::to_string(saved.seq_len) + " to " +
                             std::to_string(now.seq_len) + at + " counts windows of " +
                             std::to_string(saved.seq_len + 1) + " tokens, so the data order cannot continue)"});
  if (saved.shuffle >= 0 && saved.shuffle != now.shuffle)
    out.push_back({true, std::string("the shuffle setting changes from ") + (saved.shuffle ? "shuffled" : "--no-shuffle") +
                             " to " + (now.shuffle ? "shuffled" : "--no-shuffle") + at +
                             " is in another order, so the data order cannot continue)"});
  if (saved.seed != now.seed) {
    const bool order = now.shuffle == 1 && saved.shuffle != 0;  // the seed picks the permutation
    out.push_back({order, "the seed changes from " + std::to_string(saved.seed) + " to " + std::to_string(now.seed) +
                              (order ? at + " is in another permutation, so the data order cannot continue)"
                                     : " (data in file order: the seed only changes sampling)")});
  }
  if (!saved.data_files.empty()) {
    auto describe = [](const std::vector<TrainState::DataFile>& f) {
      uint64_t tokens = 0;
      for (const auto& d : f) tokens += d.tokens;
      return std::to_string(f.size()) + " file(s) of " + std::to_string(tokens) + " tokens (first " + f[0].path + ")";
    };
    bool same_sizes = saved.data_files.size() == now.data_files.size(), same_paths = same_sizes;
    for (size_t i = 0; same_sizes && i < now.data_files.size(); i++) {
      same_sizes = saved.data_files[i].tokens == now.data_files[i].tokens;
      same_paths = same_paths && saved.data_files[i].path == now.data_files[i].path;
    }
    if (!same_sizes)
      out.push_back({true, "the data files change from " + describe(saved.data_files) + " to " +
                               describe(now.data_files) + at + " is in other data, so the data order cannot continue)"});
    else if (!same_paths)
      out.push_back({false, "the data files have other paths (" + saved.data_files[0].path + " then, " +
                                now.data_files[0].path + " now) but the same number of files and tokens: continuing"});
  }
  return out;
}

// Setup phase 2: batch geometry and loop flags that need no file.
Status ValidateLoopOptions(TrainOptions& o, int world) {
  if (o.seq_len < 1 || o.seq_len > o.model.max_seq_len)
    return Status::InvalidArgument("--seq-len " + std::to_string(o.seq_len) + " must be in [1, " +
                                   std::to_string(o.model.max_seq_len) + "] (the model's maximum sequence length)");
  if (o.micro_batch < 1) return Status::InvalidArgument("--micro-batch must be >= 1");
  if (o.batch_tokens > 0) {
    const long long per = static_cast<long long>(o.micro_batch) * o.seq_len * world;
    if (o.batch_tokens % per != 0)
      return Status::InvalidArgument("--batch-tokens " + std::to_string(o.batch_tokens) +
                                     " must be a multiple of micro-batch x seq-len x ranks = " + std::to_string(per));
    o.grad_accum = static_cast<int>(o.batch_tokens / per);
  }
  if (o.grad_accum < 1) return Status::InvalidArgument("--grad-accum must be >= 1");
  if (o.steps < 1) return Status::InvalidArgument("--steps must be >= 1");
  SHARDGPT_RETURN_IF_ERROR(CheckpointManager::ValidateOptions(o.checkpoint));
  if (o.straggler_exclude_after > 0 && (o.checkpoint.dir.empty() || o.straggler_every < 1))
    return Status::InvalidArgument("--straggler-exclude-after " + std::to_string(o.straggler_exclude_after) +
                                   " needs --ckpt-dir (where it records the host and checkpoints) and "
                                   "--straggler-every > 0 (the reports it counts)");
  if (o.gelu_fused && o.recompute == Recompute::kGelu)
    return Status::InvalidArgument("--gelu fused with --recompute gelu: the fused forward's GELU reads the fc "
                                   "matmul's unrounded result, which the backward cannot recompute from the stored "
                                   "input (use --recompute none or block with --gelu fused)");
  if (o.model.llama() && o.gelu_fused)
    return Status::InvalidArgument("--gelu fused is a gpt2 option: llama's MLP is SwiGLU (drop --gelu)");
  if (o.model.llama() && !o.save_model.empty())
    return Status::Unimplemented("--save-model " + o.save_model + " with --arch llama: the llm.c model format holds "
                                 "GPT-2 models only (keep --ckpt-dir checkpoints of a llama run)");
  o.schedule.total_steps = o.steps;
  return Status::OK();
}

// The training run of one rank, as named phases: Setup (model, resume point, engine and
// activations on the device, data, outputs), Resume, Loop (TrainStep, Evaluate, Save, Log),
// Finish (final checkpoint, model file, loss, sample). Every phase is collective.
class Trainer {
 public:
  Trainer(TrainOptions o, Communicator& comm, Device& device)
      : o_(std::move(o)), comm_(comm), device_(device), lead_(comm.rank() == 0), ckpt_(o_.checkpoint, comm) {}

  Status Run(int* exit_code) {
    *exit_code = 0;
    SHARDGPT_RETURN_IF_ERROR(Setup());
    SHARDGPT_RETURN_IF_ERROR(Resume());
    SHARDGPT_RETURN_IF_ERROR(Loop(exit_code));
    if (tracing_) WriteTrace();  // the run ended inside the window
    if (!stopped_) SHARDGPT_RETURN_IF_ERROR(Finish(exit_code));
    return CloseLog();
  }

 private:
  Status Setup() {
    const std::string flight_dir =
        o_.flight_entries == 0 ? "" : !o_.flight_dir.empty() ? o_.flight_dir
                                    : CheckpointManager::FlightDir(o_.checkpoint);
    SHARDGPT_RETURN_IF_ERROR(SetUpFlightRecorder(comm_, flight_dir, &job_));
    // --straggler-exclude-after: a watchdog verdict's hosts are recorded too (exit status 1)
    if (o_.straggler_exclude_after > 0)
      MpiCommunicator::SetExcludeHostsOnTimeout(o_.checkpoint.dir + "/" + kExcludeHostsFile, job_.hosts);
    if (o_.straggler_every > 0 || !o_.trace_dir.empty()) SetFlightPhaseTiming(true);
    if (!o_.trace_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o_.trace_dir, ec);
      SHARDGPT_RETURN_IF_ERROR(Agree(comm_, ec ? Status::IOError("--trace " + o_.trace_dir + ": cannot create the folder: " +
                                                                 ec.message())
                                               : Status::OK()));
    }
    SetComputeThreads(o_.threads);
    std::unique_ptr<LlmcModelReader> init;
    SHARDGPT_RETURN_IF_ERROR(ResolveModel(o_, comm_, &init));
    SHARDGPT_RETURN_IF_ERROR(ckpt_.PlanResume(o_.model));
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, lead_ ? GuardPaths() : Status::OK()));
    // bf16 runs round matmul inputs to bf16 where the device has fast bf16 matmuls (tensor cores,
    // AVX512-BF16/AMX), or where --compute-dtype asks for it; the activations follow (before
    // --micro-batch auto: the plan counts them in their dtype)
    const ComputeChoice compute =
        ChooseComputePrecision(o_.engine.dtype, o_.compute_dtype, DetectComputeFacts(device_.is_cuda()));
    device_.kernels().set_matmul_precision(compute.precision);
    compute_line_ = compute.line;
    auto act = ChooseActivationDType(o_.act_dtype, compute.precision, device_.is_cuda());
    if (!act.ok()) return act.status();
    device_.kernels().set_activation_dtype(act.value().dtype);
    device_.kernels().set_gelu_fused(o_.gelu_fused);
    o_.engine.act_dtype = act.value().dtype;
    if (!act.value().line.empty()) compute_line_ += (compute_line_.empty() ? "" : "\n") + act.value().line;
    if (o_.micro_batch_auto) SHARDGPT_RETURN_IF_ERROR(Agree(comm_, ResolveAutoMicroBatch()));
    SHARDGPT_RETURN_IF_ERROR(ValidateLoopOptions(o_, comm_.world_size()));
    layout_ = std::make_unique<ParamLayout>(o_.model);
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, AllocateOnDevice()));
    if (init) {  // only this rank's owned ranges are read: no full model on any rank (ZeRO-3)
      SHARDGPT_RETURN_IF_ERROR(Agree(comm_, engine_->LoadOwnedParams([&](int u, uint64_t b, uint64_t e, float* out) {
        const uint64_t at = layout_->units()[u].offset;
        return init->ReadRange(at + b, at + e, out);
      })));
    } else
      engine_->InitOwned(o_.seed);  // each rank its own slices: no full model anywhere
    init.reset();
    SHARDGPT_RETURN_IF_ERROR(OpenData());
    SHARDGPT_RETURN_IF_ERROR(CheckOutputs());
    state_.seed = o_.seed;
    return Status::OK();
  }

  // Rank 0, before any work: no output may be an input (the data, the validation data, --init
  // and the files of a Hugging Face directory, the checkpoint resumed from); the validation
  // shards may not be training shards; an existing --log file is replaced only by
  // --log-overwrite, appended to only by a resume (OpenLog); CheckOutputs takes its lock.
  Status GuardPaths() {
    std::vector<NamedPath> files, dirs, train_files, val_files;
    AddModelInput("--init", o_.init_file, &files, &dirs);
    std::vector<std::string> names;
    if (ExpandShardPattern(o_.data, &names).ok())  // no match: OpenData says so
      for (const std::string& f : names) train_files.push_back({"--data", f});
    names.clear();
    if (!o_.val_data.empty() && ExpandShardPattern(o_.val_data, &names).ok())
      for (const std::string& f : names) val_files.push_back({"--val-data", f});
    SHARDGPT_RETURN_IF_ERROR(CheckDisjointInputs(
        train_files, val_files,
        "the validation loss would be measured on training data; give validation shards the --data pattern does not match"));
    files.insert(files.end(), train_files.begin(), train_files.end());
    files.insert(files.end(), val_files.begin(), val_files.end());
    dirs.push_back({"--resume", ckpt_.resume_path()});
    const std::string ckpt_out = CheckpointManager::LatestPath(o_.checkpoint);
    SHARDGPT_RETURN_IF_ERROR(CheckOutputsAgainstInputs(
        {{"--log", o_.log_file}, {"--save-model", o_.save_model}, {"--ckpt-dir", ckpt_out}}, files, dirs));
    if (o_.log_file.empty()) return Status::OK();
    struct stat st {};
    // --resume auto is the requeue idiom: its log is the job's own, even before its first
    // checkpoint (OpenLog then keeps the rows up to step 0, i.e. none)
    const bool continues = ckpt_.plans_resume() || o_.checkpoint.resume == "auto";
    if (::stat(o_.log_file.c_str(), &st) == 0 && st.st_size > 0 && !continues && !o_.log_overwrite)
      return Status::InvalidArgument("--log " + o_.log_file + " exists (" + std::to_string(st.st_size) +
                                     " bytes) and this run does not resume: refusing to overwrite another run's log "
                                     "(give another path, resume the run that wrote it, or --log-overwrite)");
    return Status::OK();
  }

  // --micro-batch auto: the largest B whose predicted peak (parallel/memory_model.h, what `plan
  // --memory` prints) fits in --memory or in what the device has free (on the CPU the tightest
  // of MemAvailable, the cgroup limit and ulimit -v, shared by the node's ranks, less headroom),
  // at most the data's windows per rank and, on the CPU, the throughput cap
  // (app/auto_micro_batch.h); the smallest over ranks. With --batch-tokens the accumulation is
  // not known yet: the peak of A >= 2 (the larger) is used. Collective.
  Status ResolveAutoMicroBatch() {
    if (o_.seq_len < 1 || o_.seq_len > o_.model.max_seq_len) return Status::OK();  // ValidateLoopOptions says why
    AutoBatchLimits limits;
    if (o_.memory_bytes > 0) {
      limits.memory.push_back({o_.memory_bytes, "--memory"});
      limits.measured = false;
    } else if (device_.is_cuda()) {
      // NCCL allocates its buffers at its first collectives, after this: they are taken off
      const double nccl = comm_.stream_ordered() ? NcclEstimate(false).total() : 0;
      char why[128] = "the GPU's free memory";
      if (nccl > 0)
        std::snprintf(why, sizeof(why), "the GPU's free memory less NCCL's buffers (%.1f MiB estimated)", nccl / 1048576.0);
      const double free = static_cast<double>(device_.free_bytes());
      limits.memory.push_back({free > 0 ? std::max(1.0, free - nccl) : free, why});
    } else {
      for (MemoryBound m : CpuMemoryBounds()) {
        m.bytes /= std::max(1, o_.ranks_per_node);
        if (o_.ranks_per_node > 1) m.source += " / " + std::to_string(o_.ranks_per_node) + " ranks on the node";
        limits.memory.push_back(m);
      }
    }
    if (!device_.is_cuda()) {
      limits.cap = std::max(1, kCpuAutoTokens / o_.seq_len);
      limits.cap_reason = std::to_string(kCpuAutoTokens) + " tokens per micro-batch on the CPU (B x T; past it tokens/s "
                          "stops rising)";
    }
    {  // the data's windows per rank, from the shard headers (OpenData reads the shards later)
      std::vector<std::string> files;
      uint64_t windows = 0;
      bool known = ExpandShardPattern(o_.data, &files).ok();
      for (const std::string& f : files) {
        auto info = ReadTokenShardInfo(f);
        if (!info.ok()) { known = false; break; }
        windows += info->num_tokens == 0 ? 0 : (info->num_tokens - 1) / static_cast<uint64_t>(o_.seq_len);
      }
      if (known) limits.max_by_data = std::max<uint64_t>(1, windows / static_cast<uint64_t>(comm_.world_size()));
    }
    Status st;
    const double budget = limits.memory.empty() ? 0 : std::min_element(limits.memory.begin(), limits.memory.end(),
                              [](const MemoryBound& x, const MemoryBound& y) { return x.bytes < y.bytes; })->bytes;
    if (budget <= 0) st = Status::InvalidArgument("--micro-batch auto: cannot tell this device's free memory; give --memory SIZE");
    const ParamLayout layout(o_.model);
    auto G = o_.engine.ShardGroupSize(comm_.world_size());
    if (st.ok() && !G.ok()) st = G.status();
    AutoBatchChoice choice;
    const int accum = o_.batch_tokens > 0 ? 2 : std::max(1, o_.grad_accum);
    if (st.ok()) {
      const ShardPlan plan(layout, G.value(), o_.engine.shard_layout);
      choice = ChooseAutoMicroBatch(limits, [&](int b) {
        return PredictPeakMemory(layout, plan, o_.engine, b, o_.seq_len, accum, o_.recompute).peak();
      });
      if (choice.micro_batch == 0) {
        const double need = PredictPeakMemory(layout, plan, o_.engine, 1, o_.seq_len, accum, o_.recompute).peak();
        char buf[600];
        std::snprintf(buf, sizeof(buf),
                      "--micro-batch auto: not even one sequence of %d tokens fits in %.3f GiB (%s) on rank %d: B=1 "
                      "needs a peak of %.3f GiB at zero stage %d with --recompute %s (try --recompute block, a higher "
                      "--zero-stage or a shorter --seq-len)",
                      o_.seq_len, std::max(0.0, choice.usable_bytes) / 1073741824.0, choice.line.c_str(), comm_.rank(),
                      need / 1073741824.0, o_.engine.zero_stage, RecomputeName(o_.recompute));
        st = Status::InvalidArgument(buf);
      }
    }
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, st));
    const std::vector<uint64_t> all = GatherPerRank(comm_, static_cast<uint64_t>(choice.micro_batch));
    o_.micro_batch = static_cast<int>(*std::min_element(all.begin(), all.end()));
    if (lead_) {
      const ShardPlan plan(layout, G.value(), o_.engine.shard_layout);
      const double peak = PredictPeakMemory(layout, plan, o_.engine, o_.micro_batch, o_.seq_len, accum, o_.recompute).peak();
      std::printf("--micro-batch auto: B=%d (predicted peak %.3f GiB of %.3f GiB usable per rank; B=%d would need "
                  "%.3f GiB), zero stage %d, --recompute %s; %s%s\n",
                  o_.micro_batch, peak / 1073741824.0, choice.usable_bytes / 1073741824.0, o_.micro_batch + 1,
                  PredictPeakMemory(layout, plan, o_.engine, o_.micro_batch + 1, o_.seq_len, accum, o_.recompute).peak() /
                      1073741824.0,
                  o_.engine.zero_stage, RecomputeName(o_.recompute), choice.line.c_str(),
                  o_.micro_batch < choice.micro_batch ? " (another rank's bound is smaller)" : "");
      std::fflush(stdout);
    }
    return Status::OK();
  }

  // The engine's persistent state and the activations; out of memory is one agreed error.
  Status AllocateOnDevice() {
    try {
      auto engine_or = Engine::Create(*layout_, &comm_, o_.engine, device_);
      if (!engine_or.ok()) return engine_or.status();
      engine_ = std::move(engine_or.value());
      model_ = std::make_unique<GPT>(o_.model, o_.micro_batch, o_.seq_len, device_, &engine_->memory(), o_.recompute);
      if (device_.is_cuda())
        step_scalars_ = DeviceBuffer(&device_, nullptr, MemKind::kWorkspace, 3 * sizeof(double), "step scalars");
    } catch (const DeviceOutOfMemory& e) {
      return Status::Internal(std::string(e.what()));
    }
    return Status::OK();
  }

  Status OpenData() {
    const int B = o_.micro_batch, T = o_.seq_len, rank = comm_.rank(), world = comm_.world_size();
    auto train = DataLoader::Open(DataLoaderOptions{o_.data, B, T, o_.seed, o_.shuffle, rank, world, o_.model.vocab_size});
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, train.status()));
    train_ = std::make_unique<DataLoader>(std::move(train.value()));
    if (o_.val_data.empty()) return Status::OK();
    auto v = DataLoader::Open(DataLoaderOptions{o_.val_data, B, T, o_.seed, false, rank, world, o_.model.vocab_size});
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, v.status()));
    val_ = std::make_unique<DataLoader>(std::move(v.value()));
    o_.val_batches = static_cast<int>(std::min<uint64_t>(o_.val_batches, val_->num_samples() / (uint64_t(B) * world)));
    return Status::OK();
  }

  // Outputs that could fail only after training are checked now (the log is opened by Resume).
  Status CheckOutputs() {
    if (!o_.save_model.empty()) {
      const std::string& f = o_.save_model;
      const std::string dir = f.find('/') == std::string::npos ? "." : f.substr(0, f.rfind('/') + 1);
      if (access(dir.c_str(), W_OK) != 0)
        return Status::InvalidArgument("--save-model " + f + ": directory " + dir + " is not writable or does not exist");
    }
    SHARDGPT_RETURN_IF_ERROR(ckpt_.Open(device_));  // creates --ckpt-dir, where the log may live
    Status st;
    if (lead_ && !o_.log_file.empty()) {  // one job per log, until this run ends
      auto lock = PidLockFile::Acquire(o_.log_file + ".lock", "--log " + o_.log_file,
                                       "give another --log path, or delete the lock if that job is gone");
      if (lock.ok()) log_lock_ = std::move(lock.value());
      else st = lock.status();
    }
    return Agree(comm_, st);
  }

  // The JSONL log (rank 0). A fresh run (GuardPaths refused an existing log without
  // --log-overwrite) or --log-overwrite truncates it. A resumed run keeps the rows of steps up
  // to the checkpoint's step and appends after them: rows written after that checkpoint (by a
  // run killed or stopped later) are dropped because this run writes those steps again, so a
  // log that survives any number of requeues has every step exactly once. A row is written
  // before the checkpoint of its step (Loop), so no step is lost either. Collective.
  Status OpenLog() {
    Status st;
    if (lead_ && !o_.log_file.empty()) {
      const bool append = (ckpt_.resuming() || o_.checkpoint.resume == "auto") && !o_.log_overwrite;
      if (append) st = KeepLogRowsUpTo(o_.log_file, state_.step);
      if (st.ok()) st = log_.Open(o_.log_file, append);
    }
    return Agree(comm_, st);
  }

  // The checkpoint the manager chose (if any) into the engine, then the checks of what the
  // resumed state allows, the log, and the start-up lines. Collective.
  Status Resume() {
    SHARDGPT_RETURN_IF_ERROR(ckpt_.Load(*engine_, *layout_, &state_));
    resume_record_ = ckpt_.resume_record();
    if (ckpt_.resuming()) {
      SHARDGPT_RETURN_IF_ERROR(CheckResumeChanges());
      // Nothing left to do would silently do nothing: say so. (At the last step with validation
      // data there is something left: the final validation a stop may have interrupted.)
      if (state_.step > o_.steps || (state_.step == o_.steps && !val_))
        return Agree(comm_, Status::InvalidArgument("--steps " + std::to_string(o_.steps) + " is at or below the step " +
                                                    std::to_string(state_.step) + " of the checkpoint " + ckpt_.resume_path() +
                                                    " (raise --steps to train further)"));
      if (o_.stop_at_step > 0 && o_.stop_at_step <= state_.step)
        return Agree(comm_, Status::InvalidArgument("--stop-at-step " + std::to_string(o_.stop_at_step) +
                                                    " is at or below the resumed step " + std::to_string(state_.step)));
      train_->Restore(LoaderState{state_.loader_position});
      if (lead_) {  // even with --quiet: a requeued job's output says where it picked up
        std::printf("resumed from %s at step %lld (%lld tokens seen) on %d rank(s), zero stage %d%s\n",
                    ckpt_.resume_path().c_str(), static_cast<long long>(state_.step),
                    static_cast<long long>(state_.tokens), comm_.world_size(), o_.engine.zero_stage,
                    ckpt_.ResumeDetails().c_str());
        std::fflush(stdout);
      }
    }
    SHARDGPT_RETURN_IF_ERROR(OpenLog());
    const std::vector<uint64_t> state_per_rank = GatherPerRank(comm_, engine_->memory().StateTotal());
    if (lead_ && !o_.quiet) {
      std::printf("shardgpt: model %s, %.2fM parameters, %d rank(s), zero stage %d, %s, B=%d T=%d grad-accum=%d "
                  "(%lld tokens/step), device %s, %d thread(s)/rank\n",
                  o_.model.ToString().c_str(), layout_->total_numel() / 1e6, comm_.world_size(), o_.engine.zero_stage,
                  DTypeName(o_.engine.dtype), o_.micro_batch, o_.seq_len, o_.grad_accum, tokens_per_step(),
                  device_.name().c_str(), ComputeThreads());
      if (!compute_line_.empty()) std::printf("%s\n", compute_line_.c_str());
      PrintStartupReport(*engine_, *layout_, o_.grad_accum, state_per_rank);
      PrintNcclMemoryLine();
      PrintRecomputeLine();
      std::fflush(stdout);  // a batch job's output file shows the start before the first step
    }
    return Status::OK();
  }

  // NCCL runs (the stream-ordered communicator is NCCL's): the estimate of NCCL's own device
  // buffers per rank (parallel/nccl_memory.h) from this run's ranks, shard groups and NCCL_*
  // environment, without and with NVLS (shardgpt cannot tell whether NCCL uses it).
  void PrintNcclMemoryLine() const {
    if (!comm_.stream_ordered()) return;
    const NcclMemoryEstimate e = NcclEstimate(false);
    const double nvls = NcclEstimate(true).nvls();
    std::printf("NCCL buffers (an estimate, not tracked): %.1f MiB per rank: %s", e.total() / 1048576.0,
                e.Describe(NcclAssumptions(false)).c_str());
    if (nvls > 0) std::printf("; %.1f MiB more where NCCL uses NVLS (NVSwitch nodes)", nvls / 1048576.0);
    std::printf("\n");
  }
  static NcclMemoryAssumptions NcclAssumptions(bool nvls) {
    return NcclAssumptionsFromEnvironment([](const char* name) -> const char* { return std::getenv(name); }, nvls);
  }
  // This run's communicators (world, and with HSDP shard and replica) under NCCL_* of the environment.
  NcclMemoryEstimate NcclEstimate(bool nvls) const {
    auto G = o_.engine.ShardGroupSize(comm_.world_size());
    return EstimateNcclMemory(comm_.world_size(), G.ok() ? G.value() : comm_.world_size(), o_.ranks_per_node,
                              NcclAssumptions(nvls));
  }

  // What --recompute saves and costs: the activations against each mode's, and the recomputed
  // forward FLOPs as a share of the step (forward + backward = 3 x forward).
  void PrintRecomputeLine() const {
    const int B = o_.micro_batch, T = o_.seq_len;
    auto mib = [&](Recompute r) { return GPT::ActivationBytes(o_.model, B, T, r) / 1048576.0; };
    const double fwd = GPT::ForwardFlops(o_.model, B, T), extra = GPT::RecomputeFlops(o_.model, B, T, o_.recompute);
    std::printf("recompute %s: activations %.1f MiB per rank (none %.1f, gelu %.1f, block %.1f MiB: %.0f%% less than "
                "none); recomputation adds %.3f GFLOP per micro-batch = %.1f%% of the step's %.3f GFLOP\n",
                RecomputeName(o_.recompute), model_->activation_bytes() / 1048576.0, mib(Recompute::kNone),
                mib(Recompute::kGelu), mib(Recompute::kBlock),
                100 * (1 - model_->activation_bytes() / 1048576.0 / mib(Recompute::kNone)), extra / 1e9,
                100 * extra / (3 * fwd), 3 * fwd / 1e9);
  }

  Status Loop(int* exit_code) {
    const int hold_at_step = TestHoldAtStep(ckpt_.resuming(), state_.step);
    const int first_step = static_cast<int>(state_.step);
    if (!o_.trace_dir.empty() && state_.step < o_.trace_last) {
      StartFlightTrace(o_.trace_first, o_.trace_last, kTraceSpans);
      tracing_ = true;
    } else if (!o_.trace_dir.empty() && lead_) {
      std::fprintf(stderr, "shardgpt: warning: --trace-steps %lld:%lld are at or before the resumed step %lld: no trace\n",
                   static_cast<long long>(o_.trace_first), static_cast<long long>(o_.trace_last),
                   static_cast<long long>(state_.step));
    }
    for (int step = static_cast<int>(state_.step); step < o_.steps; step++) {
      // a stop on any rank: every rank checkpoints at this step boundary and stops
      if (o_.stop_at_step > 0 && step == o_.stop_at_step) {
        SHARDGPT_RETURN_IF_ERROR(Save());
        if (lead_ && !o_.quiet) std::printf("stopped at step %d (--stop-at-step)\n", step);
        stopped_ = true;
        return Status::OK();
      }
      MpiCommunicator::SetDiagnosticStep(step + 1);  // what a --comm-timeout line names
      SetFlightStep(step + 1);
      SetFlightMicro(-1);
      SetFlightUnit(-1);
      SetFlightPhase(FlightPhase::kIdle);
      if (tracing_ && step + 1 > o_.trace_last) WriteTrace();
      if (step == hold_at_step) HoldUntilStopRequested("at the step boundary");
      // SHARDGPT_TEST_FAULT=skip: the faulty rank skips this agreement and hangs (flight_recorder.h)
      if (FlightFaultAt(FlightFault::kSkip, step + 1))
        for (;;) pause();  // skipped the agreement below and waits elsewhere
      if (StopRequested()) return StopOnSignal(step, "", exit_code);
      if (exclude_agreed_) return StopToExcludeHosts(step, exit_code);
      if (FlightFaultArmedAt(FlightFault::kSize, step + 1)) TestSizeFault(step + 1);
      // the run's first step (allocations, first touches) is not timed for stragglers
      const bool timed = o_.straggler_every > 0 && step > first_step;
      if (timed) straggler_.BeginStep();
      const StepResult r = TrainStep(step);
      if (timed) {
        const StepReport& rep = engine_->last_report();
        straggler_.EndStep(rep.forward_wait_s, rep.backward_wait_s, rep.after_backward_wait_s);
      }
      if (o_.straggler_every > 0 && (step + 1) % o_.straggler_every == 0) {
        ReportStragglers(step + 1);
        // rank 0 alone counts the reports: every rank learns whether to stop at the next boundary
        if (o_.straggler_exclude_after > 0) exclude_agreed_ = !comm_.AllTrue(exclude_hosts_.empty());
      }
      // Divergence: the loss and the norm are the same on every rank (all-reduced), so every
      // rank stops here, before anything of this state can be saved or published.
      if (!std::isfinite(r.loss) || !std::isfinite(r.norm)) {
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "training diverged at step %d: %s is %s (last finite loss %.4f at step %lld); stopped without "
                      "saving this state; lower --lr or resume from the last checkpoint",
                      step + 1, !std::isfinite(r.loss) ? "the loss" : "the gradient norm",
                      NonFinite(!std::isfinite(r.loss) ? r.loss : r.norm), last_finite_loss_,
                      static_cast<long long>(last_finite_step_));
        WriteFlightDumpOnce("divergence");
        return Status::Internal(lead_ ? buf : "");
      }
      last_finite_loss_ = r.loss, last_finite_step_ = step + 1;
      state_.step = step + 1;
      state_.tokens += tokens_per_step();
      const bool eval_now = val_ && ((o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || step + 1 == o_.steps);
      // a stop during validation abandons it: the step is done, its row has no val_loss
      const bool evaluated = eval_now && Evaluate(&last_val_);
      // a row that cannot be written stops every rank before this step's checkpoint
      const Status logged = Log(step, r, evaluated);
      if (!o_.log_file.empty()) SHARDGPT_RETURN_IF_ERROR(Agree(comm_, logged));
      if (eval_now && !evaluated) return StopOnSignal(step + 1, " (during validation)", exit_code);
      // after the row: a checkpoint at step s always has the log rows 1..s behind it
      if (ckpt_.DuePeriodic(state_.step, o_.steps)) {
        const size_t failed_before = ckpt_failures_;
        const Status saved = Save(/*background=*/true, /*periodic=*/true);
        if (!saved.ok() && ckpt_.fail_limit_reached()) *exit_code = kExitSignalled;  // a requeue may find room
        SHARDGPT_RETURN_IF_ERROR(saved);
        if (ckpt_failures_ > failed_before) HoldWhileTestFileExists();
      }
    }
    return Status::OK();
  }

  // Every --straggler-every steps: every rank's window (its phase times since the last report)
  // in one small control all-gather; rank 0 scores them (parallel/straggler.h), names each
  // straggler in one line on stderr, and keeps the figures for this step's JSONL row. Collective.
  void ReportStragglers(int64_t step) {
    const StragglerTimes mine = straggler_.Take();
    std::vector<uint64_t> v;
    for (double x : mine.s) v.push_back(static_cast<uint64_t>(std::llround(x * 1e9)));  // ns
    v.push_back(static_cast<uint64_t>(mine.steps));
    const std::vector<uint64_t> all = AllGatherU64(comm_, v);
    if (!lead_) return;
    const size_t per = v.size(), world = all.size() / per;
    std::vector<StragglerTimes> ranks(world);
    for (size_t r = 0; r < world; r++) {
      for (int f = 0; f < kStragglerFigures; f++) ranks[r].s[f] = static_cast<double>(all[r * per + f]) * 1e-9;
      ranks[r].steps = static_cast<int64_t>(all[r * per + kStragglerFigures]);
    }
    if (mine.steps == 0) return;  // nothing timed since the last report (the run's first step only)
    const StragglerVerdict verdict = ScoreStragglers(ranks, o_.straggler_threshold);
    auto host = [&](size_t r) { return r < job_.hosts.size() ? job_.hosts[r] : std::string("?"); };
    auto round4 = [](double x) { return std::round(x * 1e4) * 1e-4; };
    nlohmann::json row, names = nlohmann::json::array(), scores = nlohmann::json::array(), ms = nlohmann::json::object();
    for (int r : verdict.stragglers) {
      const char* phase = StragglerFigureName(verdict.phase[r]);
      const double busy_ms = ranks[r].busy() / std::max<int64_t>(1, ranks[r].steps) * 1e3;
      std::fprintf(stderr,
                   "shardgpt: straggler: rank %d on host %s, phase %s, score %.2f over steps %lld-%lld (busy %.1f "
                   "ms/step against the median rank's %.1f; --straggler-threshold %.2f)\n",
                   r, host(r).c_str(), phase, verdict.score[r], static_cast<long long>(step - mine.steps + 1),
                   static_cast<long long>(step), busy_ms, verdict.median_busy_s * 1e3, o_.straggler_threshold);
      names.push_back({{"rank", r}, {"host", host(r)}, {"phase", phase}, {"score", round4(verdict.score[r])}});
    }
    std::fflush(stderr);
    if (o_.straggler_exclude_after > 0) {
      std::vector<std::string> named, all;
      for (int r : verdict.stragglers) named.push_back(host(r));
      for (size_t r = 0; r < world; r++) all.push_back(host(r));
      exclude_hosts_ = straggler_streaks_.Report(named, all);
    }
    for (size_t r = 0; r < world; r++) scores.push_back(round4(verdict.score[r]));
    for (int f = 0; f < kStragglerFigures; f++) {
      nlohmann::json& col = ms[StragglerFigureName(f)] = nlohmann::json::array();
      for (size_t r = 0; r < world; r++)
        col.push_back(round4(ranks[r].s[f] / std::max<int64_t>(1, ranks[r].steps) * 1e3));
    }
    row["stragglers"] = std::move(names);
    row["straggler_score_per_rank"] = std::move(scores);
    row["phase_ms_per_rank"] = std::move(ms);
    row["straggler_steps"] = mine.steps;
    straggler_row_ = std::move(row);
  }

  // Each rank's trace of --trace-steps, once the window is over (or the run ended in it). A file
  // that cannot be written is a warning: training goes on.
  void WriteTrace() {
    tracing_ = false;
    std::vector<FlightSpan> spans;
    const size_t dropped = CopyFlightTrace(&spans);
    StopFlightTrace();
    std::vector<std::string> units;
    for (const auto& u : layout_->units()) units.push_back(u.name);
    const std::string path = TraceFileName(o_.trace_dir, job_.world_rank);
    const Status st = WriteTraceFile(path, RankTraceJson(job_, o_.trace_first, o_.trace_last, spans, dropped, units));
    if (!st.ok()) std::fprintf(stderr, "shardgpt: warning: --trace: %s\n", st.message().c_str());
    else if (lead_ && !o_.quiet)
      std::printf("trace of steps %lld-%lld written to %s/trace_rank_*.json, one per rank (merge: shardgpt diagnose "
                  "--merge-trace %s)\n",
                  static_cast<long long>(o_.trace_first), static_cast<long long>(o_.trace_last), o_.trace_dir.c_str(),
                  o_.trace_dir.c_str());
    std::fflush(stdout);
  }

  // SHARDGPT_TEST_FAULT=size (flight_recorder.h): every rank issues one extra broadcast of 64
  // floats from rank 0, the faulty rank (not 0) with 65 (a receiver expecting more than comes:
  // MPI completes it), then the faulty rank hangs, so that the job ends by the watchdog.
  void TestSizeFault(int64_t step) {
    const bool faulty = FlightFaultAt(FlightFault::kSize, step);
    std::vector<float> buf(65, 1.0f);
    comm_.Broadcast(buf.data(), faulty ? 65 : 64, DType::kF32, 0)->Wait();
    if (faulty)
      for (;;) pause();
  }

  // Whether any rank got SIGUSR1/SIGTERM/SIGINT; every rank gets the same answer. Collective.
  bool StopRequested() { return !comm_.AllTrue(g_stop_signal == 0); }

  // The test hooks' wait (see TestHoldAtStep, TestHoldInValidation): every rank polls the
  // agreed stop flag. Collective.
  void HoldUntilStopRequested(const char* where) {
    if (lead_) {  // what the test waits for before it signals
      std::printf("test hook: holding %s until a stop signal\n", where);
      std::fflush(stdout);
    }
    while (!StopRequested()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  // The agreed stop: checkpoint at this step boundary, then exit kExitSignalled, or
  // kExitInterrupted when any rank got SIGINT (Ctrl-C: the user ends the run, no requeue).
  Status StopOnSignal(int step, const char* where, int* exit_code) {
    const bool interrupted = !comm_.AllTrue(g_stop_signal != SIGINT);
    const int code = interrupted ? kExitInterrupted : kExitSignalled;
    if (lead_) {
      // what is being saved, so that a slow save is seen as one (a launcher that kills the
      // ranks a few seconds after its stop signal loses it: see docs/TRAINING.md)
      const char* sigint = interrupted ? " (SIGINT; a second one aborts at once)" : "";
      if (ckpt_.enabled()) {
        const size_t n = layout_->total_numel();
        std::printf("stop signal received%s%s: checkpointing at step %d (%.1f MB: %zu parameters x master, m, v in "
                    "fp32) and exiting (status %d)\n",
                    where, sigint, step, 12.0 * static_cast<double>(n) / 1e6, n, code);
      } else {
        std::printf("stop signal received%s%s: no --ckpt-dir, exiting at step %d without a checkpoint (status %d)\n",
                    where, sigint, step, code);
      }
      std::fflush(stdout);
    }
    SHARDGPT_RETURN_IF_ERROR(Save());
    *exit_code = code;
    stopped_ = true;
    return Status::OK();
  }

  // --straggler-exclude-after: rank 0 records the hosts of exclude_hosts_ in
  // --ckpt-dir/exclude_hosts, then every rank checkpoints at this step boundary and the run
  // exits kExitExcludeHost. Collective.
  Status StopToExcludeHosts(int step, int* exit_code) {
    Status recorded = Status::OK();
    if (lead_) {
      const std::string path = o_.checkpoint.dir + "/" + kExcludeHostsFile;
      recorded = RecordExcludedHosts(path, exclude_hosts_);
      std::string names;
      for (const std::string& h : exclude_hosts_) names += (names.empty() ? "" : ", ") + h;
      if (recorded.ok())
        std::printf("straggler: host %s named in %d reports in a row (--straggler-exclude-after): recorded in %s; "
                    "checkpointing at step %d and exiting (status %d) to be restarted without it\n",
                    names.c_str(), o_.straggler_exclude_after, path.c_str(), step, kExitExcludeHost);
      std::fflush(stdout);
    }
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, recorded));
    SHARDGPT_RETURN_IF_ERROR(Save());
    *exit_code = kExitExcludeHost;
    stopped_ = true;
    return Status::OK();
  }

  struct StepResult {
    float loss, lr, norm;
    double seconds;
    DeviceCounters device;  // what the step cost the device: differences of counters()
    uint64_t attention_tc_calls = 0;  // the step's attention calls on the tensor-core kernels
  };
  // One optimizer step over grad_accum micro-batches; the loss is the mean over ranks.
  StepResult TrainStep(int step) {
    const int B = o_.micro_batch, T = o_.seq_len, A = o_.grad_accum;
    x_.resize(static_cast<size_t>(B) * T), y_.resize(x_.size());
    const DeviceCounters c0 = device_.counters();
    const uint64_t tc0 = TensorCoreAttentionCalls(device_);
    const double t0 = MonotonicSeconds();
    StepResult r;
    r.lr = o_.schedule.At(step);
    engine_->BeginStep();
    // On a GPU the step's loss is summed on the device and read once, with the norm, at the
    // end: the step's one host wait. The CPU keeps the host path (bitwise as before).
    const bool on_device = device_.is_cuda();
    double* dev = on_device ? step_scalars_.as<double>() : nullptr;  // [loss sum, loss, norm]
    if (on_device) device_.Zero(dev, sizeof(double));
    double loss_sum = 0;
    for (int m = 0; m < A; m++) {
      SetFlightMicro(m);
      SetFlightPhase(FlightPhase::kData);
      train_->NextBatch(x_.data(), y_.data());
      engine_->BeginMicroBatch(m, A);
      if (on_device)
        model_->ForwardAcc(*engine_, x_.data(), y_.data(), B, T, 1.0f / A, dev);
      else
        loss_sum += model_->Forward(*engine_, x_.data(), y_.data(), B, T, 1.0f / A);
      model_->Backward(*engine_);
    }
    SetFlightPhase(FlightPhase::kCheckpoint);
    ckpt_.WaitStaged();  // a background checkpoint's copy of the owned state, before the step writes it
    if (on_device) {
      engine_->StepDeferred(r.lr, o_.grad_clip);
      device_.kernels().sum_f64(dev + 1, dev, 1, A);  // this rank's mean over micro-batches
      engine_->SumOverRanks(comm_, dev + 1, comm_.world_size());  // the mean over ranks
      device_.Copy(dev + 2, engine_->device_norm(), sizeof(float));
      // The one read: it waits for the step's queued work, so the step's time includes it.
      double host[3];
      device_.CopyToHost(host, dev, sizeof(host));
      r.loss = static_cast<float>(host[1]);
      std::memcpy(&r.norm, &host[2], sizeof(float));
    } else {
      r.norm = engine_->Step(r.lr, o_.grad_clip);
      device_.Synchronize();  // the step's time includes the device's queued work
      r.loss = static_cast<float>(comm_.AllReduceScalar(loss_sum / A, ReduceOp::kAvg));
    }
    r.seconds = MonotonicSeconds() - t0;
    const DeviceCounters c1 = device_.counters();
    r.device = c1;
    r.device.allocations = c1.allocations - c0.allocations, r.device.frees = c1.frees - c0.frees;
    r.device.host_syncs = c1.host_syncs - c0.host_syncs;
    r.attention_tc_calls = TensorCoreAttentionCalls(device_) - tc0;
    last_loss_ = r.loss;
    return r;
  }

  // Mean validation loss over val_batches global micro-batches (the same ones every time) into
  // *loss. Validation can be long, so the stop flag is agreed on before every micro-batch too;
  // returns false (no loss) when a stop cut it short. Collective.
  bool Evaluate(float* loss) {
    const int B = o_.micro_batch, T = o_.seq_len;
    std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
    val_->Reset();
    SetFlightPhase(FlightPhase::kValidation);
    double sum = 0;
    bool stopped = false;
    for (int i = 0; i < o_.val_batches && !(stopped = StopRequested()); i++) {
      if (i == 1 && hold_in_validation_) HoldUntilStopRequested("in validation");
      val_->NextBatch(x.data(), y.data());
      sum += model_->Forward(*engine_, x.data(), y.data(), B, T, 0.0f);
    }
    engine_->ReleaseAll();
    if (stopped) return false;
    *loss = static_cast<float>(comm_.AllReduceScalar(sum / o_.val_batches, ReduceOp::kAvg));
    return true;
  }

  // This run's record of what its data order depends on (saved in every checkpoint).
  TrainState RunRecord() const {
    TrainState r = state_;
    r.seed = o_.seed;
    r.batch_samples = static_cast<int64_t>(o_.micro_batch) * comm_.world_size() * o_.grad_accum;
    r.seq_len = o_.seq_len;
    r.shuffle = o_.shuffle ? 1 : 0;
    r.data_files.clear();
    for (size_t i = 0; i < train_->files().size(); i++) r.data_files.push_back({train_->files()[i], train_->file_tokens(i)});
    return r;
  }

  // After loading: one line per change of what the data order depends on (ResumeChanges), a
  // warning on rank 0, or an error for blocking ones unless --allow-config-change; then this
  // run's values replace the saved ones (later checkpoints record what this run does).
  // Every rank computes the same lines from the same index.
  Status CheckResumeChanges() {
    const TrainState now = RunRecord();
    std::vector<std::string> errors;
    for (const ConfigChange& c : ResumeChanges(state_, now)) {
      const std::string line = "resume from " + ckpt_.resume_path() + ": " + c.line;
      if (c.blocking && !o_.allow_config_change) errors.push_back(line + " (--allow-config-change accepts it)");
      else if (lead_)
        std::fprintf(stderr, "shardgpt: warning: %s%s\n", line.c_str(),
                     c.blocking ? " (accepted by --allow-config-change)" : "");
    }
    if (lead_)
      for (size_t i = 0; i + 1 < errors.size(); i++) std::fprintf(stderr, "shardgpt: error: %s\n", errors[i].c_str());
    std::fflush(stderr);
    if (!errors.empty()) return Agree(comm_, Status::InvalidArgument(lead_ ? errors.back() : ""));
    const TrainState saved = state_;
    state_ = now;
    state_.step = saved.step, state_.tokens = saved.tokens, state_.loader_position = saved.loader_position;
    return Agree(comm_, Status::OK());
  }

  // A checkpoint of the current state (no-op without --ckpt-dir). background: a periodic one,
  // which --async-ckpt writes while training continues; the others (stop, end) are complete
  // when this returns. Collective.
  Status Save(bool background = false, bool periodic = false) {
    if (!ckpt_.enabled()) return Status::OK();
    SetFlightPhase(FlightPhase::kCheckpoint);
    state_ = RunRecord();
    state_.loader_position = train_->state().position;
    const Status st = ckpt_.Save(state_, *engine_, *layout_, background, periodic);
    const CheckpointManager::Cost peek = ckpt_.TakeCost();  // failures counted here, reported by Log
    pending_cost_.saved = pending_cost_.saved || peek.saved;
    pending_cost_.stall_ms += peek.stall_ms;
    if (peek.write_ms >= 0) pending_cost_.write_ms = peek.write_ms;
    for (const auto& f : peek.failures) pending_cost_.failures.push_back(f), ckpt_failures_++;
    return st;
  }

  // Test hook (SHARDGPT_TEST_HOLD_WHILE_EXISTS=FILE): after a periodic save that failed, every
  // rank waits while FILE exists (rank 0 looks), so that a test can free the disk at a known
  // point, whatever the machine's speed. Collective.
  void HoldWhileTestFileExists() {
    const char* f = std::getenv("SHARDGPT_TEST_HOLD_WHILE_EXISTS");
    if (f == nullptr || *f == '\0') return;
    if (lead_) std::printf("test hook: holding after a failed checkpoint while %s exists\n", f), std::fflush(stdout);
    while (!comm_.AllTrue(!lead_ || access(f, F_OK) != 0)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  // The step line on stdout and the JSONL record (rank 0; the per-rank figures are collective).
  // Returns the JSONL write's error (rank 0).
  Status Log(int step, const StepResult& r, bool eval_now) {
    const StepReport& report = engine_->last_report();
    // Per-rank ledgers only for the JSONL (o_.log_file is the same flag on every rank), in one
    // small control gather: no collective is added to steps that are not logged to a file.
    constexpr size_t kPerRank = 6;
    std::vector<uint64_t> per_rank;
    if (!o_.log_file.empty())
      per_rank = AllGatherU64(comm_, {report.comm.Total().bytes_sent + report.comm_across.Total().bytes_sent,
                                      report.model_state_bytes, report.comm_across.Total().bytes_sent,
                                      r.device.allocations, r.device.frees, r.device.host_syncs});
    if (!lead_) return Status::OK();
    const double tps = tokens_per_step() / r.seconds;
    if (!o_.quiet) {
      std::printf("%sstep %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s\n",
                  isatty(fileno(stdout)) ? ProgressBar(step + 1, o_.steps).c_str() : "", step + 1, o_.steps, r.loss,
                  r.lr, r.norm, r.seconds * 1e3, tps, eval_now ? (" | val " + std::to_string(last_val_)).c_str() : "");
      std::fflush(stdout);
    }
    nlohmann::json stragglers = std::move(straggler_row_);
    straggler_row_ = nullptr;
    if (!log_.is_open()) return Status::OK();
    nlohmann::json j = StepJson(report, *engine_, *layout_, o_.grad_accum);
    if (stragglers.is_object())  // a --straggler-every step: the scores, the per-rank phase times
      for (auto& [key, value] : stragglers.items()) j[key] = std::move(value);
    j["step"] = step + 1;
    j["loss"] = r.loss;
    j["lr"] = r.lr;
    j["grad_norm"] = r.norm;
    j["tokens"] = state_.tokens;
    j["tokens_per_s"] = tps;
    j["ms"] = r.seconds * 1e3;
    j["recompute"] = RecomputeName(o_.recompute);
    j["gelu"] = o_.gelu_fused ? "fused" : "separate";
    std::vector<uint64_t> comm_bytes, state_bytes, across_bytes, allocs, frees, syncs;
    for (size_t i = 0; i + kPerRank <= per_rank.size(); i += kPerRank) {
      comm_bytes.push_back(per_rank[i]), state_bytes.push_back(per_rank[i + 1]), across_bytes.push_back(per_rank[i + 2]);
      allocs.push_back(per_rank[i + 3]), frees.push_back(per_rank[i + 4]), syncs.push_back(per_rank[i + 5]);
    }
    j["comm_bytes_per_rank"] = comm_bytes;  // inside + across groups
    j["model_state_bytes_per_rank"] = state_bytes;
    if (engine_->num_groups() > 1) j["comm_bytes_across_groups_per_rank"] = across_bytes;
    // What the step (TrainStep: its micro-batches, the optimizer step, the final synchronise)
    // cost the device, where the device counts it (every rank runs the same device kind):
    // allocations and frees of device memory, host waits on device work. This rank's figure,
    // then every rank's. On the CPU the system allocations and frees behind the device's block
    // cache, no host_syncs; on a GPU only CudaDevice's own allocations and frees, no host_syncs;
    // under the CUDA emulation the whole process's (a background checkpoint's staging counts in
    // the step it overlaps).
    if (r.device.known) {
      j["device_allocations"] = r.device.allocations;
      j["device_allocations_per_rank"] = allocs;
      j["device_frees"] = r.device.frees;
      j["device_frees_per_rank"] = frees;
    }
    if (r.device.host_syncs_known) {
      j["host_syncs"] = r.device.host_syncs;
      j["host_syncs_per_rank"] = syncs;
    }
    // This rank's attention calls (forward and backward, recompute included) that ran the bf16
    // tensor-core kernels in the step (CUDA only; 0 where fp32 products, other head sizes or
    // cuDNN take attention).
    if (device_.is_cuda()) j["attention_tc_calls"] = r.attention_tc_calls;
    if (eval_now) j["val_loss"] = last_val_;
    if (!resume_record_.is_null()) j["resume"] = std::move(resume_record_), resume_record_ = nullptr;  // first row only
    // what checkpointing cost since the previous row (the save of a step comes after its row)
    CheckpointManager::Cost cost = ckpt_.TakeCost();
    cost.saved = cost.saved || pending_cost_.saved;
    cost.stall_ms += pending_cost_.stall_ms;
    if (cost.write_ms < 0) cost.write_ms = pending_cost_.write_ms;
    cost.failures.insert(cost.failures.begin(), pending_cost_.failures.begin(), pending_cost_.failures.end());
    pending_cost_ = CheckpointManager::Cost();
    if (cost.saved) j["ckpt_stall_ms"] = cost.stall_ms;
    if (cost.write_ms >= 0) j["ckpt_write_ms"] = cost.write_ms;
    for (const auto& f : cost.failures)  // each save that failed since the previous row
      j["ckpt_failed"].push_back({{"step", f.first}, {"error", f.second}});
    return log_.Append(j.dump(), step + 1);
  }

  // The log closed (fsync'd) and its error agreed on, at every normal or stopped end. Collective.
  Status CloseLog() {
    if (o_.log_file.empty()) return Status::OK();
    return Agree(comm_, lead_ ? log_.Close() : Status::OK());
  }

  Status Finish(int* exit_code) {
    // a run resumed from its final checkpoint (stopped during the last validation) validates here
    if (val_ && std::isnan(last_val_) && !Evaluate(&last_val_))
      return StopOnSignal(static_cast<int>(state_.step), " (during validation)", exit_code);
    SHARDGPT_RETURN_IF_ERROR(Save());
    if (!o_.save_model.empty()) {
      LocalParams local(*layout_);
      engine_->GatherFullParams(local.params());
      Status st = lead_ ? WriteLlmcModel(o_.save_model, *layout_, local.params()) : Status::OK();
      SHARDGPT_RETURN_IF_ERROR(Agree(comm_, st));
      if (lead_ && !o_.quiet) std::printf("saved model to %s (llm.c format, version 3)\n", o_.save_model.c_str());
    }
    if (lead_) {
      if (std::isnan(last_loss_))  // resumed from the final checkpoint: nothing was trained here
        std::printf("no step left to train (resumed at step %lld of %d)", static_cast<long long>(state_.step), o_.steps);
      else
        std::printf("final train loss %.4f", last_loss_);
      if (!std::isnan(last_val_)) std::printf(" | val loss %.4f", last_val_);
      std::printf("\n");
    }
    if (o_.sample_tokens > 0) {
      const std::string text = Sample(*layout_, *engine_, o_);
      if (lead_)
        std::printf("---- sample (%d tokens) ----\n%s%s\n----\n", o_.sample_tokens, o_.sample_prompt.c_str(), text.c_str());
    }
    std::fflush(stdout);
    return Status::OK();
  }

  long long tokens_per_step() const {
    return static_cast<long long>(o_.micro_batch) * o_.seq_len * o_.grad_accum * comm_.world_size();
  }

  TrainOptions o_;
  Communicator& comm_;
  Device& device_;
  const bool lead_;
  nlohmann::json resume_record_;  // the resume, for the first JSONL row after it (rank 0)
  std::string compute_line_;  // the start-up line saying which precision the matmuls run in
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GPT> model_;
  // GPU only: the step's [loss sum over micro-batches, mean loss over ranks, norm (a float)],
  // kept on the device through the step and read back once (TrainStep).
  DeviceBuffer step_scalars_;
  std::unique_ptr<DataLoader> train_, val_;
  std::unique_ptr<PidLockFile> log_lock_;  // rank 0: LOG.lock, held from CheckOutputs to the end
  JsonlLog log_;
  CheckpointManager::Cost pending_cost_;  // what the saves since the last row cost, for its JSONL
  size_t ckpt_failures_ = 0;  // periodic saves that failed, all told
  CheckpointManager ckpt_;  // declared after the engine: destroyed first (waits for a background save)
  TrainState state_;
  std::vector<int32_t> x_, y_;
  float last_loss_ = NAN, last_val_ = NAN;
  float last_finite_loss_ = NAN;  // for the divergence message
  int64_t last_finite_step_ = 0;
  bool stopped_ = false;  // a stop signal or --stop-at-step ended the loop (checkpoint written)
  const bool hold_in_validation_ = TestHoldInValidation();
  FlightJob job_;  // the run's identity: run id, hosts by rank (the straggler lines, the traces)
  StragglerWindow straggler_;
  nlohmann::json straggler_row_;  // rank 0: a report's figures, for the step's JSONL row
  StragglerStreaks straggler_streaks_{o_.straggler_exclude_after};  // rank 0
  std::vector<std::string> exclude_hosts_;  // rank 0: the hosts the last report found to exclude
  bool exclude_agreed_ = false;             // every rank: stop at the next step boundary to exclude them
  bool tracing_ = false;  // --trace: the window's spans are being kept
  static constexpr size_t kTraceSpans = 1 << 18;  // the phase trace's buffer, in spans
};

}  // namespace

Status RunTrain(TrainOptions o, Communicator& comm, Device& device, int* exit_code) {
  o.checkpoint.quiet = o.quiet;
  Trainer trainer(std::move(o), comm, device);
  return trainer.Run(exit_code);
}

}  // namespace shardgpt
