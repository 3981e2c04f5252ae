// End-to-end training throughput: trains a config for a fixed number of steps on synthetic
// tokens and prints tokens/s (median step), model GFLOP/s (6N + 6LCT FLOPs per token) and,
// with several ranks, the scaling efficiency measured side by side in the same run (the same
// per-rank work on one rank alone, on every rank alone at once, then on N ranks) and where the
// training thread waited for communication (forward, backward, after backward).
//
//   bench_train [--config tiny|small|gpt2|d12|llama|llama-small] [--steps 20] [--zero-stage S] [--shard-layout flat|per-param] [--dtype fp32|bf16]
//               [--compute-dtype fp32|bf16] [--act-dtype auto|fp32|bf16] (default: what `shardgpt train` picks, see --compute-dtype, --act-dtype)
//               [--threads N] [--grad-accum A] [--bucket-mb MiB] [--device cpu|cuda]
//               [--micro-batch B] [--seq-len T] [--peak-tflops P] [--comm auto|mpi|nccl] [--profile 1]
//               [--scaling 0|1] (1: with several ranks, also the single-rank references)
//               [--peak-gbs G] [--roofline 1] [--layers L --heads H --embd C --vocab V]
//               [--recompute none,gelu,block] (any comma list: those modes side by side, see below)
//               [--gelu separate|fused] (fused: the GELU in the fc matmul's epilogue, Kernels::matmul_gelu_forward)
//               [--flight-compare 1] (the flight recorder's cost: steps alternating with it on and off)
// --recompute LIST trains one engine with one model per mode (model/gpt.h), alternating the
// modes step by step so that the machine's load weighs on each alike, and prints each mode's
// median step time (wall, and the process's CPU seconds: less sensitive to other processes on a
// shared machine), its activations and the step's peak, each against the first mode's.
// --profile 1 adds a per-kernel table: where the step's time goes (bench/kernel_profile.h),
// with each kernel's FLOPs and bytes per step and its achieved TFLOP/s or GB/s against the
// peaks (on CUDA: timed by CUDA events on the compute stream, bench/cuda_event_timer.h).
// With --device cuda it also prints model TFLOP/s and MFU against the GPU's dense bf16 peak
// (a table by GPU name below, or --peak-tflops), and peak memory against `plan`'s prediction.
// --roofline 1 runs nothing: it counts one step's kernel calls (bench/roofline.h) and prints
// per kernel FLOPs, bytes and the time at the peaks (default H200: 989 TFLOP/s dense bf16,
// 4800 GB/s), then the predicted step time and tokens/s; activations are counted at the size of
// the activation dtype the run would use (the kernel set's activation_dtype()).
//   mpirun -np 2 bench_train --config tiny --zero-stage 0 --threads 1
// Configs: tiny L4 H4 C256 V256 T256 B8; small L6 H6 C384 V256 T256 B8;
// gpt2 = GPT-2 124M shape L12 H12 C768 V50257 (max T 1024) run at T64 B4; d12 = the same model
// at T1024 B16 (llm.c's GPU setting); --arch llama with an untied head: llama = L12 H12 KV4 C768
// F2048 V50257 T256 B1 (the 124M class: 153M parameters), llama-small = L6 H6 KV2 C384 F1024
// V256 T256 B8. B is per rank. Model GFLOP/s: 6N + 6LCT per token for gpt2 (N = parameters);
// for llama 3 x GPT::ForwardFlops (the matmuls and attention, not the embedding lookup).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "base/passive_wait.h"
#include "bench/kernel_profile.h"
#include "bench/roofline.h"
#ifdef SHARDGPT_HAVE_CUDA
#include "bench/cuda_event_timer.h"
#endif
#include "parallel/memory_model.h"
#include "model/compute_precision.h"
#include "model/device_factory.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_bf16.h"
#include "model/rng.h"
#include "parallel/engine.h"
#include "parallel/comm_factory.h"
#include "parallel/mpi_communicator.h"
#include "parallel/straggler.h"

using namespace shardgpt;

namespace {
// Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by GPU name, from the vendor data sheets.
double PeakBf16Tflops(const std::string& name) {
  struct Row { const char* key; double tflops; };
  const Row table[] = {{"H200", 989}, {"H100 PCIe", 756}, {"H100", 989}, {"H800", 989}, {"A100", 312},
                       {"A800", 312}, {"L40S", 362}, {"A10", 125}, {"L4", 121}, {"V100", 125}};
  for (const Row& r : table)
    if (name.find(r.key) != std::string::npos) return r.tflops;
  return 0;
}
// HBM bandwidth (GB/s) by GPU name, from the vendor data sheets.
double PeakGBs(const std::string& name) {
  struct Row { const char* key; double gbs; };
  const Row table[] = {{"H200", 4800}, {"H100 PCIe", 2000}, {"H100", 3350}, {"A100", 2039}};
  for (const Row& r : table)
    if (name.find(r.key) != std::string::npos) return r.gbs;
  return 0;
}

// Blocks until every rank arrives, without spinning a core (the idle ranks must not slow the
// one measuring alone on a shared machine).
void PassiveBarrier(MPI_Comm comm) {
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Medians over the measured steps (after 2 warm-up steps); step times averaged over ranks.
struct RunResult {
  double median_s = 0, measured_s = 0;
  int measured_steps = 0;
  double forward_wait_s = 0, backward_wait_s = 0, after_backward_wait_s = 0;  // medians
  double state_bytes = 0;
  double peak_tracked_bytes = 0;  // the memory ledger's largest total over the steps
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One engine and model training on synthetic tokens, one step at a time, so that several
// runs can be interleaved step by step (the machine's load then weighs on each alike).
class Runner {
 public:
  Runner(Communicator& comm, const ParamLayout& layout, const EngineOptions& eo, Device& device, int B, int T,
         int accum)
      : comm_(comm), device_(device), B_(B), T_(T), accum_(accum), rng_(42, comm.rank()), x_(B * T), y_(B * T) {
    auto engine_or = Engine::Create(layout, &comm, eo, device);
    if (!engine_or.ok()) { std::fprintf(stderr, "%s\n", engine_or.status().message().c_str()); std::exit(1); }
    engine_ = std::move(engine_or.value());
    engine_->InitOwned(1);
    model_ = std::make_unique<GPT>(layout.config(), B, T, device, &engine_->memory());
  }
  void Step(int s, ProfilingDevice* profiler) {
    const int V = model_->config().vocab_size;
    for (auto& t : x_) t = static_cast<int32_t>(rng_.Next() % V);
    for (auto& t : y_) t = static_cast<int32_t>(rng_.Next() % V);
    comm_.Barrier();
    auto t0 = std::chrono::steady_clock::now();
    engine_->BeginStep();
    for (int m = 0; m < accum_; m++) {
      engine_->BeginMicroBatch(m, accum_);
      model_->Forward(*engine_, x_.data(), y_.data(), B_, T_, 1.0f / accum_);
      model_->Backward(*engine_);
    }
    engine_->Step(1e-4f, 1.0f);
    device_.Synchronize();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (profiler) profiler->profile().Collect();  // CUDA: read the step's event pairs
    res_.peak_tracked_bytes = std::max(res_.peak_tracked_bytes, double(engine_->memory().PeakTotal()));
    dt = comm_.AllReduceScalar(dt, ReduceOp::kAvg);
    const StepReport& r = engine_->last_report();
    if (profiler && s == 1) {  // profile the measured steps only
      profiler->profile().Reset();
      ResetBf16ProductCounts();
    }
    if (s >= 2) {  // skip warm-up
      times_.push_back(dt);
      res_.measured_s += dt;
      fwd_.push_back(comm_.AllReduceScalar(r.forward_wait_s, ReduceOp::kAvg));
      bwd_.push_back(comm_.AllReduceScalar(r.backward_wait_s, ReduceOp::kAvg));
      after_.push_back(comm_.AllReduceScalar(r.after_backward_wait_s, ReduceOp::kAvg));
    }
  }
  RunResult Result() {
    res_.measured_steps = static_cast<int>(times_.size());
    res_.median_s = Median(times_);
    res_.forward_wait_s = Median(fwd_), res_.backward_wait_s = Median(bwd_), res_.after_backward_wait_s = Median(after_);
    res_.state_bytes = static_cast<double>(engine_->memory().StateTotal());
    return res_;
  }

 private:
  Communicator& comm_;
  Device& device_;
  int B_, T_, accum_;
  Rng rng_;
  std::vector<int32_t> x_, y_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GPT> model_;
  std::vector<double> times_, fwd_, bwd_, after_;
  RunResult res_;
};
// /proc/loadavg's first three fields ("" where unreadable): the machine's load during a run.
std::string LoadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "";
  double a = 0, b = 0, c = 0;
  const int n = std::fscanf(f, "%lf %lf %lf", &a, &b, &c);
  std::fclose(f);
  if (n != 3) return "";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %.2f %.2f", a, b, c);
  return buf;
}

// CPU seconds this process has used (all its threads): less sensitive than wall time to other
// processes on a shared machine.
double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// --recompute: one engine, one model per mode, steps alternating between the modes. The
// models are not given the engine's ledger (it would count every mode's activations at once):
// a mode's peak is the ledger's step peak without activations plus that model's activations,
// which is what the ledger measures when that model alone is given it (activations are one
// persistent allocation).
int CompareRecompute(Communicator& comm, const ParamLayout& layout, const EngineOptions& eo, Device& device, int B,
                     int T, int accum, int steps, const std::string& list, const std::string& what) {
  std::vector<Recompute> modes;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    auto m = ParseRecompute(list.substr(at, comma - at));
    if (!m.ok()) { std::fprintf(stderr, "bench_train: %s\n", m.status().message().c_str()); return 1; }
    modes.push_back(m.value());
    at = comma + 1;
  }
  auto engine_or = Engine::Create(layout, &comm, eo, device);
  if (!engine_or.ok()) { std::fprintf(stderr, "%s\n", engine_or.status().message().c_str()); return 1; }
  Engine& engine = *engine_or.value();
  engine.InitOwned(1);
  std::vector<std::unique_ptr<GPT>> models;
  for (Recompute m : modes) models.push_back(std::make_unique<GPT>(layout.config(), B, T, device, nullptr, m));
  const bool lead = comm.rank() == 0;
  const std::string load0 = LoadAverage();
  Rng rng(42, comm.rank());
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  std::vector<std::vector<double>> times(modes.size()), cpu(modes.size());
  std::vector<uint64_t> peak(modes.size(), 0);
  for (int s = 0; s < steps; s++)
    for (size_t k = 0; k < modes.size(); k++) {
      for (auto& t : x) t = static_cast<int32_t>(rng.Next() % layout.config().vocab_size);
      for (auto& t : y) t = static_cast<int32_t>(rng.Next() % layout.config().vocab_size);
      comm.Barrier();
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = ProcessCpuSeconds();
      engine.BeginStep();
      for (int m = 0; m < accum; m++) {
        engine.BeginMicroBatch(m, accum);
        models[k]->Forward(engine, x.data(), y.data(), B, T, 1.0f / accum);
        models[k]->Backward(engine);
      }
      engine.Step(1e-4f, 1.0f);
      device.Synchronize();
      const double dt = comm.AllReduceScalar(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), ReduceOp::kAvg);
      const double dc = comm.AllReduceScalar(ProcessCpuSeconds() - c0, ReduceOp::kAvg);
      if (s >= 1) times[k].push_back(dt), cpu[k].push_back(dc);  // the first round warms up
      peak[k] = std::max<uint64_t>(peak[k], engine.last_report().peak_bytes + models[k]->activation_bytes());
    }
  if (lead) {
    std::printf("%s | recompute side by side, alternating step by step, %d measured step(s) each | load average "
                "%s at the start, %s at the end (/proc/loadavg)\n",
                what.c_str(), steps - 1, load0.c_str(), LoadAverage().c_str());
    std::printf("%-9s %14s %9s %13s %9s %16s %9s %11s %12s\n", "recompute", "median step ms", "vs first",
                "CPU s/step", "vs first", "activations MiB", "vs first", "peak MiB", "extra FLOPs");
    const double t_first = Median(times[0]), c_first = Median(cpu[0]);
    const double a_first = static_cast<double>(models[0]->activation_bytes());
    for (size_t k = 0; k < modes.size(); k++) {
      const double t = Median(times[k]), c = Median(cpu[k]), a = static_cast<double>(models[k]->activation_bytes());
      const double extra = GPT::RecomputeFlops(layout.config(), B, T, modes[k]) /
                           (3 * GPT::ForwardFlops(layout.config(), B, T));
      std::printf("%-9s %14.1f %+8.1f%% %13.2f %+8.1f%% %16.1f %+8.1f%% %11.1f %11.1f%%\n", RecomputeName(modes[k]),
                  t * 1e3, 100 * (t / t_first - 1), c, 100 * (c / c_first - 1), a / 1048576.0, 100 * (a / a_first - 1),
                  peak[k] / 1048576.0, 100 * extra);
    }
  }
  return 0;
}
// --flight-compare 1: the flight recorder's cost. Two engines over two communicators of the
// same ranks, one with a ring (parallel/flight_recorder.h), phase tracking and the trainer's
// straggler accounting (parallel/straggler.h: the window per step, a report every 50), one without;
// steps alternate between them so the machine's load weighs on both alike.
int CompareFlight(Communicator& on, Communicator& off, const ParamLayout& layout, const EngineOptions& eo,
                  Device& device, int B, int T, int accum, int steps, const std::string& what) {
  auto a = Engine::Create(layout, &on, eo, device);
  auto b = Engine::Create(layout, &off, eo, device);
  if (!a.ok() || !b.ok()) { std::fprintf(stderr, "%s\n", (a.ok() ? b.status() : a.status()).message().c_str()); return 1; }
  Engine* engines[2] = {a.value().get(), b.value().get()};
  for (Engine* e : engines) e->InitOwned(1);
  GPT model(layout.config(), B, T, device);
  Rng rng(42, on.rank());
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  std::vector<double> times[2];
  std::vector<double> cpu[2];
  StragglerWindow straggler;
  int timed_on = 0;
  size_t stragglers_named = 0;
  for (int s = 0; s < steps; s++)
    for (int i = 0; i < 2; i++) {
      const int k = (s + i) % 2;  // on first, then off first: no side always runs second
      for (auto& t : x) t = static_cast<int32_t>(rng.Next() % layout.config().vocab_size);
      for (auto& t : y) t = static_cast<int32_t>(rng.Next() % layout.config().vocab_size);
      Communicator& comm = k == 0 ? on : off;
      SetFlightPhases(k == 0);
      comm.Barrier();
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = ProcessCpuSeconds();
      if (k == 0) straggler.BeginStep();
      engines[k]->BeginStep();
      for (int m = 0; m < accum; m++) {
        engines[k]->BeginMicroBatch(m, accum);
        model.Forward(*engines[k], x.data(), y.data(), B, T, 1.0f / accum);
        model.Backward(*engines[k]);
      }
      engines[k]->Step(1e-4f, 1.0f);
      device.Synchronize();
      if (k == 0) {  // the trainer's straggler accounting (--straggler-every 50), inside the step's time
        const StepReport& rep = engines[k]->last_report();
        straggler.EndStep(rep.forward_wait_s, rep.backward_wait_s, rep.after_backward_wait_s);
        if (++timed_on % 50 == 0) {
          const StragglerTimes mine = straggler.Take();
          std::vector<uint64_t> v;
          for (double x : mine.s) v.push_back(static_cast<uint64_t>(x * 1e9));
          v.push_back(static_cast<uint64_t>(mine.steps));
          const std::vector<uint64_t> all = AllGatherU64(comm, v);
          std::vector<StragglerTimes> ranks(all.size() / v.size());
          for (size_t r = 0; r < ranks.size(); r++) {
            for (int f = 0; f < kStragglerFigures; f++) ranks[r].s[f] = all[r * v.size() + f] * 1e-9;
            ranks[r].steps = static_cast<int64_t>(all[r * v.size() + kStragglerFigures]);
          }
          stragglers_named += ScoreStragglers(ranks, 0.7).stragglers.size();
        }
      }
      const double dt = comm.AllReduceScalar(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), ReduceOp::kAvg);
      const double dc = comm.AllReduceScalar(ProcessCpuSeconds() - c0, ReduceOp::kAvg);
      if (s >= 1) times[k].push_back(dt), cpu[k].push_back(dc);  // the first round warms up
    }
  SetFlightPhases(true);
  if (on.rank() == 0) {
    const double t_on = Median(times[0]), t_off = Median(times[1]);
    const FlightRing* ring = on.flight_ring();
    std::printf("%s | flight recorder on and off, alternating step by step, %d measured step(s) each (on: the "
                "rings, the phase clock and the straggler window, a report every 50 steps: %zu named)\n",
                what.c_str(), steps - 1, stragglers_named);
    const double c_on = Median(cpu[0]), c_off = Median(cpu[1]);
    std::printf("flight recorder on : median step %.3f ms, CPU %.3f s/step (%llu collectives on its ring)\n",
                t_on * 1e3, c_on, static_cast<unsigned long long>(ring ? ring->last_seq() : 0));
    std::printf("flight recorder off: median step %.3f ms, CPU %.3f s/step\n", t_off * 1e3, c_off);
    std::printf("overhead: %+.2f%% of the step (wall), %+.2f%% (CPU)\n", 100 * (t_on / t_off - 1),
                100 * (c_on / c_off - 1));
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  EnsurePassiveOpenMPWait(argv);
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  std::string config = "tiny", dtype = "fp32", device_kind = "cpu", comm_kind = "auto", compute_dtype, act_dtype,
              shard_layout = "flat", recompute, gelu = "separate";
  int steps = 20, stage = 0, threads = 2, accum = 1, micro_batch = 0, seq_len = 0, profile = 0, scaling = 1,
      roofline = 0, layers = 0, heads = 0, embd = 0, vocab = 0, flight_compare = 0;
  double bucket_mb = 25.0, peak_tflops = 0, peak_gbs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") config = v;
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--zero-stage") stage = std::stoi(v);
    else if (k == "--shard-layout") shard_layout = v;
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--dtype") dtype = v;
    else if (k == "--compute-dtype") compute_dtype = v;
    else if (k == "--act-dtype") act_dtype = v;
    else if (k == "--grad-accum") accum = std::stoi(v);
    else if (k == "--bucket-mb") bucket_mb = std::stod(v);
    else if (k == "--device") device_kind = v;
    else if (k == "--micro-batch") micro_batch = std::stoi(v);
    else if (k == "--seq-len") seq_len = std::stoi(v);
    else if (k == "--peak-tflops") peak_tflops = std::stod(v);
    else if (k == "--comm") comm_kind = v;
    else if (k == "--profile") profile = std::stoi(v);
    else if (k == "--scaling") scaling = std::stoi(v);
    else if (k == "--roofline") roofline = std::stoi(v);
    else if (k == "--peak-gbs") peak_gbs = std::stod(v);
    else if (k == "--layers") layers = std::stoi(v);
    else if (k == "--heads") heads = std::stoi(v);
    else if (k == "--embd") embd = std::stoi(v);
    else if (k == "--vocab") vocab = std::stoi(v);
    else if (k == "--recompute") recompute = v;
    else if (k == "--gelu") gelu = v;
    else if (k == "--flight-compare") flight_compare = std::stoi(v);
    else { std::fprintf(stderr, "bench_train: unknown option %s\n", k.c_str()); return 1; }
  }
  GPTConfig c;
  int B = 8, T = 256;
  if (config == "tiny") c = GPTConfig{4, 4, 256, 256, 256};
  else if (config == "small") c = GPTConfig{6, 6, 384, 256, 256};
  else if (config == "gpt2") c = GPTConfig{12, 12, 768, 1024, 50257}, B = 4, T = 64;
  else if (config == "d12") c = GPTConfig{12, 12, 768, 1024, 50257}, B = 16, T = 1024;
  else if (config == "llama" || config == "llama-small") {  // --arch llama, untied head (bench/torch_train.py's Llama)
    const bool big = config == "llama";
    c = big ? GPTConfig{12, 12, 768, 256, 50257} : GPTConfig{6, 6, 384, 256, 256};
    c.arch = Arch::kLlama, c.n_kv_head = big ? 4 : 2, c.ffn_hidden = big ? 2048 : 1024, c.tie_embeddings = false;
    B = big ? 1 : 8;
  } else {
    std::fprintf(stderr, "bench_train: unknown --config %s (tiny, small, gpt2, d12, llama, llama-small)\n", config.c_str());
    return 1;
  }
  if (micro_batch > 0) B = micro_batch;
  if (seq_len > 0) T = seq_len;
  // shape overrides (small shapes for scripts/gpu-check.sh --dry under the CUDA emulation)
  if (layers > 0) c.n_layer = layers;
  if (heads > 0) c.n_head = heads;
  if (embd > 0) c.n_embd = embd;
  if (vocab > 0) c.vocab_size = vocab;
  if (gelu != "separate" && gelu != "fused") {
    std::fprintf(stderr, "bench_train: --gelu %s: expected separate or fused\n", gelu.c_str());
    return 1;
  }
  c.max_seq_len = std::max(c.max_seq_len, T);
  if (Status st = c.Validate(); !st.ok()) { std::fprintf(stderr, "bench_train: %s\n", st.message().c_str()); return 1; }
  if (steps < 3 && !roofline) {  // steps 0 and 1 are warm-up; the figures are of the rest
    std::fprintf(stderr, "bench_train: --steps %d: expected at least 3 (the first two are warm-up, not measured)\n",
                 steps);
    return 1;
  }

  if (roofline) {  // count one step on a device that runs nothing (bench/roofline.h)
    const Peaks peaks{(peak_tflops > 0 ? peak_tflops : 989) * 1e12, (peak_gbs > 0 ? peak_gbs : 4800) * 1e9};
    {
      CountingDevice counting;
      ProfilingDevice prof(counting);
      prof.profile().set_peaks(peaks);
      // the activations a GPU run of this --dtype keeps (plan's rule: bf16 with --dtype bf16)
      auto act = PlannedActivationDType(act_dtype, dtype == "bf16" ? DType::kBF16 : DType::kF32);
      if (!act.ok()) { std::fprintf(stderr, "bench_train: %s\n", act.status().message().c_str()); return 1; }
      prof.kernels().set_activation_dtype(act.value());
      prof.kernels().set_gelu_fused(gelu == "fused");
      auto self = MpiCommunicator::Create(MPI_COMM_SELF);
      if (!self.ok()) { std::fprintf(stderr, "%s\n", self.status().message().c_str()); return 1; }
      ParamLayout layout(c);
      EngineOptions eo;
      eo.zero_stage = 0;
      eo.dtype = eo.reduce_dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
      eo.act_dtype = act.value();
      Runner run(*self.value(), layout, eo, prof, B, T, accum);
      prof.profile().Reset();
      run.Step(0, nullptr);
      const double tokens = double(B) * T * accum, N = double(layout.total_numel());
      std::printf("roofline (nothing run): config=%s dtype=%s gelu=%s B=%d T=%d A=%d params=%.2fM, one rank, activations "
                  "counted at %g bytes/element, peaks %.0f TFLOP/s dense and %.0f GB/s\n",
                  config.c_str(), dtype.c_str(), gelu.c_str(), B, T, accum, N / 1e6, double(DTypeSize(prof.profile().activation_dtype())), peaks.flops / 1e12,
                  peaks.bytes_per_s / 1e9);
      PrintRoofline(prof.profile(), peaks, tokens,
                    tokens * (c.llama() ? 3 * GPT::ForwardFlops(c, 1, T) / T : 6 * N + 6.0 * c.n_layer * c.n_embd * T));
    }
    MPI_Finalize();
    return 0;
  }

  SetComputeThreads(threads);
  int local_rank = 0, local_size = 1;
  {
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank), MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
  }
  auto device_or = CreateDevice(device_kind, local_rank, local_size);
  if (!device_or.ok()) { std::fprintf(stderr, "bench_train: %s\n", device_or.status().message().c_str()); MPI_Finalize(); return 1; }
  // --profile 1: time every kernel call (bench/kernel_profile.h); the step times then include
  // the timing overhead (two clock reads per kernel)
  std::unique_ptr<ProfilingDevice> profiler;
  if (profile) profiler = std::make_unique<ProfilingDevice>(*device_or.value());
  Device& device = profiler ? static_cast<Device&>(*profiler) : *device_or.value();
  // the precision shardgpt train would choose (model/compute_precision.h)
  const ComputeChoice compute = ChooseComputePrecision(dtype == "bf16" ? DType::kBF16 : DType::kF32, compute_dtype,
                                                       DetectComputeFacts(device.is_cuda()));
  device.kernels().set_matmul_precision(compute.precision);
  auto act = ChooseActivationDType(act_dtype, compute.precision, device.is_cuda());
  if (!act.ok()) { std::fprintf(stderr, "bench_train: %s\n", act.status().message().c_str()); MPI_Finalize(); return 1; }
  device.kernels().set_activation_dtype(act.value().dtype);
  device.kernels().set_gelu_fused(gelu == "fused");
  if (peak_tflops <= 0) peak_tflops = PeakBf16Tflops(device.name());
  if (peak_gbs <= 0) peak_gbs = PeakGBs(device.name());
#ifdef SHARDGPT_HAVE_CUDA
  std::unique_ptr<CudaEventTimer> timer;  // CUDA: kernels timed by events on the compute stream
  if (profiler && device.is_cuda()) {
    timer = std::make_unique<CudaEventTimer>(*device_or.value());
    profiler->profile().set_timer(timer.get());
  }
#endif
  if (profiler) profiler->profile().set_peaks(Peaks{peak_tflops * 1e12, peak_gbs * 1e9});
  CommOptions comm_options;
  comm_options.kind = comm_kind;
  auto comm_or = CreateCommunicator(comm_options, MPI_COMM_WORLD, *device_or.value(), local_size, VisibleGpuCount());
  if (!comm_or.ok()) { std::fprintf(stderr, "%s\n", comm_or.status().message().c_str()); return 1; }
  {
  Communicator& comm = *comm_or.value();
  ParamLayout layout(c);
  EngineOptions eo;
  eo.zero_stage = stage;
  eo.bucket_mb = bucket_mb;
  auto layout_or = ParseShardLayout(shard_layout);
  if (!layout_or.ok()) { std::fprintf(stderr, "%s\n", layout_or.status().message().c_str()); return 1; }
  eo.shard_layout = layout_or.value();
  eo.dtype = eo.reduce_dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  eo.act_dtype = device.kernels().activation_dtype();  // what the models below allocate
  if (flight_compare) {
    char what[256];
    std::snprintf(what, sizeof(what), "config=%s device=%s ranks=%d stage=%d dtype=%s threads/rank=%d B=%d T=%d A=%d",
                  config.c_str(), device.name().c_str(), comm.world_size(), stage, dtype.c_str(), threads, B, T, accum);
    SetFlightCapacity(0);  // the second communicator: no ring
    auto off = CreateCommunicator(comm_options, MPI_COMM_WORLD, *device_or.value(), local_size, VisibleGpuCount());
    SetFlightCapacity(2000);
    if (!off.ok()) { std::fprintf(stderr, "%s\n", off.status().message().c_str()); return 1; }
    const int rc = CompareFlight(comm, *off.value(), layout, eo, device, B, T, accum, steps, what);
    off.value().reset();
    comm_or.value().reset();
    device_or.value().reset();
    MPI_Finalize();
    return rc;
  }
  if (!recompute.empty()) {
    char what[256];
    std::snprintf(what, sizeof(what), "config=%s device=%s ranks=%d stage=%d dtype=%s threads/rank=%d B=%d T=%d A=%d",
                  config.c_str(), device.name().c_str(), comm.world_size(), stage, dtype.c_str(), threads, B, T, accum);
    const int rc = CompareRecompute(comm, layout, eo, device, B, T, accum, steps, recompute, what);
    comm_or.value().reset();
    device_or.value().reset();
    MPI_Finalize();
    return rc;
  }
  const bool lead = comm.rank() == 0, multi = comm.world_size() > 1;
  // Scaling efficiency, measured side by side in this run: the same per-rank work (B, T, A,
  // threads) on one rank alone (rank 0; the others wait without spinning), with every rank
  // training alone at once (the same contention for cores and memory, no communication), and
  // on all N ranks, interleaved step by step. Efficiency = step(1 rank alone) / step(N ranks).
  // --scaling 0 skips the references (they hold two more model copies); --profile times the
  // N-rank run only.
  if (profile) scaling = 0;
  std::unique_ptr<Communicator> self;
  std::unique_ptr<Runner> alone, concurrent;
  if (multi && scaling) {
    auto self_or = CreateCommunicator(comm_options, MPI_COMM_SELF, *device_or.value(), 1, VisibleGpuCount());
    if (!self_or.ok()) { std::fprintf(stderr, "%s\n", self_or.status().message().c_str()); return 1; }
    self = std::move(self_or.value());
    if (lead) alone = std::make_unique<Runner>(*self, layout, eo, device, B, T, accum);
    concurrent = std::make_unique<Runner>(*self, layout, eo, device, B, T, accum);
  }
  Runner main_run(comm, layout, eo, device, B, T, accum);
  if (profiler) profiler->profile().Reset();
  for (int s = 0; s < steps; s++) {  // interleaved step by step: alone, all alone at once, N ranks
    if (concurrent) {
      if (alone) alone->Step(s, nullptr);
      PassiveBarrier(MPI_COMM_WORLD);
      concurrent->Step(s, nullptr);
      PassiveBarrier(MPI_COMM_WORLD);
      if (profiler && s == 1) profiler->profile().Reset();
    }
    main_run.Step(s, profiler.get());
  }
  const RunResult run = main_run.Result();
  RunResult alone_r, concurrent_r;
  if (alone) alone_r = alone->Result();
  if (concurrent) concurrent_r = concurrent->Result();
  const double med = run.median_s;
  const double tokens = static_cast<double>(B) * T * accum * comm.world_size();
  const double N = static_cast<double>(layout.total_numel());
  const double flops_per_token = c.llama() ? 3 * GPT::ForwardFlops(c, 1, T) / T : 6 * N + 6.0 * c.n_layer * c.n_embd * T;
  if (lead) {
    const double tflops = tokens * flops_per_token / med / 1e12;
    std::printf("config=%s device=%s ranks=%d stage=%d layout=%s dtype=%s compute=%s gelu=%s threads/rank=%d B=%d T=%d A=%d params=%.2fM | "
                "median step %.1f ms | %.0f tokens/s | %.1f GFLOP/s",
                config.c_str(), device.name().c_str(), comm.world_size(), stage, shard_layout.c_str(), dtype.c_str(),
                compute.precision == MatmulPrecision::kBf16 ? "bf16" : "fp32", gelu.c_str(), threads, B, T, accum,
                N / 1e6, med * 1e3, tokens / med, tflops * 1e3);
    if (device.is_cuda()) {
      std::printf(" | %.1f TFLOP/s", tflops / comm.world_size());
      if (peak_tflops > 0) std::printf(" | MFU %.1f%% of %.0f TFLOP/s bf16 peak", 100 * tflops / comm.world_size() / peak_tflops, peak_tflops);
      std::printf(" | model state %.3f GiB/rank (formula %.3f GiB)", run.state_bytes / 1073741824.0,
                  Formula::ModelStateBytes(N, comm.world_size(), eo) / 1073741824.0);
      const MemoryPrediction pred = PredictPeakMemory(layout, ShardPlan(layout, comm.world_size()), eo, B, T, accum);
      std::printf(" | peak memory %.3f GiB tracked (plan predicts %.3f GiB)", run.peak_tracked_bytes / 1073741824.0,
                  pred.peak() / 1073741824.0);
#ifdef SHARDGPT_HAVE_CUDA
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        std::printf(", %.3f GiB in use on the device (cudaMemGetInfo: CUDA context, cuBLAS workspace and the "
                    "allocator's cache included)", (total_b - free_b) / 1073741824.0);
#endif
    }
    std::printf("\n");
#ifdef SHARDGPT_HAVE_CUDA
    if (gelu == "fused" && device.is_cuda())  // did the real cuBLASLt have the GELU epilogues?
      std::printf("gelu fused: %llu of %d calls ran the GELU in cuBLASLt's epilogue (the rest: fp32 result + the "
                  "element-wise kernel)\n",
                  (unsigned long long)CudaGeluEpilogueCalls(*device_or.value()), 2 * c.n_layer * accum * steps);
#endif
    if (concurrent) {
      std::printf("scaling: 1 rank alone %.1f ms/step, every rank alone at once %.1f ms, %d ranks %.1f ms | "
                  "scaling efficiency %.0f%% (1 rank alone / %d ranks; %.0f%% against every rank alone at once)\n",
                  alone_r.median_s * 1e3, concurrent_r.median_s * 1e3, comm.world_size(), med * 1e3,
                  100 * alone_r.median_s / med, comm.world_size(), 100 * concurrent_r.median_s / med);
    }
    if (multi) {
      std::printf("training thread waiting for communication (median step, mean over ranks): forward %.1f ms, "
                  "backward %.1f ms, after backward %.1f ms",
                  run.forward_wait_s * 1e3, run.backward_wait_s * 1e3, run.after_backward_wait_s * 1e3);
      if (stage == 0) {
        const auto buckets = PlanBuckets(ShardPlan(layout, comm.world_size()), eo);
        ShardPlan plan(layout, comm.world_size());
        double first = 0;
        for (int u : buckets.front()) first += plan.unit(u).padded * DTypeSize(eo.reduce_dtype);
        std::printf(" | %zu buckets, the first %.2f MiB", buckets.size(), first / 1048576.0);
      }
      std::printf("\n");
    }
    if (profiler) {
      std::printf("per-kernel time (rank 0, mean of %d steps of %.1f ms):\n", run.measured_steps,
                  1e3 * run.measured_s / run.measured_steps);
      std::printf("peaks: %.0f TFLOP/s dense bf16, %.0f GB/s memory (0: unknown; --peak-tflops, --peak-gbs); "
                  "%%peak: TFLOP/s for kernels with FLOPs, GB/s for the rest\n", peak_tflops, peak_gbs);
      PrintProfile(profiler->profile(), run.measured_steps, run.measured_s / run.measured_steps,
                   Peaks{peak_tflops * 1e12, peak_gbs * 1e9});
      if (!device.is_cuda() && compute.precision == MatmulPrecision::kBf16) {
        const Bf16ProductCounts n = GetBf16ProductCounts();
        std::printf("bf16 products per step (%s): %.0f oneDNN primitive calls (%.0f of them attention's batched "
                    "products; their time is in the attention rows), %.0f AVX512-BF16 tile-kernel calls; weights "
                    "converted to bf16 %.0f times, reused %.0f times, read from the stored bf16 parameters %.0f times\n",
                    Bf16GemmName(CurrentBf16Gemm()), double(n.onednn_calls) / run.measured_steps,
                    double(n.attention_calls) / run.measured_steps,
                    double(n.dot_kernel_calls) / run.measured_steps, double(n.weight_conversions) / run.measured_steps,
                    double(n.weight_reuses) / run.measured_steps, double(n.weights_from_stored) / run.measured_steps);
      }
      if (!device.is_cuda() && compute.precision == MatmulPrecision::kExact)
        std::printf("fp32 attention: forward %s, backward %s (Fp32Attention, model/kernels_cpu.h; head size %d)\n",
                    Fp32AttentionName(Fp32AttentionFor(T, c.n_embd, c.n_head, false)),
                    Fp32AttentionName(Fp32AttentionFor(T, c.n_embd, c.n_head, true)),
                    c.n_embd / c.n_head);
    }
  }
  }
  comm_or.value().reset();
  device_or.value().reset();
  MPI_Finalize();
  return 0;
}
