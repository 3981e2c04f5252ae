// End-to-end training throughput: trains a config for a fixed number of steps on synthetic
// tokens and prints tokens/s (median step), model GFLOP/s (6N + 6LCT FLOPs per token) and,
// with several ranks, how much of the communication was hidden behind backward.
//
//   bench_train [--config tiny|small|gpt2|d12] [--steps 20] [--zero-stage S] [--shard-layout flat|per-param] [--dtype fp32|bf16]
//               [--compute-dtype fp32|bf16] (default: what `shardgpt train` picks, see --compute-dtype)
//               [--threads N] [--grad-accum A] [--bucket-mb MiB] [--device cpu|cuda]
//               [--micro-batch B] [--seq-len T] [--peak-tflops P] [--comm auto|mpi|nccl] [--profile 1]
// --profile 1 adds a per-kernel table: where the step's time goes (bench/kernel_profile.h).
// With --device cuda it also prints model TFLOP/s and MFU against the GPU's dense bf16 peak
// (a table by GPU name below, or --peak-tflops).
//   mpirun -np 2 bench_train --config tiny --zero-stage 0 --threads 1
// Configs (the issue's): tiny L4 H4 C256 V256 T256 B8; small L6 H6 C384 V256 T256 B8;
// gpt2 = GPT-2 124M shape L12 H12 C768 V50257 (max T 1024) run at T64 B4; d12 = the same model
// at T1024 B16 (llm.c's GPU setting). B is per rank.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/passive_wait.h"
#include "bench/kernel_profile.h"
#include "model/compute_precision.h"
#include "model/device_factory.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/rng.h"
#include "parallel/engine.h"
#include "parallel/comm_factory.h"
#include "parallel/mpi_communicator.h"

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
}  // namespace

int main(int argc, char** argv) {
  EnsurePassiveOpenMPWait(argv);
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  std::string config = "tiny", dtype = "fp32", device_kind = "cpu", comm_kind = "auto", compute_dtype,
              shard_layout = "flat";
  int steps = 20, stage = 0, threads = 2, accum = 1, micro_batch = 0, seq_len = 0, profile = 0;
  double bucket_mb = 25.0, peak_tflops = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") config = v;
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--zero-stage") stage = std::stoi(v);
    else if (k == "--shard-layout") shard_layout = v;
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--dtype") dtype = v;
    else if (k == "--compute-dtype") compute_dtype = v;
    else if (k == "--grad-accum") accum = std::stoi(v);
    else if (k == "--bucket-mb") bucket_mb = std::stod(v);
    else if (k == "--device") device_kind = v;
    else if (k == "--micro-batch") micro_batch = std::stoi(v);
    else if (k == "--seq-len") seq_len = std::stoi(v);
    else if (k == "--peak-tflops") peak_tflops = std::stod(v);
    else if (k == "--comm") comm_kind = v;
    else if (k == "--profile") profile = std::stoi(v);
  }
  GPTConfig c;
  int B = 8, T = 256;
  if (config == "tiny") c = GPTConfig{4, 4, 256, 256, 256};
  else if (config == "small") c = GPTConfig{6, 6, 384, 256, 256};
  else if (config == "gpt2") c = GPTConfig{12, 12, 768, 1024, 50257}, B = 4, T = 64;
  else if (config == "d12") c = GPTConfig{12, 12, 768, 1024, 50257}, B = 16, T = 1024;
  else { std::fprintf(stderr, "bench_train: unknown --config %s (tiny, small, gpt2, d12)\n", config.c_str()); return 1; }
  if (micro_batch > 0) B = micro_batch;
  if (seq_len > 0) T = seq_len;

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
  if (peak_tflops <= 0) peak_tflops = PeakBf16Tflops(device.name());
  CommOptions comm_options;
  comm_options.kind = comm_kind;
  auto comm_or = CreateCommunicator(comm_options, MPI_COMM_WORLD, device, local_size, VisibleGpuCount());
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
  auto engine_or = Engine::Create(layout, &comm, eo, device);
  if (!engine_or.ok()) { std::fprintf(stderr, "%s\n", engine_or.status().message().c_str()); return 1; }
  Engine& engine = *engine_or.value();
  std::vector<float> full(layout.total_numel());
  InitParameters(layout, 1, full.data());
  engine.LoadFullParams(full.data());
  full.clear(), full.shrink_to_fit();
  GPT model(c, B, T, device);
  Rng rng(42, comm.rank());
  std::vector<int32_t> x(B * T), y(B * T);
  std::vector<double> times, hidden;
  double measured_seconds = 0;
  for (int s = 0; s < steps; s++) {
    for (auto& t : x) t = static_cast<int32_t>(rng.Next() % c.vocab_size);
    for (auto& t : y) t = static_cast<int32_t>(rng.Next() % c.vocab_size);
    comm.Barrier();
    auto t0 = std::chrono::steady_clock::now();
    engine.BeginStep();
    for (int m = 0; m < accum; m++) {
      engine.BeginMicroBatch(m, accum);
      model.Forward(engine, x.data(), y.data(), B, T, 1.0f / accum);
      model.Backward(engine);
    }
    engine.Step(1e-4f, 1.0f);
    device.Synchronize();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    dt = comm.AllReduceScalar(dt, ReduceOp::kAvg);
    const StepReport& r = engine.last_report();
    if (profiler && s == 1) profiler->profile().Reset();  // profile the measured steps only
    if (s >= 2) {  // skip warm-up
      times.push_back(dt);
      measured_seconds += dt;
      // share of this step's communication time that the training thread did not wait for
      // after backward, averaged over ranks
      double h = r.comm_busy_s > 0 ? std::max(0.0, 1.0 - r.backward_exposed_s / r.comm_busy_s) : 0.0;
      hidden.push_back(comm.AllReduceScalar(h, ReduceOp::kAvg));
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(hidden.begin(), hidden.end());
  const double med = times[times.size() / 2];
  const double tokens = static_cast<double>(B) * T * accum * comm.world_size();
  const double N = static_cast<double>(layout.total_numel());
  const double flops_per_token = 6 * N + 6.0 * c.n_layer * c.n_embd * T;
  if (comm.rank() == 0) {
    const double tflops = tokens * flops_per_token / med / 1e12;
    std::printf("config=%s device=%s ranks=%d stage=%d layout=%s dtype=%s compute=%s threads/rank=%d B=%d T=%d A=%d params=%.2fM | "
                "median step %.1f ms | %.0f tokens/s | %.1f GFLOP/s",
                config.c_str(), device.name().c_str(), comm.world_size(), stage, shard_layout.c_str(), dtype.c_str(),
                compute.precision == MatmulPrecision::kBf16 ? "bf16" : "fp32", threads, B, T, accum,
                N / 1e6, med * 1e3, tokens / med, tflops * 1e3);
    if (device.is_cuda()) {
      std::printf(" | %.1f TFLOP/s", tflops / comm.world_size());
      if (peak_tflops > 0) std::printf(" | MFU %.1f%% of %.0f TFLOP/s bf16 peak", 100 * tflops / comm.world_size() / peak_tflops, peak_tflops);
      std::printf(" | model state %.3f GiB/rank (formula %.3f GiB)", engine.memory().Total() / 1073741824.0,
                  Formula::ModelStateBytes(N, comm.world_size(), eo) / 1073741824.0);
    }
    if (!hidden.empty() && comm.world_size() > 1) std::printf(" | comm hidden behind backward %.0f%%", 100 * hidden[hidden.size() / 2]);
    std::printf("\n");
    if (profiler) {
      std::printf("per-kernel time (rank 0, mean of %zu steps of %.1f ms):\n", times.size(),
                  1e3 * measured_seconds / times.size());
      PrintProfile(profiler->profile(), static_cast<int>(times.size()), measured_seconds / times.size());
    }
  }
  }
  comm_or.value().reset();
  device_or.value().reset();
  MPI_Finalize();
  return 0;
}
