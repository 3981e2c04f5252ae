// Benchmarks of the CPU kernels (model/kernels_cpu.h).
//
//   build-*/bench/bench_kernels [--benchmark_filter=...]
//
// Threads: SHARDGPT_THREADS (default 2) for both OpenMP and OpenBLAS. GFLOP/s counters count the
// useful flops: 2*N*C*OC for a matmul forward, twice that for its backward; attention counts
// the causal half of each T x T product (forward 2 products, backward 5 with the recomputed
// scores), i.e. what a perfect causal kernel would do.
//
// BM_Block* run a whole transformer block (the trainer's tiny GPT: B8 T256 C256 NH4) so that the
// cost of the non-matmul kernels and of switching between OpenMP and OpenBLAS thread pools shows
// up; BM_*After* time an OpenMP kernel right after an sgemm and vice versa (compare with the
// isolated benchmarks; try OMP_WAIT_POLICY=passive / GOMP_SPINCOUNT / OPENBLAS_THREAD_TIMEOUT).
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "base/bf16.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_bf16.h"
#include "tests/common/random_data.h"

namespace shardgpt {
namespace {

void SetGflops(benchmark::State& st, double flops) {
  st.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
void SetGbytes(benchmark::State& st, double bytes) {
  st.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- matmul ---------------------------------------------------------------------------------

void BM_MatmulForward(benchmark::State& st) {
  const int N = st.range(0), C = st.range(1), OC = st.range(2);
  auto inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), b = RandomFloats(OC, 3);
  std::vector<float> out((size_t)N * OC);
  for (auto _ : st) {
    matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    benchmark::DoNotOptimize(out.data());
  }
  SetGflops(st, 2.0 * N * C * OC);
}

void BM_MatmulBackward(benchmark::State& st) {
  const int N = st.range(0), C = st.range(1), OC = st.range(2);
  auto inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), dout = RandomFloats((size_t)N * OC, 3);
  std::vector<float> dinp((size_t)N * C, 0.0f), dw((size_t)OC * C, 0.0f), db(OC, 0.0f);
  for (auto _ : st) {
    matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
    benchmark::DoNotOptimize(dw.data());
  }
  SetGflops(st, 4.0 * N * C * OC);
}

#define MATMUL_SHAPES Args({2048, 256, 768})->Args({2048, 256, 256})->Args({2048, 256, 1024})->Args({2048, 1024, 256}) \
  ->Args({2048, 384, 1536})->Args({256, 768, 50304})->ArgNames({"N", "C", "OC"})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_MatmulForward)->MATMUL_SHAPES;
BENCHMARK(BM_MatmulBackward)->MATMUL_SHAPES;

// ---- attention --------------------------------------------------------------------------------

struct AttnData {
  int B, T, C, NH;
  std::vector<float> qkv, out, lse, dout, dqkv;
  AttnData(int B_, int T_, int C_, int NH_) : B(B_), T(T_), C(C_), NH(NH_) {
    qkv = RandomFloats((size_t)B * T * 3 * C, 1);
    out.resize((size_t)B * T * C);
    lse.resize((size_t)B * NH * T);
    dout = RandomFloats((size_t)B * T * C, 2);
    dqkv.assign(qkv.size(), 0.0f);
  }
  double causal_product_flops() const { return 2.0 * B * NH * (T * (T + 1) / 2.0) * (C / NH); }
};

// tiled: which fp32 attention runs (Fp32Attention: 1 our register tiles, 0 OpenBLAS sgemm row
// blocks), side by side in one run; restored after the benchmark.
struct Fp32AttentionScope {
  const Fp32Attention saved = CurrentFp32Attention();
  explicit Fp32AttentionScope(int64_t tiled) { SetFp32Attention(tiled ? Fp32Attention::kTiled : Fp32Attention::kSgemm); }
  ~Fp32AttentionScope() { SetFp32Attention(saved); }
};

void BM_AttentionForward(benchmark::State& st) {
  const Fp32AttentionScope way(st.range(4));
  AttnData a(st.range(0), st.range(1), st.range(2), st.range(3));
  for (auto _ : st) {
    attention_forward(a.out.data(), a.lse.data(), a.qkv.data(), a.B, a.T, a.C, a.NH);
    benchmark::DoNotOptimize(a.out.data());
  }
  SetGflops(st, 2 * a.causal_product_flops());
}

void BM_AttentionBackward(benchmark::State& st) {
  const Fp32AttentionScope way(st.range(4));
  AttnData a(st.range(0), st.range(1), st.range(2), st.range(3));
  attention_forward(a.out.data(), a.lse.data(), a.qkv.data(), a.B, a.T, a.C, a.NH);
  for (auto _ : st) {
    attention_backward(a.dqkv.data(), a.dout.data(), a.qkv.data(), a.out.data(), a.lse.data(), a.B, a.T, a.C, a.NH);
    benchmark::DoNotOptimize(a.dqkv.data());
  }
  SetGflops(st, 5 * a.causal_product_flops());
}

void BM_AttentionForwardBackward(benchmark::State& st) {
  const Fp32AttentionScope way(st.range(4));
  AttnData a(st.range(0), st.range(1), st.range(2), st.range(3));
  for (auto _ : st) {
    attention_forward(a.out.data(), a.lse.data(), a.qkv.data(), a.B, a.T, a.C, a.NH);
    attention_backward(a.dqkv.data(), a.dout.data(), a.qkv.data(), a.out.data(), a.lse.data(), a.B, a.T, a.C, a.NH);
    benchmark::DoNotOptimize(a.dqkv.data());
  }
  SetGflops(st, 7 * a.causal_product_flops());
}

#define ATTN_SHAPES                                                                                 \
  ArgsProduct({{8}, {256}, {256}, {4}, {0, 1}})->ArgsProduct({{8}, {256}, {384}, {6}, {0, 1}})      \
      ->ArgsProduct({{4}, {64, 512, 1024}, {768}, {12}, {0, 1}})                                     \
      ->ArgNames({"B", "T", "C", "NH", "tiled"})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_AttentionForward)->ATTN_SHAPES;
BENCHMARK(BM_AttentionBackward)->ATTN_SHAPES;
BENCHMARK(BM_AttentionForwardBackward)->ATTN_SHAPES;

// Attention on bf16 activations (the trainer at --dtype bf16), side by side: products=0 widens
// q/k/v to fp32 and runs the fp32 kernel (OpenBLAS tiles); products=1 is the bf16-product
// kernel of kernels_cpu_bf16.h (batched oneDNN where this CPU takes bf16 matmuls: count its
// calls with ONEDNN_VERBOSE=1, which also prints each product's time, to split the products
// from the softmax / copy passes). The CPU device at kBf16 picks one by Bf16AttentionProducts().
struct AttnData16 {
  AttnData f;
  std::vector<uint16_t> qkv, out, dout, dqkv;
  AttnData16(int B, int T, int C, int NH) : f(B, T, C, NH) {
    auto to16 = [](const std::vector<float>& v) {
      std::vector<uint16_t> r(v.size());
      for (size_t i = 0; i < v.size(); i++) r[i] = FloatToBf16(v[i]);
      return r;
    };
    qkv = to16(f.qkv), dout = to16(f.dout), out.resize(f.out.size()), dqkv.assign(qkv.size(), 0);
  }
  void forward(bool bf16_products) {
    if (bf16_products) return attention_forward_bf16(out.data(), f.lse.data(), qkv.data(), f.B, f.T, f.C, f.NH);
    attention_forward(out.data(), f.lse.data(), qkv.data(), f.B, f.T, f.C, f.NH);
  }
  void backward(bool bf16_products) {
    if (bf16_products)
      return attention_backward_bf16(dqkv.data(), dout.data(), qkv.data(), out.data(), f.lse.data(), f.B, f.T, f.C,
                                     f.NH);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), f.lse.data(), f.B, f.T, f.C, f.NH);
  }
};

void BM_AttentionBf16Forward(benchmark::State& st) {
  AttnData16 a(st.range(0), st.range(1), st.range(2), st.range(3));
  const bool bf16_products = st.range(4);
  for (auto _ : st) {
    a.forward(bf16_products);
    benchmark::DoNotOptimize(a.out.data());
  }
  SetGflops(st, 2 * a.f.causal_product_flops());
}

void BM_AttentionBf16Backward(benchmark::State& st) {
  AttnData16 a(st.range(0), st.range(1), st.range(2), st.range(3));
  const bool bf16_products = st.range(4);
  a.forward(bf16_products);
  for (auto _ : st) {
    a.backward(bf16_products);
    benchmark::DoNotOptimize(a.dqkv.data());
  }
  SetGflops(st, 5 * a.f.causal_product_flops());
}

#define ATTN16_SHAPES Args({8, 256, 256, 4, 0})->Args({8, 256, 256, 4, 1})->Args({8, 256, 384, 6, 0}) \
  ->Args({8, 256, 384, 6, 1})->Args({4, 64, 768, 12, 0})->Args({4, 64, 768, 12, 1})                 \
  ->ArgNames({"B", "T", "C", "NH", "products"})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_AttentionBf16Forward)->ATTN16_SHAPES;
BENCHMARK(BM_AttentionBf16Backward)->ATTN16_SHAPES;

// ---- layernorm, gelu, residual, encoder ------------------------------------------------------

void BM_LayernormForward(benchmark::State& st) {
  const int N = st.range(0), C = st.range(1);
  auto x = RandomFloats((size_t)N * C, 1), w = RandomFloats(C, 2), b = RandomFloats(C, 3);
  std::vector<float> out((size_t)N * C), mean(N), rstd(N);
  for (auto _ : st) {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    benchmark::DoNotOptimize(out.data());
  }
  SetGbytes(st, 2.0 * N * C * 4);
}

void BM_LayernormBackward(benchmark::State& st) {
  const int N = st.range(0), C = st.range(1);
  auto x = RandomFloats((size_t)N * C, 1), w = RandomFloats(C, 2), b = RandomFloats(C, 3), dout = RandomFloats((size_t)N * C, 4);
  std::vector<float> out((size_t)N * C), mean(N), rstd(N), dinp((size_t)N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (auto _ : st) {
    layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                       N, C);
    benchmark::DoNotOptimize(dinp.data());
  }
  SetGbytes(st, 4.0 * N * C * 4);
}
BENCHMARK(BM_LayernormForward)->Args({2048, 384})->Args({2048, 256})->ArgNames({"N", "C"})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayernormBackward)->Args({2048, 384})->Args({2048, 256})->ArgNames({"N", "C"})->Unit(benchmark::kMicrosecond);

void BM_GeluForward(benchmark::State& st) {
  const size_t n = st.range(0);
  auto x = RandomFloats(n, 1, -4, 4);
  std::vector<float> out(n);
  for (auto _ : st) {
    gelu_forward(out.data(), x.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  SetGbytes(st, 2.0 * n * 4);
}

void BM_GeluBackward(benchmark::State& st) {
  const size_t n = st.range(0);
  auto x = RandomFloats(n, 1, -4, 4), dout = RandomFloats(n, 2);
  std::vector<float> dinp(n, 0.0f);
  for (auto _ : st) {
    gelu_backward(dinp.data(), x.data(), dout.data(), n);
    benchmark::DoNotOptimize(dinp.data());
  }
  SetGbytes(st, 4.0 * n * 4);
}
// 2048 x 1024: the fc activations of B8 T256 C256
BENCHMARK(BM_GeluForward)->Arg(2048 * 1024)->ArgName("n")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GeluBackward)->Arg(2048 * 1024)->ArgName("n")->Unit(benchmark::kMicrosecond);

void BM_ResidualForwardBackward(benchmark::State& st) {
  const size_t n = st.range(0);
  auto a = RandomFloats(n, 1), b = RandomFloats(n, 2);
  std::vector<float> out(n), da(n, 0.0f), db(n, 0.0f);
  for (auto _ : st) {
    residual_forward(out.data(), a.data(), b.data(), n);
    residual_backward(da.data(), db.data(), out.data(), n);
    benchmark::DoNotOptimize(db.data());
  }
  SetGbytes(st, 8.0 * n * 4);
}
BENCHMARK(BM_ResidualForwardBackward)->Arg(2048 * 256)->ArgName("n")->Unit(benchmark::kMicrosecond);

void BM_EncoderForwardBackward(benchmark::State& st) {
  const int B = 8, T = 256, C = st.range(0), V = st.range(1);
  std::vector<int32_t> tok(B * T);
  std::mt19937 rng(1);
  for (auto& t : tok) t = rng() % V;
  auto wte = RandomFloats((size_t)V * C, 2), wpe = RandomFloats((size_t)T * C, 3), dout = RandomFloats((size_t)B * T * C, 4);
  std::vector<float> out((size_t)B * T * C), dwte((size_t)V * C, 0.0f), dwpe((size_t)T * C, 0.0f);
  for (auto _ : st) {
    encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
    benchmark::DoNotOptimize(dwte.data());
  }
}
BENCHMARK(BM_EncoderForwardBackward)->Args({256, 256})->Args({768, 50257})->ArgNames({"C", "V"})->Unit(benchmark::kMicrosecond);

// ---- crossentropy ----------------------------------------------------------------------------

void BM_CrossEntropy(benchmark::State& st) {
  const int N = st.range(0), V = st.range(1), Vp = st.range(2);
  auto logits = RandomFloats((size_t)N * Vp, 1, -4, 4);
  std::vector<float> losses(N);
  std::vector<int32_t> tgt(N);
  for (int n = 0; n < N; n++) tgt[n] = (n * 7919) % V;
  // In place: later iterations run on the previous gradient, which is just as finite.
  for (auto _ : st) benchmark::DoNotOptimize(crossentropy_softmax(logits.data(), losses.data(), tgt.data(), N, V, Vp, 1.0f / N));
  SetGbytes(st, 2.0 * N * Vp * 4);
}
BENCHMARK(BM_CrossEntropy)->Args({2048, 256, 256})->Args({256, 50257, 50304})->ArgNames({"N", "V", "Vp"})->Unit(benchmark::kMicrosecond);

// ---- one transformer block, B8 T256 C256 NH4 (the trainer's tiny GPT) ------------------------

struct Block {
  static constexpr int B = 8, T = 256, C = 256, NH = 4, N = B * T;
  // parameters and gradients
  std::vector<float> ln1w = RandomFloats(C, 1), ln1b = RandomFloats(C, 2), qkvw = RandomFloats((size_t)3 * C * C, 3, -0.05f, 0.05f),
                     qkvb = RandomFloats(3 * C, 4), attprojw = RandomFloats((size_t)C * C, 5, -0.05f, 0.05f), attprojb = RandomFloats(C, 6),
                     ln2w = RandomFloats(C, 7), ln2b = RandomFloats(C, 8), fcw = RandomFloats((size_t)4 * C * C, 9, -0.05f, 0.05f),
                     fcb = RandomFloats(4 * C, 10), fcprojw = RandomFloats((size_t)4 * C * C, 11, -0.03f, 0.03f), fcprojb = RandomFloats(C, 12);
  std::vector<float> g_ln1w = Z(C), g_ln1b = Z(C), g_qkvw = Z(3 * C * C), g_qkvb = Z(3 * C), g_attprojw = Z(C * C),
                     g_attprojb = Z(C), g_ln2w = Z(C), g_ln2b = Z(C), g_fcw = Z(4 * C * C), g_fcb = Z(4 * C),
                     g_fcprojw = Z(4 * C * C), g_fcprojb = Z(C);
  // activations
  std::vector<float> x = RandomFloats((size_t)N * C, 13), ln1 = Z(N * C), ln1m = Z(N), ln1r = Z(N), qkv = Z(N * 3 * C),
                     atty = Z(N * C), lse = Z(B * NH * T), attproj = Z(N * C), res2 = Z(N * C), ln2 = Z(N * C),
                     ln2m = Z(N), ln2r = Z(N), fch = Z(N * 4 * C), fchg = Z(N * 4 * C), fcproj = Z(N * C),
                     res3 = Z(N * C);
  // activation gradients
  std::vector<float> dres3 = RandomFloats((size_t)N * C, 14), dx = Z(N * C), dfcproj = Z(N * C), dfchg = Z(N * 4 * C),
                     dfch = Z(N * 4 * C), dln2 = Z(N * C), dres2 = Z(N * C), dattproj = Z(N * C), datty = Z(N * C),
                     dqkv = Z(N * 3 * C), dln1 = Z(N * C);
  static std::vector<float> Z(size_t n) { return std::vector<float>(n, 0.0f); }

  void Forward(bool matmuls_only) {
    if (!matmuls_only) layernorm_forward(ln1.data(), ln1m.data(), ln1r.data(), x.data(), ln1w.data(), ln1b.data(), N, C);
    matmul_forward(qkv.data(), ln1.data(), qkvw.data(), qkvb.data(), N, C, 3 * C);
    if (!matmuls_only) attention_forward(atty.data(), lse.data(), qkv.data(), B, T, C, NH);
    matmul_forward(attproj.data(), atty.data(), attprojw.data(), attprojb.data(), N, C, C);
    if (!matmuls_only) {
      residual_forward(res2.data(), x.data(), attproj.data(), (size_t)N * C);
      layernorm_forward(ln2.data(), ln2m.data(), ln2r.data(), res2.data(), ln2w.data(), ln2b.data(), N, C);
    }
    matmul_forward(fch.data(), ln2.data(), fcw.data(), fcb.data(), N, C, 4 * C);
    if (!matmuls_only) gelu_forward(fchg.data(), fch.data(), (size_t)N * 4 * C);
    matmul_forward(fcproj.data(), fchg.data(), fcprojw.data(), fcprojb.data(), N, 4 * C, C);
    if (!matmuls_only) residual_forward(res3.data(), res2.data(), fcproj.data(), (size_t)N * C);
  }
  void Backward(bool matmuls_only) {
    if (!matmuls_only) residual_backward(dres2.data(), dfcproj.data(), dres3.data(), (size_t)N * C);
    matmul_backward(dfchg.data(), g_fcprojw.data(), g_fcprojb.data(), dfcproj.data(), fchg.data(), fcprojw.data(), N,
                    4 * C, C);
    if (!matmuls_only) gelu_backward(dfch.data(), fch.data(), dfchg.data(), (size_t)N * 4 * C);
    matmul_backward(dln2.data(), g_fcw.data(), g_fcb.data(), dfch.data(), ln2.data(), fcw.data(), N, C, 4 * C);
    if (!matmuls_only) {
      layernorm_backward(dres2.data(), g_ln2w.data(), g_ln2b.data(), dln2.data(), res2.data(), ln2w.data(),
                         ln2m.data(), ln2r.data(), N, C);
      residual_backward(dx.data(), dattproj.data(), dres2.data(), (size_t)N * C);
    }
    matmul_backward(datty.data(), g_attprojw.data(), g_attprojb.data(), dattproj.data(), atty.data(), attprojw.data(),
                    N, C, C);
    if (!matmuls_only)
      attention_backward(dqkv.data(), datty.data(), qkv.data(), atty.data(), lse.data(), B, T, C, NH);
    matmul_backward(dln1.data(), g_qkvw.data(), g_qkvb.data(), dqkv.data(), ln1.data(), qkvw.data(), N, C, 3 * C);
    if (!matmuls_only)
      layernorm_backward(dx.data(), g_ln1w.data(), g_ln1b.data(), dln1.data(), x.data(), ln1w.data(), ln1m.data(),
                         ln1r.data(), N, C);
  }
  double MatmulFlops() const { return 3 * 2.0 * N * C * (3 * C + C + 4 * C + 4 * C); }  // fwd + bwd
};

void BM_BlockForwardBackward(benchmark::State& st) {
  Block blk;
  const bool matmuls_only = st.range(0) != 0;
  for (auto _ : st) {
    blk.Forward(matmuls_only);
    blk.Backward(matmuls_only);
    benchmark::DoNotOptimize(blk.dx.data());
  }
  SetGflops(st, blk.MatmulFlops());  // matmul flops only: the overhead of everything else shows as a lower rate
  st.counters["tok/s/block"] = benchmark::Counter(Block::N, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_BlockForwardBackward)->Arg(0)->Arg(1)->ArgName("matmuls_only")->Unit(benchmark::kMillisecond);

using Clock = std::chrono::steady_clock;

// ---- the optimizer against the memory roofline -------------------------------------------------
// One AdamW step over n elements the engine's way (adamw_mixed: master, m, v and the gradient
// read, master, m, v and the stored parameters written, one pass), timed alternately with a
// plain copy on the same threads (each thread memcpy's its slice of 4n floats) and with the
// three-call sequence adamw_mixed fuses (convert gradient, adamw_update, convert master), in
// the same iterations, so a loaded machine slows all three alike. Bytes, counted honestly:
//   adamw: n * (read 4+4+4+grad, write 4+4+4+stored)   (stored 0 when it is the fp32 master)
//   copy : 2 * bytes copied (read + write)
//   rmw  : 2 * bytes updated in place (x = x + 1 over 4n floats: read + write, like AdamW's
//          master, m and v, which need no read-for-ownership of a fresh destination line as a
//          copy's stores do unless memcpy streams them)
// Counters: adamw_GB/s, copy_GB/s, of_copy = adamw_GB/s / copy_GB/s (the goal: >= 0.8),
// rmw_GB/s and of_best = adamw_GB/s / max(copy, rmw), and old_GB/s, the unfused three-pass
// sequence over the same useful bytes. The manual time is the adamw's. n = 16M: 288-320 MB of
// state, far beyond any cache.
void BM_OptimizerVsCopy(benchmark::State& st) {
  const size_t n = st.range(0);
  const DType gd = st.range(1) ? DType::kBF16 : DType::kF32, sd = st.range(2) ? DType::kBF16 : DType::kF32;
  std::vector<float> master = RandomFloats(n, 1), m(n, 0.0f), v(n, 0.0f), g32 = RandomFloats(n, 2, -0.1f, 0.1f);
  std::vector<uint16_t> g16(n), s16(n);
  convert(g32.data(), DType::kF32, g16.data(), DType::kBF16, n);
  const void* grad = gd == DType::kBF16 ? static_cast<const void*>(g16.data()) : g32.data();
  void* stored = sd == DType::kBF16 ? static_cast<void*>(s16.data()) : master.data();
  std::vector<float> wide(n), src = RandomFloats(4 * n, 3), dst(4 * n);
  const AdamWConfig cfg;
  const double adamw_bytes = double(n) * (3 * 4 + DTypeSize(gd) + 3 * 4 + (sd == DType::kBF16 ? 2 : 0));
  const double copy_bytes = 2.0 * 4 * 4 * n;
  const int threads = ComputeThreads();
  auto seconds = [](auto f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  double t_adamw = 0, t_copy = 0, t_old = 0, t_rmw = 0;
  int64_t t = 0;
  for (auto _ : st) {
    t_copy += seconds([&] {
#pragma omp parallel num_threads(threads)
      {
        const size_t total = 4 * n, per = (total + omp_get_num_threads() - 1) / omp_get_num_threads();
        const size_t b = std::min(total, per * omp_get_thread_num()), e = std::min(total, b + per);
        if (e > b) std::memcpy(dst.data() + b, src.data() + b, (e - b) * sizeof(float));
      }
    });
    benchmark::DoNotOptimize(dst.data());
    t_rmw += seconds([&] {
      float* x = src.data();
#pragma omp parallel for simd schedule(static) num_threads(threads)
      for (size_t i = 0; i < 4 * n; i++) x[i] = x[i] + 1.0f;
    });
    benchmark::DoNotOptimize(src.data());
    t++;
    const double ta = seconds([&] {
      adamw_mixed(master.data(), stored, sd, grad, gd, m.data(), v.data(), n, 1e-6f, 0.1f, cfg, t, 1.0f);
    });
    t_adamw += ta;
    st.SetIterationTime(ta);
    benchmark::DoNotOptimize(master.data());
    t++;
    t_old += seconds([&] {
      convert(grad, gd, wide.data(), DType::kF32, n);
      adamw_update(master.data(), wide.data(), m.data(), v.data(), n, 1e-6f, 0.1f, cfg, t, 1.0f);
      if (sd == DType::kBF16) convert(master.data(), DType::kF32, s16.data(), DType::kBF16, n);
    });
    benchmark::DoNotOptimize(master.data());
  }
  const double it = static_cast<double>(st.iterations());
  const double adamw_gbs = adamw_bytes * it / t_adamw / 1e9, copy_gbs = copy_bytes * it / t_copy / 1e9;
  st.counters["adamw_GB/s"] = adamw_gbs;
  st.counters["copy_GB/s"] = copy_gbs;
  st.counters["of_copy"] = adamw_gbs / copy_gbs;
  const double rmw_gbs = copy_bytes * it / t_rmw / 1e9;
  st.counters["rmw_GB/s"] = rmw_gbs;
  st.counters["of_best"] = adamw_gbs / std::max(copy_gbs, rmw_gbs);
  st.counters["old_GB/s"] = adamw_bytes * it / t_old / 1e9;
}
BENCHMARK(BM_OptimizerVsCopy)
    ->Args({1 << 24, 1, 1})
    ->Args({1 << 24, 0, 0})
    ->ArgNames({"n", "grad_bf16", "stored_bf16"})
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);

// ---- thread-pool interplay --------------------------------------------------------------------
// Manual time: only the second kernel of each pair is timed, right after the first.

void BM_LayernormAfterSgemm(benchmark::State& st) {
  const int N = 2048, C = 256, OC = 768;
  const bool after = st.range(0) != 0;
  auto inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), mout = RandomFloats((size_t)N * OC, 3);
  auto x = RandomFloats((size_t)N * C, 4), lw = RandomFloats(C, 5), lb = RandomFloats(C, 6);
  std::vector<float> out((size_t)N * C), mean(N), rstd(N);
  for (auto _ : st) {
    if (after) matmul_forward(mout.data(), inp.data(), w.data(), nullptr, N, C, OC);
    const auto t0 = Clock::now();
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), lw.data(), lb.data(), N, C);
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_LayernormAfterSgemm)->Arg(0)->Arg(1)->ArgName("after_sgemm")->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_GeluAfterSgemm(benchmark::State& st) {
  const int N = 2048, C = 256, OC = 1024;
  const bool after = st.range(0) != 0;
  auto inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), h = RandomFloats((size_t)N * OC, 3);
  std::vector<float> g((size_t)N * OC);
  for (auto _ : st) {
    if (after) matmul_forward(h.data(), inp.data(), w.data(), nullptr, N, C, OC);
    const auto t0 = Clock::now();
    gelu_forward(g.data(), h.data(), (size_t)N * OC);
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    benchmark::DoNotOptimize(g.data());
  }
}
BENCHMARK(BM_GeluAfterSgemm)->Arg(0)->Arg(1)->ArgName("after_sgemm")->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_SgemmAfterOpenMP(benchmark::State& st) {
  const int N = 2048, C = 256, OC = 768;
  const bool after = st.range(0) != 0;
  auto inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), mout = RandomFloats((size_t)N * OC, 3);
  auto x = RandomFloats((size_t)N * C, 4), lw = RandomFloats(C, 5), lb = RandomFloats(C, 6);
  std::vector<float> out((size_t)N * C), mean(N), rstd(N);
  for (auto _ : st) {
    if (after) layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), lw.data(), lb.data(), N, C);
    const auto t0 = Clock::now();
    matmul_forward(mout.data(), inp.data(), w.data(), nullptr, N, C, OC);
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    benchmark::DoNotOptimize(mout.data());
  }
  SetGflops(st, 2.0 * N * C * OC);
}
BENCHMARK(BM_SgemmAfterOpenMP)->Arg(0)->Arg(1)->ArgName("after_omp")->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace shardgpt

int main(int argc, char** argv) {
  int threads = 2;
  if (const char* env = std::getenv("SHARDGPT_THREADS")) threads = std::max(1, std::atoi(env));
  shardgpt::SetComputeThreads(threads);
  benchmark::AddCustomContext("shardgpt_threads", std::to_string(threads));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
