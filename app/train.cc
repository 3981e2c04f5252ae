#include "app/train.h"

#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "app/report.h"
#include "io/checkpoint.h"
#include "io/data_loader.h"
#include "io/llmc_model.h"
#include "io/tokenizer.h"
#include "model/compute_precision.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/sampler.h"

namespace shardgpt {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
void OnStopSignal(int sig) { g_stop_signal = sig; }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
}

namespace {

// Setup phase 1: the model config (from --init or the flags) and the checkpoint to resume from
// (empty: a fresh start), agreed on by every rank.
Status ResolveModelAndResume(TrainOptions& o, Communicator& comm, std::unique_ptr<LlmcModel>* init,
                             std::string* resume_path) {
  if (!o.init_file.empty()) {
    auto m = ReadLlmcModel(o.init_file);
    SHARDGPT_RETURN_IF_ERROR(Agree(comm, m.status()));
    *init = std::make_unique<LlmcModel>(std::move(m.value()));
    o.model = (*init)->config;
  }
  SHARDGPT_RETURN_IF_ERROR(o.model.Validate());
  if (o.resume.empty()) return Status::OK();
  if (o.resume == "latest" && o.ckpt_dir.empty())
    return Status::InvalidArgument("--resume latest needs --ckpt-dir (where to look for the latest checkpoint)");
  auto where = ResolveCheckpoint(o.resume, o.ckpt_dir);
  if (where.ok()) {
    *resume_path = where.value();
    auto saved = ReadCheckpointConfig(*resume_path, o.ckpt_dir);
    SHARDGPT_RETURN_IF_ERROR(Agree(comm, saved.status()));
    const std::string diff = saved->FirstDifference(o.model);
    if (!diff.empty())
      return Status::InvalidArgument(*resume_path + ": checkpoint is for another model (" + diff +
                                     ", checkpoint vs this run)");
  } else if (!(o.resume == "latest" && where.status().code() == Status::Code::kNotFound)) {
    return Agree(comm, where.status());
  } else if (comm.rank() == 0 && !o.quiet) {
    std::printf("--resume latest: no checkpoint in %s yet, starting from scratch\n", o.ckpt_dir.c_str());
  }
  return Status::OK();
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
  if (o.ckpt_every > 0 && o.ckpt_dir.empty())
    return Status::InvalidArgument("--ckpt-every needs --ckpt-dir (where to write checkpoints)");
  o.schedule.total_steps = o.steps;
  return Status::OK();
}

// The training run of one rank, as named phases: Setup (model, resume point, engine and
// activations on the device, data, outputs), Resume, Loop (TrainStep, Evaluate, Save, Log),
// Finish (final checkpoint, model file, loss, sample). Every phase is collective.
class Trainer {
 public:
  Trainer(TrainOptions o, Communicator& comm, Device& device)
      : o_(std::move(o)), comm_(comm), device_(device), lead_(comm.rank() == 0) {}

  Status Run(int* exit_code) {
    *exit_code = 0;
    SHARDGPT_RETURN_IF_ERROR(Setup());
    SHARDGPT_RETURN_IF_ERROR(Resume());
    SHARDGPT_RETURN_IF_ERROR(Loop(exit_code));
    if (stopped_) return Status::OK();
    return Finish();
  }

 private:
  Status Setup() {
    SetComputeThreads(o_.threads);
    std::unique_ptr<LlmcModel> init;
    SHARDGPT_RETURN_IF_ERROR(ResolveModelAndResume(o_, comm_, &init, &resume_path_));
    SHARDGPT_RETURN_IF_ERROR(ValidateLoopOptions(o_, comm_.world_size()));
    // bf16 runs round matmul inputs to bf16 where the device has fast bf16 matmuls (tensor cores,
    // AVX512-BF16/AMX), or where --compute-dtype asks for it
    const ComputeChoice compute =
        ChooseComputePrecision(o_.engine.dtype, o_.compute_dtype, DetectComputeFacts(device_.is_cuda()));
    device_.kernels().set_matmul_precision(compute.precision);
    compute_line_ = compute.line;
    layout_ = std::make_unique<ParamLayout>(o_.model);
    SHARDGPT_RETURN_IF_ERROR(Agree(comm_, AllocateOnDevice()));
    {
      std::vector<float> full(layout_->total_numel());
      if (init)
        full = std::move(init->params);
      else
        InitParameters(*layout_, o_.seed, full.data());
      engine_->LoadFullParams(full.data());
    }
    SHARDGPT_RETURN_IF_ERROR(OpenData());
    SHARDGPT_RETURN_IF_ERROR(OpenOutputs());
    state_.seed = o_.seed;
    return Status::OK();
  }

  // The engine's persistent state and the activations; out of memory is one agreed error.
  Status AllocateOnDevice() {
    try {
      auto engine_or = Engine::Create(*layout_, &comm_, o_.engine, device_);
      if (!engine_or.ok()) return engine_or.status();
      engine_ = std::move(engine_or.value());
      model_ = std::make_unique<GPT>(o_.model, o_.micro_batch, o_.seq_len, device_);
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

  // Outputs that could fail only after training are checked now.
  Status OpenOutputs() {
    if (!o_.save_model.empty()) {
      const std::string& f = o_.save_model;
      const std::string dir = f.find('/') == std::string::npos ? "." : f.substr(0, f.rfind('/') + 1);
      if (access(dir.c_str(), W_OK) != 0)
        return Status::InvalidArgument("--save-model " + f + ": directory " + dir + " is not writable or does not exist");
    }
    if (lead_ && !o_.log_file.empty()) {
      log_.open(o_.log_file);
      if (!log_) return Agree(comm_, Status::IOError(o_.log_file + ": cannot open the --log file for writing"));
    }
    return Agree(comm_, Status::OK());
  }

  Status Resume() {
    if (!resume_path_.empty()) {
      auto loaded = LoadCheckpoint(resume_path_, o_.ckpt_dir, *engine_, *layout_, comm_, o_.quiet);
      SHARDGPT_RETURN_IF_ERROR(Agree(comm_, loaded.status()));
      state_ = loaded.value();
      train_->Restore(LoaderState{state_.loader_position});
      if (lead_ && !o_.quiet)
        std::printf("resumed from %s at step %lld (%lld tokens seen)\n", resume_path_.c_str(),
                    static_cast<long long>(state_.step), static_cast<long long>(state_.tokens));
    }
    const std::vector<uint64_t> state_per_rank = GatherPerRank(comm_, engine_->memory().Total());
    if (lead_ && !o_.quiet) {
      std::printf("shardgpt: model %s, %.2fM parameters, %d rank(s), zero stage %d, %s, B=%d T=%d grad-accum=%d "
                  "(%lld tokens/step), device %s, %d thread(s)/rank\n",
                  o_.model.ToString().c_str(), layout_->total_numel() / 1e6, comm_.world_size(), o_.engine.zero_stage,
                  DTypeName(o_.engine.dtype), o_.micro_batch, o_.seq_len, o_.grad_accum, tokens_per_step(),
                  device_.name().c_str(), ComputeThreads());
      if (!compute_line_.empty()) std::printf("%s\n", compute_line_.c_str());
      PrintStartupReport(*engine_, *layout_, o_.grad_accum, state_per_rank);
    }
    return Status::OK();
  }

  Status Loop(int* exit_code) {
    for (int step = static_cast<int>(state_.step); step < o_.steps; step++) {
      // a stop on any rank: every rank checkpoints at this step boundary and stops
      if (o_.stop_at_step > 0 && step == o_.stop_at_step) {
        SHARDGPT_RETURN_IF_ERROR(Save());
        if (lead_ && !o_.quiet) std::printf("stopped at step %d (--stop-at-step)\n", step);
        stopped_ = true;
        return Status::OK();
      }
      if (!comm_.AllTrue(g_stop_signal == 0)) {
        if (lead_)
          std::printf("stop signal received: checkpointing at step %d and exiting (status %d)\n", step, kExitSignalled);
        SHARDGPT_RETURN_IF_ERROR(Save());
        *exit_code = kExitSignalled;
        stopped_ = true;
        return Status::OK();
      }
      const StepResult r = TrainStep(step);
      state_.step = step + 1;
      state_.tokens += tokens_per_step();
      if (o_.ckpt_every > 0 && state_.step % o_.ckpt_every == 0 && state_.step < o_.steps)
        SHARDGPT_RETURN_IF_ERROR(Save());
      const bool eval_now = val_ && ((o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || step + 1 == o_.steps);
      if (eval_now) last_val_ = Evaluate();
      Log(step, r, eval_now);
    }
    return Status::OK();
  }

  struct StepResult {
    float loss, lr, norm;
    double seconds;
  };
  // One optimizer step over grad_accum micro-batches; the loss is the mean over ranks.
  StepResult TrainStep(int step) {
    const int B = o_.micro_batch, T = o_.seq_len, A = o_.grad_accum;
    x_.resize(static_cast<size_t>(B) * T), y_.resize(x_.size());
    const double t0 = Now();
    StepResult r;
    r.lr = o_.schedule.At(step);
    engine_->BeginStep();
    double loss_sum = 0;
    for (int m = 0; m < A; m++) {
      train_->NextBatch(x_.data(), y_.data());
      engine_->BeginMicroBatch(m, A);
      loss_sum += model_->Forward(*engine_, x_.data(), y_.data(), B, T, 1.0f / A);
      model_->Backward(*engine_);
    }
    r.norm = engine_->Step(r.lr, o_.grad_clip);
    device_.Synchronize();  // the step's time includes the device's queued work
    r.loss = static_cast<float>(comm_.AllReduceScalar(loss_sum / A, ReduceOp::kAvg));
    r.seconds = Now() - t0;
    last_loss_ = r.loss;
    return r;
  }

  // Mean validation loss over val_batches global micro-batches (the same ones every time).
  float Evaluate() {
    const int B = o_.micro_batch, T = o_.seq_len;
    std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
    val_->Reset();
    double sum = 0;
    for (int i = 0; i < o_.val_batches; i++) {
      val_->NextBatch(x.data(), y.data());
      sum += model_->Forward(*engine_, x.data(), y.data(), B, T, 0.0f);
    }
    engine_->ReleaseAll();
    return static_cast<float>(comm_.AllReduceScalar(sum / o_.val_batches, ReduceOp::kAvg));
  }

  // A checkpoint of the current state (no-op without --ckpt-dir).
  Status Save() {
    if (o_.ckpt_dir.empty()) return Status::OK();
    state_.loader_position = train_->state().position;
    return Agree(comm_, SaveCheckpoint(o_.ckpt_dir, state_, *engine_, *layout_, comm_, o_.keep_last, o_.quiet));
  }

  // The step line on stdout and the JSONL record (rank 0; the per-rank figures are collective).
  void Log(int step, const StepResult& r, bool eval_now) {
    const StepReport& report = engine_->last_report();
    const std::vector<uint64_t> per_rank_comm = GatherPerRank(comm_, report.comm.Total().bytes_sent);
    const std::vector<uint64_t> per_rank_state = GatherPerRank(comm_, report.model_state_bytes);
    if (!lead_) return;
    const double tps = tokens_per_step() / r.seconds;
    if (!o_.quiet) {
      std::printf("%sstep %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s\n",
                  isatty(fileno(stdout)) ? ProgressBar(step + 1, o_.steps).c_str() : "", step + 1, o_.steps, r.loss,
                  r.lr, r.norm, r.seconds * 1e3, tps, eval_now ? (" | val " + std::to_string(last_val_)).c_str() : "");
      std::fflush(stdout);
    }
    if (!log_.is_open()) return;
    nlohmann::json j = StepJson(report, *engine_, *layout_, o_.grad_accum);
    j["step"] = step + 1;
    j["loss"] = r.loss;
    j["lr"] = r.lr;
    j["grad_norm"] = r.norm;
    j["tokens"] = state_.tokens;
    j["tokens_per_s"] = tps;
    j["ms"] = r.seconds * 1e3;
    j["comm_bytes_per_rank"] = per_rank_comm;
    j["model_state_bytes_per_rank"] = per_rank_state;
    if (eval_now) j["val_loss"] = last_val_;
    log_ << j.dump() << "\n";
    log_.flush();
  }

  Status Finish() {
    SHARDGPT_RETURN_IF_ERROR(Save());
    if (!o_.save_model.empty()) {
      LocalParams local(*layout_);
      engine_->GatherFullParams(local.params());
      Status st = lead_ ? WriteLlmcModel(o_.save_model, *layout_, local.params()) : Status::OK();
      SHARDGPT_RETURN_IF_ERROR(Agree(comm_, st));
      if (lead_ && !o_.quiet) std::printf("saved model to %s (llm.c format, version 3)\n", o_.save_model.c_str());
    }
    if (lead_) {
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
  std::string resume_path_;
  std::string compute_line_;  // the start-up line saying which precision the matmuls run in
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<DataLoader> train_, val_;
  std::ofstream log_;
  TrainState state_;
  std::vector<int32_t> x_, y_;
  float last_loss_ = 0, last_val_ = NAN;
  bool stopped_ = false;  // a stop signal or --stop-at-step ended the loop (checkpoint written)
};

}  // namespace

Status RunTrain(TrainOptions o, Communicator& comm, Device& device, int* exit_code) {
  Trainer trainer(std::move(o), comm, device);
  return trainer.Run(exit_code);
}

}  // namespace shardgpt
