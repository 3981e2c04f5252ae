// CPU kernels with bf16 matmuls (the CPU device's kernels at MatmulPrecision::kBf16).
//
// The products of matmul_forward/backward and attention's score/value products take their
// inputs rounded to bf16 (round to nearest even) and accumulate in fp32; a product of two bf16
// values is exact in fp32, so the only differences from the fp32 twins in kernels_cpu.h are the
// input roundings and the summation order. Everything else stays fp32: biases and their
// gradients, the softmax and log-sum-exp inside attention, and (in other kernels) LayerNorm
// statistics, the loss and AdamW. Inputs, outputs and saved activations are fp32 buffers, with
// the same signatures, shapes and accumulate (+=) semantics as the fp32 twins.
//
// Two ways to run the bf16 products (Bf16Gemm), with the same numerics up to summation order:
//   kOnednn    oneDNN's bf16 matmul (Debian's libdnnl, the library PyTorch's CPU autocast uses):
//              AVX512-BF16 / AMX dot-product instructions where the CPU has them; on AVX-512
//              CPUs without them oneDNN emulates (slower). Needs AVX-512 (OnednnBf16Supported).
//   kEmulated  the inputs rounded to bf16 and kept as fp32, then the fp32 kernels (OpenBLAS).
//              Runs on every CPU (tests, and --compute-dtype bf16 on CPUs without AVX-512);
//              slower than plain fp32.
// Under kOnednn, attention's products are batched: one single-threaded oneDNN call per
// product per chunk of heads (dense bf16 copies of the chunk's q, k, v, dO: oneDNN 2.6 runs
// only dense operands on its brgemm / AMX kernels), under one OpenMP loop over the chunks; the
// softmax stays fp32 between the products (kernels_cpu_bf16.cc, "attention on oneDNN"); past
// T = kBatchedAttentionMaxT attention's tiles run on the AVX512-BF16 tile kernel
// (gemm_bf16_dot) instead. The weight gradient's dout^T is dout read as a transposed source on
// AMX, else a transposed bf16 copy (Bf16DwSource). A weight's bf16 copy may be kept for a reuse
// window (Bf16WeightCache).
//
// Threading: the same single OpenMP pool as kernels_cpu.h. oneDNN here is built on OpenMP
// (checked at compile time) and uses the same libgomp, sized by SetComputeThreads: the large
// matmuls call oneDNN outside any parallel region and it threads them itself; inside
// attention's loop over head chunks oneDNN sees it is in a parallel region and runs
// single-threaded on each thread's chunk.
//
// Thread contract: the kernels are called from one thread at a time (the training thread), as
// the fp32 kernels are. SetBf16Gemm must not race with running kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "model/bf16_source_notes.h"

namespace shardgpt {

// True when this CPU has bf16 dot-product instructions that the OS lets us use: AVX512-BF16
// (CPUID.(7,1):EAX[5], with AVX-512 state enabled in XCR0) or AMX-BF16 (CPUID.(7,0):EDX[22],
// with tile state enabled). The same facts as /proc/cpuinfo's avx512_bf16 / amx_bf16 flags.
bool CpuHasBf16Dot();
// "AMX-BF16", "AVX512-BF16", or "" when CpuHasBf16Dot() is false.
const char* CpuBf16DotName();

enum class Bf16Gemm { kOnednn, kEmulated };

// True when oneDNN can create a bf16 matmul on this CPU (it needs AVX-512). Checked once.
bool OnednnBf16Supported();
// The way bf16 products run in this process: kOnednn where supported, else kEmulated.
// SetBf16Gemm(kOnednn) on a CPU where it is not supported is ignored (returns false).
Bf16Gemm CurrentBf16Gemm();
bool SetBf16Gemm(Bf16Gemm gemm);
const char* Bf16GemmName(Bf16Gemm gemm);  // "oneDNN" or "emulated"

// How the weight-gradient product dw[OC,C] += dout^T inp gets dout^T on oneDNN:
// kTransposedSource: dout [N,OC] itself, read by the primitive as a transposed ("ba") source;
// kTransposedCopy: a bf16 copy of dout written transposed ([OC,N], dense "ab") first.
// Default: kTransposedSource on CPUs with AMX-BF16 (oneDNN's AMX brgemm runs it as fast as a
// dense source), kTransposedCopy elsewhere (its AVX512-BF16 brgemm runs a transposed source
// several times slower than the copy costs).
// Results differ at most in summation order. SetBf16DwSource: tests and measurements.
enum class Bf16DwSource { kTransposedCopy, kTransposedSource };
Bf16DwSource CurrentBf16DwSource();
void SetBf16DwSource(Bf16DwSource source);
const char* Bf16DwSourceName(Bf16DwSource source);  // "transposed copy" or "transposed source"

// The memory formats of the source and weights operands of the oneDNN primitive that the last
// call of a large product ran: "ab" (dense row-major), "ba" (dense, transposed) or "other";
// both "" when that product has not run on oneDNN in this process. Taken from the primitive's
// own descriptors, so tests can check the layouts each product gets (Bf16DwSource: which
// transposed source is fast depends on the CPU).
enum class Bf16Product { kForward, kBackwardData, kBackwardWeights };
struct OnednnOperandFormats {
  std::string src, weights;
};
OnednnOperandFormats LastOnednnFormats(Bf16Product product);

// How many bf16 products ran since the last reset, by where: oneDNN primitive executions and
// calls of the AVX512-BF16 tile kernel (bench_train --profile prints them per step).
struct Bf16ProductCounts {
  int64_t onednn_calls = 0, dot_kernel_calls = 0;
  // matmul weights converted to bf16; weights served from a Bf16WeightCache's copies instead;
  // weights served from the stored bf16 parameters they were widened from (NoteSource)
  int64_t weight_conversions = 0, weight_reuses = 0, weights_from_stored = 0;
  int64_t attention_calls = 0;  // of onednn_calls: attention's batched products
};
Bf16ProductCounts GetBf16ProductCounts();
void ResetBf16ProductCounts();

// True when the CPU has AVX512-BF16 (vdpbf16ps) and the OS enables AVX-512 state: what
// gemm_bf16_dot needs. Checked once.
bool Bf16DotKernelSupported();
// The tile product of bf16 attention on oneDNN-capable CPUs with AVX512-BF16, cblas_sgemm's
// row-major signature: C[M,N] (ldc) = alpha * bf16(op(A))[M,K] @ bf16(op(B))[K,N] + beta * C,
// fp32 accumulation (C is not read when beta == 0). Single-threaded, per-thread scratch: safe
// to call from several threads at once. Precondition: Bf16DotKernelSupported().
void gemm_bf16_dot(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                   int ldb, float beta, float* C, int ldc);

// One bf16 copy per matmul weight for a reuse window (Kernels::begin_weight_reuse): inside a
// window whose opener guarantees the weights do not change, a weight is converted on its first
// use and served from here after (the forward, the backward's dinp, recompute and further
// micro-batches), keyed by (address, element count, way of computing). Outside a window nothing
// is served: every call converts. Each Begin opens a new window, so an entry of an earlier one
// is never served, whatever now lies at its address. End keeps the storage of the weights used
// in the window just closed (the next window refills it without new allocations) and frees the
// rest; End when closed does nothing. Memory: 2 bytes per weight element (4 for the emulation's rounded fp32 copies).
// NoteSource (Kernels::note_bf16_source): inside the window, floats known to be the widening of
// bf16 parameters are served from those bf16 values themselves: no conversion, no copy (the
// fp32 compute copies of bf16 storage). Forget(p, bytes) (the CPU device's Free): nothing
// derived from memory being freed is served again, so a freed and reallocated buffer holding
// another unit's weights at the same address is converted afresh.
// Thread contract: lookups, notes, Begin and End on the training thread, as the kernels; Forget
// from any thread (a mutex).
// SetBf16WeightReuse(false) makes Begin open nothing (every call converts): the switch tests and
// measurements compare against; on by default.
void SetBf16WeightReuse(bool on);
bool Bf16WeightReuse();
// Whether the CPU device's attention runs its score/value products in bf16 (the kernels
// attention_*_bf16 below) at MatmulPrecision::kBf16, rather than in fp32 on the widened
// activations. Default (until set): on where the batched oneDNN attention runs on bf16
// dot-product instructions (CurrentBf16Gemm() == kOnednn and CpuHasBf16Dot(): faster than
// the fp32 tiles at the bench shapes), off elsewhere (oneDNN emulating bf16 on plain
// AVX-512, or the emulation, are slower than the fp32 tiles).
void SetBf16AttentionProducts(bool on);
bool Bf16AttentionProducts();

class Bf16WeightCache {
 public:
  void Begin() {
    std::lock_guard<std::mutex> lock(mu_);
    window_ = Bf16WeightReuse() ? ++last_window_ : 0;
    sources_.Reset(open());
  }
  void End();
  bool open() const { return window_ != 0; }
  // w[0, n) rounded to bf16: its bits (kOnednn) or fp32 values (kEmulated); cached when open,
  // else converted into scratch.
  const uint16_t* Bits(const float* w, size_t n, std::vector<uint16_t>& scratch);
  const float* Rounded(const float* w, size_t n, std::vector<float>& scratch);
  void NoteSource(const float* widened, const uint16_t* bf16, size_t n);
  void Forget(const void* p, size_t bytes);

 private:
  struct Entry {
    uint64_t window = 0;
    std::vector<uint16_t> bits;
    std::vector<float> rounded;
  };
  Entry* Find(const float* w, size_t n, bool bits, bool* fresh);
  template <typename T>
  const T* Lookup(const float* w, size_t n, std::vector<T>& scratch, std::vector<T> Entry::*slot,
                  T* (*convert)(const float*, size_t, std::vector<T>&));
  uint64_t window_ = 0, last_window_ = 0;
  std::map<std::pair<std::pair<const float*, size_t>, bool>, Entry> entries_;
  Bf16SourceNotes sources_;  // of the open window
  std::mutex mu_;            // guards the entries and the window: Forget may come from another thread
};

// out[N,OC] = bf16(inp)[N,C] @ bf16(w)[OC,C]^T + bias[OC]   (bias may be null; fp32 bias)
// cache (optional): where w's bf16 copy may come from (Bf16WeightCache).
void matmul_forward_bf16(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC,
                         Bf16WeightCache* cache = nullptr);
// dinp[N,C] += bf16(dout) @ bf16(w);  dw[OC,C] += bf16(dout)^T @ bf16(inp);
// dbias[OC] += sum_n dout[n,:] in fp32 (dbias may be null; dinp may be null).
void matmul_backward_bf16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int N, int C, int OC, Bf16WeightCache* cache = nullptr);

// The same on bf16 activations (raw bits; kernels_cpu.h's bf16-activation rules): inp and dout
// go to oneDNN as stored (no conversion pass), out / dinp are the fp32 results rounded once.
void matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const float* w, const float* bias, int N, int C, int OC,
                         Bf16WeightCache* cache = nullptr);
void matmul_backward_bf16(uint16_t* dinp, float* dw, float* dbias, const uint16_t* dout, const uint16_t* inp,
                          const float* w, int N, int C, int OC, Bf16WeightCache* cache = nullptr);

// attention_forward/backward (kernels_cpu.h) with bf16 inputs to q k^T, P v (forward) and
// dO v^T, dS k, P^T dO, dS^T q (backward); softmax, lse and D = dO . o in fp32. Under kOnednn
// up to T = kBatchedAttentionMaxT the batched kernel (fp32 activations rounded to bf16 once per
// call; 16 T^2 bytes of scratch per thread); under kEmulated, or past that T, the blocked tile
// kernel of kernels_cpu_internal.h on rounded fp32 tiles (scratch O(T x block)).
constexpr int kBatchedAttentionMaxT = 2048;
void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int B, int T, int C, int NH);
// On bf16 activations: under kOnednn read and written in place (out and each dqkv element
// rounded once); under kEmulated widened, the kernels above, the outputs rounded once.
void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH);
void attention_backward_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                             const float* lse, int B, int T, int C, int NH);

}  // namespace shardgpt
