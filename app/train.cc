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

// Mean validation loss over val_batches global micro-batches (the same ones every time).
float Evaluate(GPT& model, Engine& engine, DataLoader& val, int batches, int B, int T) {
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  val.Reset();
  double sum = 0;
  for (int i = 0; i < batches; i++) {
    val.NextBatch(x.data(), y.data());
    sum += model.Forward(engine, x.data(), y.data(), B, T, 0.0f);
  }
  engine.ReleaseAll();
  return static_cast<float>(engine.comm().AllReduceScalar(sum / batches, ReduceOp::kAvg));
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

}  // namespace

Status RunTrain(TrainOptions o, Communicator& comm, Device& device, int* exit_code) {
  *exit_code = 0;
  const int rank = comm.rank(), world = comm.world_size();
  const bool lead = rank == 0;
  SetComputeThreads(o.threads);

  // ---- setup: model, resume point, batch geometry ----
  std::unique_ptr<LlmcModel> init;
  std::string resume_path;
  SHARDGPT_RETURN_IF_ERROR(ResolveModelAndResume(o, comm, &init, &resume_path));
  SHARDGPT_RETURN_IF_ERROR(ValidateLoopOptions(o, world));
  // bf16 runs round matmul inputs to bf16 where the device has fast bf16 matmuls (tensor cores)
  device.kernels().set_matmul_precision(o.engine.dtype == DType::kBF16 && device.is_cuda() ? MatmulPrecision::kBf16
                                                                                            : MatmulPrecision::kExact);

  // ---- setup: engine and activations on the device (out of memory: one agreed error) ----
  ParamLayout layout(o.model);
  const int B = o.micro_batch, T = o.seq_len, A = o.grad_accum;
  std::unique_ptr<Engine> engine_ptr;
  std::unique_ptr<GPT> model_ptr;
  Status alloc = [&]() -> Status {
    try {
      auto engine_or = Engine::Create(layout, &comm, o.engine, device);
      if (!engine_or.ok()) return engine_or.status();
      engine_ptr = std::move(engine_or.value());
      model_ptr = std::make_unique<GPT>(o.model, B, T, device);
    } catch (const DeviceOutOfMemory& e) {
      return Status::Internal(std::string(e.what()));
    }
    return Status::OK();
  }();
  SHARDGPT_RETURN_IF_ERROR(Agree(comm, alloc));
  Engine& engine = *engine_ptr;
  GPT& model = *model_ptr;
  {
    std::vector<float> full(layout.total_numel());
    if (init)
      full = std::move(init->params);
    else
      InitParameters(layout, o.seed, full.data());
    engine.LoadFullParams(full.data());
  }

  // ---- setup: data, outputs ----
  DataLoaderOptions dopt{o.data, B, T, o.seed, o.shuffle, rank, world, o.model.vocab_size};
  auto train_or = DataLoader::Open(dopt);
  SHARDGPT_RETURN_IF_ERROR(Agree(comm, train_or.status()));
  DataLoader& train = train_or.value();
  std::unique_ptr<DataLoader> val;
  if (!o.val_data.empty()) {
    DataLoaderOptions vopt{o.val_data, B, T, o.seed, false, rank, world, o.model.vocab_size};
    auto v = DataLoader::Open(vopt);
    SHARDGPT_RETURN_IF_ERROR(Agree(comm, v.status()));
    val = std::make_unique<DataLoader>(std::move(v.value()));
    o.val_batches = static_cast<int>(std::min<uint64_t>(o.val_batches, val->num_samples() / (uint64_t(B) * world)));
  }
  if (!o.save_model.empty()) {  // fail now, not after training
    const std::string dir = o.save_model.find('/') == std::string::npos ? "." : o.save_model.substr(0, o.save_model.rfind('/') + 1);
    if (access(dir.c_str(), W_OK) != 0)
      return Status::InvalidArgument("--save-model " + o.save_model + ": directory " + dir + " is not writable or does not exist");
  }
  std::ofstream log;
  if (lead && !o.log_file.empty()) {
    log.open(o.log_file);
    if (!log) return Agree(comm, Status::IOError(o.log_file + ": cannot open the --log file for writing"));
  }
  SHARDGPT_RETURN_IF_ERROR(Agree(comm, Status::OK()));

  // ---- resume ----
  TrainState state;
  state.seed = o.seed;
  if (!resume_path.empty()) {
    auto loaded = LoadCheckpoint(resume_path, o.ckpt_dir, engine, layout, comm, o.quiet);
    SHARDGPT_RETURN_IF_ERROR(Agree(comm, loaded.status()));
    state = loaded.value();
    train.Restore(LoaderState{state.loader_position});
    if (lead && !o.quiet)
      std::printf("resumed from %s at step %lld (%lld tokens seen)\n", resume_path.c_str(),
                  static_cast<long long>(state.step), static_cast<long long>(state.tokens));
  }
  auto save = [&]() -> Status {
    state.loader_position = train.state().position;
    return SaveCheckpoint(o.ckpt_dir, state, engine, layout, comm, o.keep_last, o.quiet);
  };

  const double psi = static_cast<double>(layout.total_numel());
  const std::vector<uint64_t> state_per_rank = GatherPerRank(comm, engine.memory().Total());
  if (lead && !o.quiet) {
    std::printf("shardgpt: model %s, %.2fM parameters, %d rank(s), zero stage %d, %s, B=%d T=%d grad-accum=%d "
                "(%lld tokens/step), device %s, %d thread(s)/rank\n",
                o.model.ToString().c_str(), psi / 1e6, world, o.engine.zero_stage, DTypeName(o.engine.dtype), B, T, A,
                static_cast<long long>(B) * T * A * world, device.name().c_str(), ComputeThreads());
    PrintStartupReport(engine, layout, A, state_per_rank);
  }

  // ---- loop ----
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  const long long tokens_per_step = static_cast<long long>(B) * T * A * world;
  const bool tty = isatty(fileno(stdout));
  float last_loss = 0, last_val = NAN;
  for (int step = static_cast<int>(state.step); step < o.steps; step++) {
    // a stop signal on any rank: every rank checkpoints at this step boundary and stops
    if (o.stop_at_step > 0 && step == o.stop_at_step) {
      if (!o.ckpt_dir.empty()) SHARDGPT_RETURN_IF_ERROR(Agree(comm, save()));
      if (lead && !o.quiet) std::printf("stopped at step %d (--stop-at-step)\n", step);
      return Status::OK();
    }
    if (!comm.AllTrue(g_stop_signal == 0)) {
      if (lead) std::printf("stop signal received: checkpointing at step %d and exiting (status %d)\n", step, kExitSignalled);
      if (!o.ckpt_dir.empty()) SHARDGPT_RETURN_IF_ERROR(Agree(comm, save()));
      *exit_code = kExitSignalled;
      return Status::OK();
    }
    const double t0 = Now();
    const float lr = o.schedule.At(step);
    engine.BeginStep();
    double loss_sum = 0;
    for (int m = 0; m < A; m++) {
      train.NextBatch(x.data(), y.data());
      engine.BeginMicroBatch(m, A);
      loss_sum += model.Forward(engine, x.data(), y.data(), B, T, 1.0f / A);
      model.Backward(engine);
    }
    const float norm = engine.Step(lr, o.grad_clip);
    device.Synchronize();  // the step's time includes the device's queued work
    const StepReport report = engine.last_report();
    const float loss = static_cast<float>(comm.AllReduceScalar(loss_sum / A, ReduceOp::kAvg));
    const double dt = Now() - t0;
    last_loss = loss;
    state.step = step + 1;
    state.tokens += tokens_per_step;
    if (o.ckpt_every > 0 && state.step % o.ckpt_every == 0 && state.step < o.steps)
      SHARDGPT_RETURN_IF_ERROR(Agree(comm, save()));
    const bool eval_now = val && ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step + 1 == o.steps);
    if (eval_now) last_val = Evaluate(model, engine, *val, o.val_batches, B, T);
    const std::vector<uint64_t> per_rank_comm = GatherPerRank(comm, report.comm.Total().bytes_sent);
    const std::vector<uint64_t> per_rank_state = GatherPerRank(comm, report.model_state_bytes);
    if (!lead) continue;
    const double tps = tokens_per_step / dt;
    if (!o.quiet) {
      std::printf("%sstep %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s\n",
                  tty ? ProgressBar(step + 1, o.steps).c_str() : "", step + 1, o.steps, loss, lr, norm, dt * 1e3, tps,
                  eval_now ? (" | val " + std::to_string(last_val)).c_str() : "");
      std::fflush(stdout);
    }
    if (log.is_open()) {
      nlohmann::json j = StepJson(report, engine, layout, A);
      j["step"] = step + 1;
      j["loss"] = loss;
      j["lr"] = lr;
      j["grad_norm"] = norm;
      j["tokens"] = state.tokens;
      j["tokens_per_s"] = tps;
      j["ms"] = dt * 1e3;
      j["comm_bytes_per_rank"] = per_rank_comm;
      j["model_state_bytes_per_rank"] = per_rank_state;
      if (eval_now) j["val_loss"] = last_val;
      log << j.dump() << "\n";
      log.flush();
    }
  }

  // ---- outputs ----
  if (!o.ckpt_dir.empty()) SHARDGPT_RETURN_IF_ERROR(Agree(comm, save()));
  if (!o.save_model.empty()) {
    LocalParams local(layout);
    engine.GatherFullParams(local.params());
    Status st = lead ? WriteLlmcModel(o.save_model, layout, local.params()) : Status::OK();
    SHARDGPT_RETURN_IF_ERROR(Agree(comm, st));
    if (lead && !o.quiet) std::printf("saved model to %s (llm.c format, version 3)\n", o.save_model.c_str());
  }
  if (lead) {
    std::printf("final train loss %.4f", last_loss);
    if (!std::isnan(last_val)) std::printf(" | val loss %.4f", last_val);
    std::printf("\n");
  }
  if (o.sample_tokens > 0) {
    std::string text = Sample(layout, engine, o);
    if (lead) std::printf("---- sample (%d tokens) ----\n%s%s\n----\n", o.sample_tokens, o.sample_prompt.c_str(), text.c_str());
  }
  std::fflush(stdout);
  return Status::OK();
}

}  // namespace shardgpt
