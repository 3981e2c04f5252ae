// bf16 matmul kernels of the CPU device (see kernels_cpu_bf16.h): inputs rounded to bf16 (RNE,
// base/bf16.h), products accumulated in fp32 by oneDNN, or by OpenBLAS on the rounded values.
//
// oneDNN is used in its simplest form: dense bf16 operands (row-major, or transposed where the
// CPU's brgemm runs that as fast: the weight gradient's dout on AMX, Bf16DwSource), a dense
// fp32 or bf16 destination, an optional fp32 bias and an optional sum post-op (+=). Primitives
// are built once per shape and cached per thread (building one costs far more than a small
// product). Attention's products are batched over heads (dense per-head copies, so oneDNN's
// brgemm / AMX kernels take them; see "attention on oneDNN").
#include "model/kernels_cpu_bf16.h"

#include <cpuid.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <immintrin.h>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <type_traits>
#include <vector>

#include "base/bf16.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_internal.h"

#if DNNL_VERSION_MAJOR != 2
#error "model/kernels_cpu_bf16.cc is written against oneDNN 2.x (Debian 12's libdnnl-dev 2.6)"
#endif
#if DNNL_CPU_THREADING_RUNTIME != DNNL_RUNTIME_OMP
#error "oneDNN must be built with OpenMP: the CPU kernels keep ONE thread pool (kernels_cpu.h)"
#endif

namespace shardgpt {

// ----------------------------------------------------------------------------------------------
// CPU detection

namespace {

uint64_t Xcr0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// 0: none, 1: AVX512-BF16, 2: AMX-BF16 (the faster one when both are present).
int DetectBf16Dot() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE: xgetbv usable
  if (__get_cpuid_max(0, nullptr) < 7) return 0;
  const uint64_t xcr0 = Xcr0();
  const bool avx512_state = (xcr0 & 0xe6) == 0xe6;         // SSE, AVX, opmask, ZMM0-15 high, ZMM16-31
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;     // XTILECFG, XTILEDATA
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx_bf16 = (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16 and AMX-TILE
  const bool avx512f = b & (1u << 16);
  const unsigned max_sub = a;
  bool avx512_bf16 = false;
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    avx512_bf16 = a & (1u << 5);
  }
  if (amx_bf16 && tile_state) return 2;
  if (avx512f && avx512_bf16 && avx512_state) return 1;
  return 0;
}

int Bf16Dot() {
  static const int dot = DetectBf16Dot();
  return dot;
}

// AVX512-BF16 itself (vdpbf16ps), usable: what the attention tile kernel below needs. A CPU
// may have AMX-BF16 (DetectBf16Dot's 2) without it in principle, so it is asked separately.
bool DetectAvx512Bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  if (__get_cpuid_max(0, nullptr) < 7 || (Xcr0() & 0xe6) != 0xe6) return false;
  __cpuid_count(7, 0, a, b, c, d);
  if (!(b & (1u << 16)) || a < 1) return false;
  __cpuid_count(7, 1, a, b, c, d);
  return a & (1u << 5);
}

}  // namespace

bool CpuHasBf16Dot() { return Bf16Dot() != 0; }
bool Bf16DotKernelSupported() {
  static const bool ok = DetectAvx512Bf16();
  return ok;
}
const char* CpuBf16DotName() { return Bf16Dot() == 2 ? "AMX-BF16" : Bf16Dot() == 1 ? "AVX512-BF16" : ""; }

// ----------------------------------------------------------------------------------------------
// oneDNN: one engine, a stream and a primitive cache per thread

namespace {

using dnnl::memory;

dnnl::engine& OnednnEngine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // never destroyed: used at exit
  return *engine;
}

struct MatmulKey {
  int M, N, K, threads;
  bool ta, tb, bias, accumulate, c_bf16;
  bool operator==(const MatmulKey& o) const {
    return M == o.M && N == o.N && K == o.K && threads == o.threads && ta == o.ta && tb == o.tb && bias == o.bias &&
           accumulate == o.accumulate && c_bf16 == o.c_bf16;
  }
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const {
    size_t h = static_cast<size_t>(k.M) * 1000003u ^ static_cast<size_t>(k.N) * 10007u ^ static_cast<size_t>(k.K);
    return h * 31 + (k.threads << 5 | k.c_bf16 << 4 | k.ta << 3 | k.tb << 2 | k.bias << 1 | k.accumulate);
  }
};

struct MatmulEntry {
  memory::desc a, b, bias, c;
  dnnl::matmul prim;
  OnednnOperandFormats formats;  // of the primitive as built (its own src/weights descs)
};

std::atomic<int64_t> g_onednn_calls{0}, g_dot_calls{0}, g_weight_conversions{0}, g_weight_reuses{0},
    g_weights_from_stored{0}, g_attention_calls{0};

// The last formats each large product's primitive used (tests: the layouts cannot regress unseen).
std::mutex g_formats_mu;
OnednnOperandFormats g_formats[3];

// "ab" (row-major), "ba" (transposed) or "other" for a 2-D bf16 desc, from its strides.
std::string FormatName(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims != 2 || d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0) return "other";
  const dnnl_dims_t& st = d.format_desc.blocking.strides;
  if (st[1] == 1 && (st[0] == d.dims[1] || d.dims[0] == 1)) return "ab";
  if (st[0] == 1 && (st[1] == d.dims[0] || d.dims[1] == 1)) return "ba";
  return "other";
}

// C[M,N] (dense fp32, or bf16 when c_bf16) = op(A)[M,K] @ op(B)[K,N] (+ bias[N]) (+ C when
// accumulate). A bf16 C is read (accumulate) and written by oneDNN itself: fp32 accumulation,
// the sum and bias in fp32, one rounding to nearest even at the store (what widening C, an fp32
// product and narrowing it back computed, without those two passes over C).
// A is dense bf16 [M,K], or [K,M] when ta; B is dense bf16 [K,N], or [N,K] when tb.
// Outside a parallel region oneDNN threads the product over the OpenMP pool; inside one it
// runs on the calling thread (the thread count is part of the cache key).
// product: which of the large products this is (recorded for LastOnednnFormats), or null.
void OnednnMatmul(int M, int N, int K, const uint16_t* A, bool ta, const uint16_t* B, bool tb, const float* bias,
                  bool accumulate, void* C, const Bf16Product* product = nullptr, bool c_bf16 = false) {
  thread_local std::unordered_map<MatmulKey, MatmulEntry, MatmulKeyHash> cache;
  thread_local dnnl::stream stream(OnednnEngine());
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const MatmulKey key{M, N, K, threads, ta, tb, bias != nullptr, accumulate, c_bf16};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 4096) cache.clear();  // bounded: shapes come from a few (B, T) settings
    using tag = memory::format_tag;
    using dt = memory::data_type;
    MatmulEntry e;
    e.a = memory::desc({M, K}, dt::bf16, ta ? tag::ba : tag::ab);
    e.b = memory::desc({K, N}, dt::bf16, tb ? tag::ba : tag::ab);
    e.bias = memory::desc({1, N}, dt::f32, tag::ab);
    e.c = memory::desc({M, N}, c_bf16 ? dt::bf16 : dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::desc d = bias ? dnnl::matmul::desc(e.a, e.b, e.bias, e.c) : dnnl::matmul::desc(e.a, e.b, e.c);
    const dnnl::matmul::primitive_desc pd(d, attr, OnednnEngine());
    e.formats = {FormatName(pd.src_desc()), FormatName(pd.weights_desc())};
    e.prim = dnnl::matmul(pd);
    it = cache.emplace(key, std::move(e)).first;
  }
  const MatmulEntry& e = it->second;
  g_onednn_calls.fetch_add(1, std::memory_order_relaxed);
  if (product) {
    std::lock_guard<std::mutex> lock(g_formats_mu);
    g_formats[static_cast<int>(*product)] = e.formats;
  }
  dnnl::engine& eng = OnednnEngine();
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(e.a, eng, const_cast<uint16_t*>(A))},
                                       {DNNL_ARG_WEIGHTS, memory(e.b, eng, const_cast<uint16_t*>(B))},
                                       {DNNL_ARG_DST, memory(e.c, eng, C)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(e.bias, eng, const_cast<float*>(bias)));
  e.prim.execute(stream, args);
  stream.wait();
}

bool ProbeOnednnBf16() {
  try {
    using tag = memory::format_tag;
    memory::desc a({2, 2}, memory::data_type::bf16, tag::ab), c({2, 2}, memory::data_type::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), OnednnEngine());
    return true;
  } catch (const dnnl::error&) {
    return false;  // "could not create a primitive descriptor": no bf16 support on this ISA
  }
}

Bf16Gemm g_gemm = Bf16Gemm::kEmulated;
bool g_gemm_chosen = false;

}  // namespace

bool OnednnBf16Supported() {
  static const bool ok = ProbeOnednnBf16();
  return ok;
}

Bf16Gemm CurrentBf16Gemm() {
  if (!g_gemm_chosen) {
    g_gemm = OnednnBf16Supported() ? Bf16Gemm::kOnednn : Bf16Gemm::kEmulated;
    g_gemm_chosen = true;
  }
  return g_gemm;
}

bool SetBf16Gemm(Bf16Gemm gemm) {
  if (gemm == Bf16Gemm::kOnednn && !OnednnBf16Supported()) return false;
  g_gemm = gemm;
  g_gemm_chosen = true;
  return true;
}

const char* Bf16GemmName(Bf16Gemm gemm) { return gemm == Bf16Gemm::kOnednn ? "oneDNN" : "emulated"; }

namespace {
// AMX-BF16: oneDNN's brg:avx512_core_amx_bf16 reads a transposed source as fast as a dense
// one (it packs the source into tiles either way), so the transposed copy is a pass saved.
// AVX512-BF16 without AMX: brg:avx512_core_bf16 runs a transposed source several times slower
// than a dense one, so dout^T is written out first (docs/PERFORMANCE.md).
std::atomic<int> g_dw_source{-1};  // -1: not chosen yet
}  // namespace

Bf16DwSource CurrentBf16DwSource() {
  const int s = g_dw_source.load();
  if (s >= 0) return static_cast<Bf16DwSource>(s);
  return Bf16Dot() == 2 ? Bf16DwSource::kTransposedSource : Bf16DwSource::kTransposedCopy;
}

void SetBf16DwSource(Bf16DwSource source) { g_dw_source.store(static_cast<int>(source)); }

const char* Bf16DwSourceName(Bf16DwSource source) {
  return source == Bf16DwSource::kTransposedSource ? "transposed source" : "transposed copy";
}

OnednnOperandFormats LastOnednnFormats(Bf16Product product) {
  std::lock_guard<std::mutex> lock(g_formats_mu);
  return g_formats[static_cast<int>(product)];
}

Bf16ProductCounts GetBf16ProductCounts() {
  return {g_onednn_calls.load(std::memory_order_relaxed), g_dot_calls.load(std::memory_order_relaxed),
          g_weight_conversions.load(std::memory_order_relaxed), g_weight_reuses.load(std::memory_order_relaxed),
          g_weights_from_stored.load(std::memory_order_relaxed), g_attention_calls.load(std::memory_order_relaxed)};
}

void ResetBf16ProductCounts() {
  g_onednn_calls.store(0, std::memory_order_relaxed);
  g_dot_calls.store(0, std::memory_order_relaxed);
  g_weight_conversions.store(0, std::memory_order_relaxed);
  g_weight_reuses.store(0, std::memory_order_relaxed);
  g_weights_from_stored.store(0, std::memory_order_relaxed);
  g_attention_calls.store(0, std::memory_order_relaxed);
}

// ----------------------------------------------------------------------------------------------
// conversions: fp32 -> bf16 bits (for oneDNN) or -> fp32 holding the bf16 value (emulation)

namespace {

constexpr size_t kConvChunk = 16384;

// dst[i] = f(src[i]) for i < n, OpenMP over chunks (call outside parallel regions).
template <typename T, typename F>
T* ConvertAll(const float* src, size_t n, std::vector<T>& buf, F f) {
  T* dst = cpu_internal::scratch(buf, n);
  const int64_t chunks = static_cast<int64_t>((n + kConvChunk - 1) / kConvChunk);
#pragma omp parallel for schedule(static) num_threads(ComputeThreads())
  for (int64_t j = 0; j < chunks; j++) {
    const size_t i0 = j * kConvChunk, i1 = std::min(n, i0 + kConvChunk);
    for (size_t i = i0; i < i1; i++) dst[i] = f(src[i]);  // vec: convert_all
  }
  return dst;
}

// bf16 bits (for oneDNN) / fp32 holding the bf16 value (emulation).
uint16_t* ToBf16(const float* src, size_t n, std::vector<uint16_t>& buf) {
  return ConvertAll(src, n, buf, [](float x) { return FloatToBf16(x); });
}
float* RoundBf16(const float* src, size_t n, std::vector<float>& buf) {
  return ConvertAll(src, n, buf, [](float x) { return RoundToBf16(x); });
}

// t[c][r] = a[r][c] for an 8x8 block of 16-bit values (rows of a lda apart, of t ldt apart):
// three rounds of interleaving (SSE2).
inline void Transpose8x8(const uint16_t* a, int lda, uint16_t* t, int ldt) {
  __m128i r[8], u[8];
  for (int i = 0; i < 8; i++) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i * lda));
  for (int i = 0; i < 4; i++) {
    u[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
    u[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      r[4 * i + 2 * j] = _mm_unpacklo_epi32(u[4 * i + j], u[4 * i + j + 2]);
      r[4 * i + 2 * j + 1] = _mm_unpackhi_epi32(u[4 * i + j], u[4 * i + j + 2]);
    }
  for (int j = 0; j < 4; j++) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t + (2 * j) * ldt), _mm_unpacklo_epi64(r[j], r[j + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t + (2 * j + 1) * ldt), _mm_unpackhi_epi64(r[j], r[j + 4]));
  }
}

// dst_t[cols,rows] = f(src)^T, and dst[rows,cols] = f(src) when dst is not null, in one pass
// over src: 128x64 tiles over the compute threads, each converted into a row-major buffer,
// transposed in 8x8 blocks into a second one, and written out as contiguous runs of a tile's
// rows (writing transposed elements one by one would put each of a tile's columns on its own
// line of dst_t, rows * 2 bytes apart: at rows = 2048, 4 KiB apart, all in one L1 set).
template <typename S, typename F>
void TransposeTiles(const S* src, int rows, int cols, uint16_t* dst, uint16_t* dst_t, F f) {
  constexpr int kRows = 128, kCols = 64;  // 16 KiB per buffer; 256-byte runs in dst_t
  const int tr = (rows + kRows - 1) / kRows, tc = (cols + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) num_threads(ComputeThreads())
  for (int64_t t = 0; t < static_cast<int64_t>(tr) * tc; t++) {
    const int r0 = static_cast<int>(t / tc) * kRows, c0 = static_cast<int>(t % tc) * kCols;
    const int nr = std::min(rows - r0, kRows), nc = std::min(cols - c0, kCols);
    alignas(64) uint16_t in[kRows][kCols], out[kCols][kRows];  // in[r][c] = f(src[r0 + r, c0 + c]); out = in^T
    for (int r = 0; r < nr; r++) {
      const S* s = src + static_cast<int64_t>(r0 + r) * cols + c0;
      for (int c = 0; c < nc; c++) in[r][c] = f(s[c]);  // vec: transpose_tiles_convert
      for (int c = nc; c < kCols; c++) in[r][c] = 0;  // the tail: transposed, never written out
      if (dst) std::memcpy(dst + static_cast<int64_t>(r0 + r) * cols + c0, in[r], nc * sizeof(uint16_t));
    }
    for (int r = nr; r < ((nr + 7) & ~7); r++) std::memset(in[r], 0, sizeof(in[r]));
    for (int rb = 0; rb < nr; rb += 8)
      for (int cb = 0; cb < nc; cb += 8) Transpose8x8(&in[rb][cb], kCols, &out[cb][rb], kRows);
    for (int c = 0; c < nc; c++)
      std::memcpy(dst_t + static_cast<int64_t>(c0 + c) * rows + r0, out[c], nr * sizeof(uint16_t));
  }
}

// dst[rows,cols] = bf16(src) and dst_t[cols,rows] = its transpose, in one pass over src: the
// weight-gradient product's dout^T as a dense row-major source where a transposed source is
// slow (Bf16DwSource).
void ToBf16AndTransposed(const float* src, int rows, int cols, uint16_t* dst, uint16_t* dst_t) {
  TransposeTiles(src, rows, cols, dst, dst_t, [](float x) { return FloatToBf16(x); });
}

// dst[cols,rows] = src[rows,cols]^T (ToBf16AndTransposed without the conversion).
void Transpose16(const uint16_t* src, int rows, int cols, uint16_t* dst) {
  TransposeTiles(src, rows, cols, nullptr, dst, [](uint16_t x) { return x; });
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Bf16WeightCache

namespace {
std::atomic<bool> g_weight_reuse{true};
}  // namespace

void SetBf16WeightReuse(bool on) { g_weight_reuse.store(on); }
namespace {
std::atomic<int> g_bf16_attention{-1};  // -1: not set, the default below
}  // namespace
void SetBf16AttentionProducts(bool on) { g_bf16_attention.store(on ? 1 : 0); }
bool Bf16AttentionProducts() {
  const int set = g_bf16_attention.load();
  if (set >= 0) return set == 1;
  return CurrentBf16Gemm() == Bf16Gemm::kOnednn && CpuHasBf16Dot();
}
bool Bf16WeightReuse() { return g_weight_reuse.load(); }

void Bf16WeightCache::End() {
  std::lock_guard<std::mutex> lock(mu_);
  sources_.Reset(false);
  if (!open()) return;  // (closing twice must not drop the storage kept for the next window)
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.window == window_) ++it;  // used in this window: keep the storage
    else it = entries_.erase(it);
  }
  window_ = 0;
}

void Bf16WeightCache::NoteSource(const float* widened, const uint16_t* bf16, size_t n) {
  sources_.Note(widened, bf16, n);  // taken only while the window is open (Begin)
}

void Bf16WeightCache::Forget(const void* p, size_t bytes) {
  sources_.Forget(p, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, e] : entries_)  // not served again; the storage stays for the next window
    if (Bf16SourceNotes::Overlaps(key.first.first, key.first.second * sizeof(float), p, bytes)) e.window = 0;
}

Bf16WeightCache::Entry* Bf16WeightCache::Find(const float* w, size_t n, bool bits, bool* fresh) {
  Entry& e = entries_[{{w, n}, bits}];
  *fresh = e.window != window_;
  e.window = window_;
  return &e;
}

// One lookup for both forms: the entry's `slot` (its bits or its rounded floats) when this
// window filled it already, else `convert` into it (or into scratch when no window is open).
template <typename T>
const T* Bf16WeightCache::Lookup(const float* w, size_t n, std::vector<T>& scratch, std::vector<T> Entry::*slot,
                                 T* (*convert)(const float*, size_t, std::vector<T>&)) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open()) {
    g_weight_conversions.fetch_add(1, std::memory_order_relaxed);
    return convert(w, n, scratch);
  }
  if (const uint16_t* stored = sources_.Find(w, n)) {  // w is bf16 values already: serve them as they are
    g_weights_from_stored.fetch_add(1, std::memory_order_relaxed);
    if constexpr (std::is_same<T, uint16_t>::value) return stored;
    else return w;
  }
  bool fresh = false;
  Entry* e = Find(w, n, std::is_same<T, uint16_t>::value, &fresh);
  if (!fresh) {
    g_weight_reuses.fetch_add(1, std::memory_order_relaxed);
    return (e->*slot).data();
  }
  g_weight_conversions.fetch_add(1, std::memory_order_relaxed);
  return convert(w, n, e->*slot);
}

const uint16_t* Bf16WeightCache::Bits(const float* w, size_t n, std::vector<uint16_t>& scratch) {
  return Lookup(w, n, scratch, &Entry::bits, &ToBf16);
}

const float* Bf16WeightCache::Rounded(const float* w, size_t n, std::vector<float>& scratch) {
  return Lookup(w, n, scratch, &Entry::rounded, &RoundBf16);
}

namespace {

// Dense copy of the rows x cols matrix at src (row stride ld), converted by f.
template <typename T, typename F>
T* Pack(const float* src, int rows, int cols, int ld, std::vector<T>& buf, F f) {
  T* dst = cpu_internal::scratch(buf, static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; r++) {
    const float* s = src + static_cast<int64_t>(r) * ld;
    T* d = dst + static_cast<int64_t>(r) * cols;
    for (int c = 0; c < cols; c++) d[c] = f(s[c]);
  }
  return dst;
}

// dbias[OC] += sum_n dout[n,:] in fp32; each thread owns a column range, rows in order (the
// same order as the fp32 kernel's, so bias gradients do not depend on the precision).
template <typename A>
void BiasBackward(float* dbias, const A* dout, int N, int OC) {
#pragma omp parallel num_threads(ComputeThreads())
  {
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    const int o0 = static_cast<int>(static_cast<int64_t>(OC) * tid / team);
    const int o1 = static_cast<int>(static_cast<int64_t>(OC) * (tid + 1) / team);
    for (int n = 0; n < N; n++) {
      const A* d = dout + static_cast<int64_t>(n) * OC;
#pragma omp simd
      for (int o = o0; o < o1; o++) dbias[o] += cpu_internal::Ld(d, o);  // vec: bias_backward
    }
  }
}

// Operand buffers of the large matmuls (training thread only).
thread_local std::vector<uint16_t> t_a16, t_b16, t_c16, t_c16t;
thread_local std::vector<float> t_a32, t_b32, t_c32;

}  // namespace

// ----------------------------------------------------------------------------------------------
// matmul: out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC], inputs rounded to bf16

void matmul_forward_bf16(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC,
                         Bf16WeightCache* cache) {
  const size_t NC = static_cast<size_t>(N) * C, OCC = static_cast<size_t>(OC) * C;
  Bf16WeightCache none;  // never opened: converts
  Bf16WeightCache& wc = cache ? *cache : none;
  if (CurrentBf16Gemm() == Bf16Gemm::kEmulated) {
    matmul_forward(out, RoundBf16(inp, NC, t_a32), wc.Rounded(w, OCC, t_b32), bias, N, C, OC);
    return;
  }
  // w[OC,C] is the [C,OC] operand stored transposed
  static const Bf16Product kProduct = Bf16Product::kForward;
  OnednnMatmul(N, OC, C, ToBf16(inp, NC, t_a16), false, wc.Bits(w, OCC, t_b16), true, bias, false, out, &kProduct);
}

// dinp[N,C] += dout[N,OC] @ w[OC,C];  dw[OC,C] += dout^T @ inp[N,C];  dbias[OC] += sum_n dout[n,:]
void matmul_backward_bf16(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                          int N, int C, int OC, Bf16WeightCache* cache) {
  const size_t NC = static_cast<size_t>(N) * C, NOC = static_cast<size_t>(N) * OC, OCC = static_cast<size_t>(OC) * C;
  Bf16WeightCache none;  // never opened: converts
  Bf16WeightCache& wc = cache ? *cache : none;
  if (CurrentBf16Gemm() == Bf16Gemm::kEmulated) {
    const float* rw = dinp ? wc.Rounded(w, OCC, t_b32) : w;  // w only feeds dinp
    matmul_backward(dinp, dw, nullptr, RoundBf16(dout, NOC, t_c32), dw ? RoundBf16(inp, NC, t_a32) : nullptr, rw, N,
                    C, OC);
  } else {
    static const Bf16Product kData = Bf16Product::kBackwardData, kWeights = Bf16Product::kBackwardWeights;
    // dout in bf16 as [N,OC] for dinp, and for dw either that same copy read as a transposed
    // source, or a second copy written transposed ([OC,N], in the same pass) where a
    // transposed source is slow (Bf16DwSource)
    const bool copy_t = dw && CurrentBf16DwSource() == Bf16DwSource::kTransposedCopy;
    uint16_t* d16 = cpu_internal::scratch(t_c16, NOC);
    uint16_t* d16t = copy_t ? cpu_internal::scratch(t_c16t, NOC) : nullptr;
    if (copy_t) ToBf16AndTransposed(dout, N, OC, d16, d16t);
    else ToBf16(dout, NOC, t_c16);
    if (dinp) OnednnMatmul(N, C, OC, d16, false, wc.Bits(w, OCC, t_b16), false, nullptr, true, dinp, &kData);
    if (dw)
      OnednnMatmul(OC, C, N, copy_t ? d16t : d16, !copy_t, ToBf16(inp, NC, t_a16), false, nullptr, true, dw,
                   &kWeights);
  }
  if (dbias) BiasBackward(dbias, dout, N, OC);
}

// bf16 activations: the operands reach oneDNN as they are stored, with no ToBf16 of the input
// or of dout (the conversion passes the fp32-activation kernels above make on every call); only
// the weight is converted (or taken from the cache), dout read transposed by the weight
// gradient's primitive (or transposed in bf16 first, Bf16DwSource), and oneDNN writes out / dinp in bf16 itself (dinp = bf16(fp32(dinp) + dout @ w),
// rounded once); the emulated path widens, computes in fp32 and rounds once the same way.
void matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const float* w, const float* bias, int N, int C, int OC,
                         Bf16WeightCache* cache) {
  const size_t NC = static_cast<size_t>(N) * C, NOC = static_cast<size_t>(N) * OC, OCC = static_cast<size_t>(OC) * C;
  Bf16WeightCache none;
  Bf16WeightCache& wc = cache ? *cache : none;
  if (CurrentBf16Gemm() == Bf16Gemm::kEmulated) {  // inp is bf16 already: widening is its rounding
    float* o = cpu_internal::scratch(t_c32, NOC);
    matmul_forward(o, cpu_internal::Widen(inp, NC, t_a32), wc.Rounded(w, OCC, t_b32), bias, N, C, OC);
    cpu_internal::Narrow(o, out, NOC);
    return;
  }
  static const Bf16Product kProduct = Bf16Product::kForward;  // out written in bf16 by oneDNN
  OnednnMatmul(N, OC, C, inp, false, wc.Bits(w, OCC, t_b16), true, bias, false, out, &kProduct, /*c_bf16=*/true);
}

void matmul_backward_bf16(uint16_t* dinp, float* dw, float* dbias, const uint16_t* dout, const uint16_t* inp,
                          const float* w, int N, int C, int OC, Bf16WeightCache* cache) {
  const size_t NC = static_cast<size_t>(N) * C, NOC = static_cast<size_t>(N) * OC, OCC = static_cast<size_t>(OC) * C;
  Bf16WeightCache none;
  Bf16WeightCache& wc = cache ? *cache : none;
  if (CurrentBf16Gemm() == Bf16Gemm::kEmulated) {
    thread_local std::vector<float> t_dinp32;
    float* di = dinp ? cpu_internal::Widen(dinp, NC, t_dinp32) : nullptr;
    const float* rw = dinp ? wc.Rounded(w, OCC, t_b32) : w;
    const float* x = dw ? cpu_internal::Widen(inp, NC, t_a32) : nullptr;
    matmul_backward(di, dw, nullptr, cpu_internal::Widen(dout, NOC, t_c32), x, rw, N, C, OC);
    if (dinp) cpu_internal::Narrow(di, dinp, NC);
  } else {
    static const Bf16Product kData = Bf16Product::kBackwardData, kWeights = Bf16Product::kBackwardWeights;
    // dinp (bf16) += dout @ w, read and rounded once by oneDNN (bf16 destination, sum post-op)
    if (dinp)
      OnednnMatmul(N, C, OC, dout, false, wc.Bits(w, OCC, t_b16), false, nullptr, true, dinp, &kData,
                   /*c_bf16=*/true);
    if (dw) {  // dout^T: dout itself as a transposed source, or a transposed copy (as above)
      if (CurrentBf16DwSource() == Bf16DwSource::kTransposedSource) {
        OnednnMatmul(OC, C, N, dout, true, inp, false, nullptr, true, dw, &kWeights);
      } else {
        uint16_t* d16t = cpu_internal::scratch(t_c16t, NOC);
        Transpose16(dout, N, OC, d16t);
        OnednnMatmul(OC, C, N, d16t, false, inp, false, nullptr, true, dw, &kWeights);
      }
    }
  }
  if (dbias) BiasBackward(dbias, dout, N, OC);
}

// ----------------------------------------------------------------------------------------------
// The bf16 tile product of attention: our own AVX512-BF16 kernel (vdpbf16ps). Attention's
// products are small (a row block of 32 or 64 by head size 64): thousands of oneDNN calls per
// step, each costing more in setup (memory objects, argument map, stream) than its FLOPs.
//
// Layout: A packed as bf16 rows [M,Kp] (Kp = K rounded up to even, zero-padded); B packed as
// bf16 pairs Bp[k/2][n][k%2] with N padded to a multiple of 16, so one 512-bit load is the
// pairs (B[2kk][n], B[2kk+1][n]) of 16 columns and
//   vdpbf16ps: acc[n] += A[i][2kk] B[2kk][n] + A[i][2kk+1] B[2kk+1][n]   (fp32 accumulate)
// with the pair A[i][2kk..2kk+1] broadcast. Register block: MR rows x NV vectors of 16 columns.
// Products of bf16 values are exact in fp32; vdpbf16ps treats bf16 denormal inputs as zero and
// flushes denormal results (as oneDNN's kernels on the same instruction do).

namespace {

template <int MR, int NV>
__attribute__((target("avx512f,avx512bf16"))) void DotBlock(int i0, int j0, int N, int Kp, float alpha,
                                                             const uint16_t* Ap, const uint16_t* Bp, int Np,
                                                             float beta, float* C, int ldc) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  for (int kk = 0; kk < Kp / 2; kk++) {
    __m512i b[NV];
    for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_si512(Bp + (static_cast<int64_t>(kk) * Np + j0 + 16 * v) * 2);
    for (int r = 0; r < MR; r++) {
      uint32_t pair;
      std::memcpy(&pair, Ap + static_cast<int64_t>(i0 + r) * Kp + 2 * kk, sizeof(pair));
      const __m512i a = _mm512_set1_epi32(static_cast<int>(pair));
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)b[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < MR; r++) {
    float* c = C + static_cast<int64_t>(i0 + r) * ldc;
    for (int v = 0; v < NV; v++) {
      const int col = j0 + 16 * v, cnt = std::min(16, N - col);
      if (cnt <= 0) continue;
      const __mmask16 mask = static_cast<__mmask16>((1u << cnt) - 1u);
      __m512 res = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.0f) res = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, c + col), res);
      _mm512_mask_storeu_ps(c + col, mask, res);
    }
  }
}

using DotBlockFn = void (*)(int, int, int, int, float, const uint16_t*, const uint16_t*, int, float, float*, int);

template <int MR>
DotBlockFn DotBlockFor(int nv) {
  switch (nv) {
    case 1: return DotBlock<MR, 1>;
    case 2: return DotBlock<MR, 2>;
    case 3: return DotBlock<MR, 3>;
    default: return DotBlock<MR, 4>;
  }
}
DotBlockFn DotBlockFor(int mr, int nv) {
  switch (mr) {
    case 1: return DotBlockFor<1>(nv);
    case 2: return DotBlockFor<2>(nv);
    case 3: return DotBlockFor<3>(nv);
    default: return DotBlockFor<4>(nv);
  }
}

thread_local std::vector<uint16_t> t_dot_a, t_dot_b;

}  // namespace

namespace {

// 16 floats (the first cnt of src; the rest read as 0) rounded to bf16 bits, one per 32-bit
// lane (low half): base/bf16.h's FloatToBf16 in vector form, bit for bit (RNE; NaN stays a
// quiet NaN with its sign; denormals kept).
__attribute__((target("avx512f,avx512bf16"))) inline __m512i Bf16Lanes(const float* src, int cnt) {
  const __mmask16 m = static_cast<__mmask16>(cnt >= 16 ? 0xffffu : (1u << cnt) - 1u);
  const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, src));
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x0040)));
}

// Ap[i][k] = bf16(op(A)[i][k]), rows of Kp (a zero in column K when K is odd).
__attribute__((target("avx512f,avx512bf16"))) void PackDotA(bool ta, int M, int K, int Kp, const float* A, int lda,
                                                            uint16_t* ap) {
  if (!ta) {
    for (int i = 0; i < M; i++) {
      const float* s = A + static_cast<int64_t>(i) * lda;
      uint16_t* d = ap + static_cast<int64_t>(i) * Kp;
      for (int k0 = 0; k0 < K; k0 += 16) {
        const int cnt = std::min(16, K - k0);
        _mm512_mask_cvtepi32_storeu_epi16(d + k0, static_cast<__mmask16>(cnt >= 16 ? 0xffffu : (1u << cnt) - 1u),
                                          Bf16Lanes(s + k0, cnt));
      }
      if (K < Kp) d[K] = 0;
    }
    return;
  }
  // op(A)[i][k] = A[k][i]: rows of A are columns of Ap
  alignas(32) uint16_t tmp[16];
  for (int k = 0; k < K; k++) {
    const float* s = A + static_cast<int64_t>(k) * lda;
    for (int i0 = 0; i0 < M; i0 += 16) {
      const int cnt = std::min(16, M - i0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), _mm512_cvtepi32_epi16(Bf16Lanes(s + i0, cnt)));
      for (int j = 0; j < cnt; j++) ap[static_cast<int64_t>(i0 + j) * Kp + k] = tmp[j];
    }
  }
  if (K < Kp)
    for (int i = 0; i < M; i++) ap[static_cast<int64_t>(i) * Kp + K] = 0;
}

// Bp[k/2][n][k%2] = bf16(op(B)[k][n]), N padded to Np (a multiple of 16) and K to Kp with zeros.
__attribute__((target("avx512f,avx512bf16"))) void PackDotB(bool tb, int N, int K, int Kp, int Np, const float* B,
                                                            int ldb, uint16_t* bp) {
  if (!tb) {
    // rows 2kk and 2kk+1 of B interleaved: one 512-bit store is 16 columns' pairs
    for (int kk = 0; kk < Kp / 2; kk++) {
      const float* r0 = B + static_cast<int64_t>(2 * kk) * ldb;
      const float* r1 = 2 * kk + 1 < K ? r0 + ldb : nullptr;
      for (int n0 = 0; n0 < Np; n0 += 16) {
        const int cnt = std::max(0, std::min(16, N - n0));
        const __m512i lo = Bf16Lanes(r0 + n0, cnt);
        const __m512i hi = r1 ? Bf16Lanes(r1 + n0, cnt) : _mm512_setzero_si512();
        _mm512_storeu_si512(bp + (static_cast<int64_t>(kk) * Np + n0) * 2, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
    return;
  }
  // op(B)[k][n] = B[n][k]: row n of B gives column n's pairs, one 32-bit pair per kk
  if (N < Np) std::memset(bp, 0, static_cast<size_t>(Kp) * Np * sizeof(uint16_t));
  uint32_t* bp32 = reinterpret_cast<uint32_t*>(bp);
  alignas(32) uint32_t tmp[8];
  for (int n = 0; n < N; n++) {
    const float* s = B + static_cast<int64_t>(n) * ldb;
    for (int k0 = 0; k0 < K; k0 += 16) {
      const int cnt = std::min(16, K - k0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), _mm512_cvtepi32_epi16(Bf16Lanes(s + k0, cnt)));
      for (int p = 0; p < (cnt + 1) / 2; p++) bp32[static_cast<int64_t>(k0 / 2 + p) * Np + n] = tmp[p];
    }
  }
}

}  // namespace

void gemm_bf16_dot(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                   int ldb, float beta, float* C, int ldc) {
  g_dot_calls.fetch_add(1, std::memory_order_relaxed);
  const int Kp = (K + 1) & ~1, Np = (N + 15) & ~15;
  uint16_t* ap = cpu_internal::scratch(t_dot_a, static_cast<size_t>(M) * Kp);
  uint16_t* bp = cpu_internal::scratch(t_dot_b, static_cast<size_t>(Kp) * Np);
  PackDotA(ta, M, K, Kp, A, lda, ap);
  PackDotB(tb, N, K, Kp, Np, B, ldb, bp);
  for (int i0 = 0; i0 < M; i0 += 4) {
    const int mr = std::min(4, M - i0);
    for (int j0 = 0; j0 < Np; j0 += 64) DotBlockFor(mr, std::min(4, (Np - j0) / 16))(i0, j0, N, Kp, alpha, ap, bp, Np, beta, C, ldc);
  }
}

// ----------------------------------------------------------------------------------------------
// attention: model/kernels_cpu_internal.h's blocked attention with a bf16 product policy: the
// AVX512-BF16 tile kernel above where the CPU has it; else (oneDNN chosen on an AVX-512 CPU
// without it) each call packs its two (strided) operand tiles densely as bf16, multiplies them
// with oneDNN on this thread and applies alpha/beta to the strided destination in fp32; or the
// emulation (rounded fp32 tiles, OpenBLAS).

namespace {

thread_local std::vector<uint16_t> t_tile_a16, t_tile_b16;
thread_local std::vector<float> t_tile_a32, t_tile_b32, t_tile_c;

struct Bf16GemmPolicy {
  Bf16Gemm kind;
  bool dot = kind == Bf16Gemm::kOnednn && Bf16DotKernelSupported();
  void operator()(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                  int ldb, float beta, float* C, int ldc) const {
    if (dot) return gemm_bf16_dot(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    if (kind == Bf16Gemm::kEmulated) {
      const float* a = Pack(A, a_rows, a_cols, lda, t_tile_a32, RoundToBf16);
      const float* b = Pack(B, b_rows, b_cols, ldb, t_tile_b32, RoundToBf16);
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, a,
                  a_cols, b, b_cols, beta, C, ldc);
      return;
    }
    const uint16_t* a = Pack(A, a_rows, a_cols, lda, t_tile_a16, [](float x) { return FloatToBf16(x); });
    const uint16_t* b = Pack(B, b_rows, b_cols, ldb, t_tile_b16, [](float x) { return FloatToBf16(x); });
    float* c = cpu_internal::scratch(t_tile_c, static_cast<size_t>(M) * N);
    OnednnMatmul(M, N, K, a, ta, b, tb, nullptr, false, c);
    for (int i = 0; i < M; i++) {
      float* dst = C + static_cast<int64_t>(i) * ldc;
      const float* src = c + static_cast<int64_t>(i) * N;
      if (beta == 0.0f) {
#pragma omp simd
        for (int j = 0; j < N; j++) dst[j] = alpha * src[j];  // vec: tile_scale
      } else {
#pragma omp simd
        for (int j = 0; j < N; j++) dst[j] = alpha * src[j] + beta * dst[j];  // vec: tile_scale_add
      }
    }
  }
};

}  // namespace

// ----------------------------------------------------------------------------------------------
// attention on oneDNN, batched by head chunks: OpenMP over chunks of G (b,h) heads (one parallel
// region per call: under load, every extra region waits for a descheduled thread), and each
// product is ONE single-threaded oneDNN call over the chunk's G heads. oneDNN 2.6 runs a
// matmul on its brgemm kernels (AMX / AVX512-BF16) only when every operand is dense
// ([G, rows, cols] row-major, the weights possibly transposed); strided views into qkv, or
// row-block sub-views of a head, fall to its gemm:jit path at ~1/5 the speed (checked with
// ONEDNN_VERBOSE). So a chunk copies its heads' q, k, v (and dO) into dense [G, T, hs] bf16
// buffers and multiplies whole [T, T] score tiles: the masked upper triangle is computed and
// discarded (2x the causal FLOPs, on AMX still less time than the blocked fp32 tiles), and P /
// dS are zero there before the second products.
//   forward:  S = scale q k^T (fp32);  softmax per row in fp32: lse, P (bf16, 0 for s > t);
//             o = P v (fp32, or bf16 rounded once by oneDNN), copied into out.
//   backward: S = scale q k^T, dP = dO v^T (fp32);  P = exp(S - lse), dS = P (dP - D) (bf16);
//             dq = scale dS k, dk = scale dS^T q, dv = P^T dO (fp32; oneDNN reads dS and P
//             transposed in place: a transposed source is still brgemm), added into dqkv.
// Memory: per thread, one chunk's scratch: 16 T^2 bytes per head (S, dP fp32; P, dS bf16) plus
// 20 T hs bytes; G = max(1, min(8, kAttentionChunkBytes / (16 T^2))) heads (T = 256: 2 heads,
// 2 MB, in L2; T = 1024: 1 head, 16 MB). Nothing is kept between forward and backward but o and lse.
// Deterministic on any thread count: each head's products and passes are the same single-
// threaded code whichever thread runs its chunk, and the chunks depend only on the shape.

namespace {

constexpr size_t kAttentionChunkBytes = size_t{2} << 20;
constexpr size_t kAttentionMaxChunk = 8;  // heads: short sequences still give every thread chunks

// Heads per chunk for sequence length T.
int AttentionChunk(int BH, int T) {
  const size_t per_head = size_t{16} * T * T;
  const size_t fit = std::min<size_t>(kAttentionMaxChunk, kAttentionChunkBytes / per_head);
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(BH, fit)));
}

// C[g] = alpha * op(A[g]) @ op(B[g]) for g < G: A dense bf16 [G,M,K], or [G,K,M] when ta;
// B dense bf16 [G,K,N], or [G,N,K] when tb; C dense [G,M,N], fp32 or bf16 (c_bf16). Single-threaded inside a parallel
// region (per-thread primitive cache and stream).
struct BatchedKey {
  int threads, G, M, N, K;
  bool ta, tb, c_bf16;
  float alpha;
  bool operator<(const BatchedKey& o) const {
    return std::tie(threads, G, M, N, K, ta, tb, c_bf16, alpha) <
           std::tie(o.threads, o.G, o.M, o.N, o.K, o.ta, o.tb, o.c_bf16, o.alpha);
  }
};

void OnednnBatched(int G, int M, int N, int K, const uint16_t* A, bool ta, const uint16_t* B, bool tb, float alpha,
                   void* C, bool c_bf16) {
  struct Entry {
    memory::desc a, b, c;
    dnnl::matmul prim;
  };
  thread_local std::map<BatchedKey, Entry> cache;
  thread_local dnnl::stream stream(OnednnEngine());
  const BatchedKey key{omp_in_parallel() ? 1 : omp_get_max_threads(), G, M, N, K, ta, tb, c_bf16, alpha};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 1024) cache.clear();  // bounded: shapes come from a few (B, T) settings
    using dt = memory::data_type;
    using tag = memory::format_tag;
    Entry e;
    e.a = memory::desc({G, M, K}, dt::bf16, ta ? tag::acb : tag::abc);
    e.b = memory::desc({G, K, N}, dt::bf16, tb ? tag::acb : tag::abc);
    e.c = memory::desc({G, M, N}, c_bf16 ? dt::bf16 : dt::f32, tag::abc);
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, OnednnEngine());
    e.prim = dnnl::matmul(pd);
    it = cache.emplace(key, std::move(e)).first;
  }
  Entry& e = it->second;
  g_onednn_calls.fetch_add(1, std::memory_order_relaxed);
  g_attention_calls.fetch_add(1, std::memory_order_relaxed);
  dnnl::engine& eng = OnednnEngine();
  e.prim.execute(stream, {{DNNL_ARG_SRC, memory(e.a, eng, const_cast<uint16_t*>(A))},
                          {DNNL_ARG_WEIGHTS, memory(e.b, eng, const_cast<uint16_t*>(B))},
                          {DNNL_ARG_DST, memory(e.c, eng, C)}});
  stream.wait();
}

thread_local std::vector<float> t_batt_f32;
thread_local std::vector<uint16_t> t_batt_b16;

// The heads bh0 .. bh0+G-1 of a [B, T, ld] activation, column col: row (g, t) is at
// src + ((b*T + t)*ld + col + h*hs) with b, h = divmod(bh0 + g, NH).
struct HeadView {
  int bh0, G, T, NH, hs;
  int64_t at(int g, int t, int64_t ld, int col) const {
    const int64_t bh = bh0 + g, b = bh / NH, h = bh % NH;
    return (b * T + t) * ld + col + h * hs;
  }
  // dst[g][t][i] = src[g, t, i] (dense [G, T, hs])
  void gather(const uint16_t* src, int64_t ld, int col, uint16_t* dst) const {
    for (int g = 0; g < G; g++)
      for (int t = 0; t < T; t++)
        std::memcpy(dst + (static_cast<int64_t>(g) * T + t) * hs, src + at(g, t, ld, col), hs * sizeof(uint16_t));
  }
};

// The shape of one batched attention call, and its one parallel walk over the chunks of heads.
struct BatchedAttention {
  int T, C, NH, hs, C3, BH, G0;
  float scale;
  size_t TT, Thd;  // elements of one head's [T, T] tile and of its [T, hs] rows
  BatchedAttention(int B, int T_, int C_, int NH_)
      : T(T_), C(C_), NH(NH_), hs(C_ / NH_), C3(3 * C_), BH(B * NH_), G0(AttentionChunk(B * NH_, T_)),
        scale(1.0f / std::sqrt(static_cast<float>(C_ / NH_))), TT(static_cast<size_t>(T_) * T_),
        Thd(static_cast<size_t>(T_) * (C_ / NH_)) {}
  // f(hv) for every chunk, over the compute threads (the chunks depend only on the shape).
  template <typename F>
  void ForEachChunk(F f) const {
    const int chunks = (BH + G0 - 1) / G0;
#pragma omp parallel for schedule(static) num_threads(ComputeThreads())
    for (int c = 0; c < chunks; c++) f(HeadView{c * G0, std::min(G0, BH - c * G0), T, NH, hs});
  }
};

// out (bf16 bits when OutT is uint16_t, else fp32) and lse from bf16 qkv.
template <typename OutT>
void AttentionForwardBatched(OutT* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH) {
  constexpr bool kOut16 = std::is_same<OutT, uint16_t>::value;
  const BatchedAttention a(B, T, C, NH);
  a.ForEachChunk([&](const HeadView& hv) {
    const int G = hv.G;
    float* S = cpu_internal::scratch(t_batt_f32, a.G0 * (a.TT + a.Thd));
    float* o32 = S + a.G0 * a.TT;
    uint16_t* P = cpu_internal::scratch(t_batt_b16, a.G0 * (a.TT + 4 * a.Thd));
    uint16_t *qd = P + a.G0 * a.TT, *kd = qd + a.G0 * a.Thd, *vd = kd + a.G0 * a.Thd, *o16 = vd + a.G0 * a.Thd;
    hv.gather(qkv, a.C3, 0, qd), hv.gather(qkv, a.C3, C, kd), hv.gather(qkv, a.C3, 2 * C, vd);
    OnednnBatched(G, T, T, a.hs, qd, false, kd, /*tb=*/true, a.scale, S, false);  // S = scale q k^T
    for (int64_t row = 0; row < static_cast<int64_t>(G) * T; row++) {
      const int t = static_cast<int>(row % T);
      float* srow = S + row * T;
      uint16_t* prow = P + row * T;
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int s = 0; s <= t; s++) mx = mx > srow[s] ? mx : srow[s];  // vec: batched_softmax_max
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int s = 0; s <= t; s++) {  // vec: batched_softmax_exp
        srow[s] = cpu_internal::exp_fast(srow[s] - mx);
        sum += srow[s];
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int s = 0; s <= t; s++) prow[s] = FloatToBf16(srow[s] * inv);  // vec: batched_softmax_store
      std::fill(prow + t + 1, prow + T, uint16_t{0});
      lse[static_cast<int64_t>(hv.bh0) * T + row] = mx + std::log(sum);
    }
    OutT* od = kOut16 ? reinterpret_cast<OutT*>(o16) : reinterpret_cast<OutT*>(o32);
    OnednnBatched(G, T, a.hs, T, P, false, vd, false, 1.0f, od, kOut16);  // o = P v
    for (int g = 0; g < G; g++)
      for (int t = 0; t < T; t++)
        std::memcpy(out + hv.at(g, t, C, 0), od + (static_cast<int64_t>(g) * T + t) * a.hs, a.hs * sizeof(OutT));
  });
}

// d[0, n) += g[0, n) (fp32 sums; a bf16 d rounded once).
template <typename GradT>
inline void AddRow(GradT* __restrict d, const float* __restrict g, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) cpu_internal::St(d, i, cpu_internal::Ld(d, i) + g[i]);  // vec: add_row
}

// dqkv (fp32, or bf16 bits when GradT is uint16_t) += the gradients, from bf16 dout, qkv, out.
// Each element of dqkv gets exactly one fp32 sum added (its head's dq, dk or dv over the whole
// sequence), so a bf16 dqkv is rounded once, as widening, adding and narrowing would.
// out32 / dout32: the fp32 activations dout and out were rounded from, when they are fp32
// (null for bf16 activations): D = dO . o is then taken from them unrounded, as the tile
// kernels and the GPU's tensor-core attention do (only the products' inputs are rounded).
template <typename GradT>
void AttentionBackwardBatched(GradT* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                              const float* lse, int B, int T, int C, int NH, const float* dout32 = nullptr,
                              const float* out32 = nullptr) {
  const BatchedAttention a(B, T, C, NH);
  a.ForEachChunk([&](const HeadView& hv) {
    const int G = hv.G;
    float* S = cpu_internal::scratch(t_batt_f32, a.G0 * (2 * a.TT + 3 * a.Thd + T));
    float *dP = S + a.G0 * a.TT, *dqd = dP + a.G0 * a.TT, *dkd = dqd + a.G0 * a.Thd, *dvd = dkd + a.G0 * a.Thd, *D = dvd + a.G0 * a.Thd;
    uint16_t* P = cpu_internal::scratch(t_batt_b16, a.G0 * (2 * a.TT + 4 * a.Thd));
    uint16_t *dS = P + a.G0 * a.TT, *qd = dS + a.G0 * a.TT, *kd = qd + a.G0 * a.Thd, *vd = kd + a.G0 * a.Thd, *dOd = vd + a.G0 * a.Thd;
    hv.gather(qkv, a.C3, 0, qd), hv.gather(qkv, a.C3, C, kd), hv.gather(qkv, a.C3, 2 * C, vd), hv.gather(dout, C, 0, dOd);
    for (int64_t row = 0; row < static_cast<int64_t>(G) * T; row++) {  // D[t] = dO_t . o_t (fp32)
      const int64_t at = hv.at(static_cast<int>(row / T), static_cast<int>(row % T), C, 0);
      float acc = 0.0f;
      if (out32) {
        const float *o = out32 + at, *g = dout32 + at;
#pragma omp simd reduction(+ : acc)
        for (int i = 0; i < a.hs; i++) acc += o[i] * g[i];  // vec: batched_d_f32
      } else {
        const uint16_t *o = out + at, *g = dOd + row * a.hs;
#pragma omp simd reduction(+ : acc)
        for (int i = 0; i < a.hs; i++) acc += Bf16ToFloat(o[i]) * Bf16ToFloat(g[i]);  // vec: batched_d_bf16
      }
      D[row] = acc;
    }
    OnednnBatched(G, T, T, a.hs, qd, false, kd, true, a.scale, S, false);  // S = scale q k^T
    OnednnBatched(G, T, T, a.hs, dOd, false, vd, true, 1.0f, dP, false);  // dP = dO v^T
    // P = exp(S - lse), dS = P (dP - D), as bf16 (0 above the diagonal)
    for (int64_t row = 0; row < static_cast<int64_t>(G) * T; row++) {
      const int t = static_cast<int>(row % T);
      const float* srow = S + row * T;
      const float* dprow = dP + row * T;
      uint16_t* prow = P + row * T;
      uint16_t* dsrow = dS + row * T;
      const float lt = lse[static_cast<int64_t>(hv.bh0) * T + row], Dt = D[row];
#pragma omp simd
      for (int s = 0; s <= t; s++) {  // vec: batched_gradient
        const float p = cpu_internal::exp_fast(srow[s] - lt);
        prow[s] = FloatToBf16(p);
        dsrow[s] = FloatToBf16(p * (dprow[s] - Dt));
      }
      std::fill(prow + t + 1, prow + T, uint16_t{0});
      std::fill(dsrow + t + 1, dsrow + T, uint16_t{0});
    }
    OnednnBatched(G, T, a.hs, T, dS, false, kd, false, a.scale, dqd, false);  // dq = scale dS k
    OnednnBatched(G, T, a.hs, T, dS, true, qd, false, a.scale, dkd, false);   // dk = scale dS^T q
    OnednnBatched(G, T, a.hs, T, P, true, dOd, false, 1.0f, dvd, false);    // dv = P^T dO
    for (int64_t row = 0; row < static_cast<int64_t>(G) * T; row++) {
      GradT* d = dqkv + hv.at(static_cast<int>(row / T), static_cast<int>(row % T), a.C3, 0);
      AddRow(d, dqd + row * a.hs, a.hs), AddRow(d + C, dkd + row * a.hs, a.hs), AddRow(d + 2 * C, dvd + row * a.hs, a.hs);
    }
  });
}

}  // namespace

// kOnednn up to T = kBatchedAttentionMaxT: the batched attention above (fp32 activations
// converted to bf16 once per call); kEmulated, and longer sequences: the tile policy over
// kernels_cpu_internal.h's blocked attention, whose scratch is O(T x block), not 16 T^2 bytes
// per thread (64 MB at T = 2048, 1 GB at T = 8192).
namespace {
thread_local std::vector<uint16_t> t_batt_qkv, t_batt_do;
bool Batched(int T) { return CurrentBf16Gemm() == Bf16Gemm::kOnednn && T <= kBatchedAttentionMaxT; }
}  // namespace

void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  if (Batched(T)) {
    const size_t NC = static_cast<size_t>(B) * T * C;
    return AttentionForwardBatched(out, lse, ToBf16(qkv, 3 * NC, t_batt_qkv), B, T, C, NH);
  }
  cpu_internal::BlasSingleThread single;
  cpu_internal::AttentionForward(Bf16GemmPolicy{CurrentBf16Gemm()}, ComputeThreads(), out, lse, qkv, B, T, C, NH);
}

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int B, int T, int C, int NH) {
  if (Batched(T)) {
    const size_t NC = static_cast<size_t>(B) * T * C;
    return AttentionBackwardBatched(dqkv, ToBf16(dout, NC, t_batt_do), ToBf16(qkv, 3 * NC, t_batt_qkv),
                                    /*out=*/nullptr, lse, B, T, C, NH, dout, out);
  }
  cpu_internal::BlasSingleThread single;
  cpu_internal::AttentionBackward(Bf16GemmPolicy{CurrentBf16Gemm()}, ComputeThreads(), dqkv, dout, qkv, out, lse, B,
                                  T, C, NH);
}

// bf16 activations: kOnednn reads and writes them in place (o rounded once by oneDNN, dqkv
// once in the sum). kEmulated: widened to fp32 and the kernels above (whose tile
// packing rounds to bf16 again: a no-op on bf16 values), the outputs rounded once.
void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH) {
  if (Batched(T)) return AttentionForwardBatched(out, lse, qkv, B, T, C, NH);
  const size_t NC = static_cast<size_t>(B) * T * C;
  std::vector<float> q, o(NC);
  attention_forward_bf16(o.data(), lse, cpu_internal::Widen(qkv, 3 * NC, q), B, T, C, NH);
  cpu_internal::Narrow(o.data(), out, NC);
}

void attention_backward_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                             const float* lse, int B, int T, int C, int NH) {
  const size_t NC = static_cast<size_t>(B) * T * C;
  if (Batched(T)) return AttentionBackwardBatched(dqkv, dout, qkv, out, lse, B, T, C, NH);
  std::vector<float> q, o, d, dq;
  cpu_internal::Widen(out, NC, o), cpu_internal::Widen(dout, NC, d), cpu_internal::Widen(dqkv, 3 * NC, dq);
  attention_backward_bf16(dq.data(), d.data(), cpu_internal::Widen(qkv, 3 * NC, q), o.data(), lse, B, T, C, NH);
  cpu_internal::Narrow(dq.data(), dqkv, 3 * NC);
}

}  // namespace shardgpt
