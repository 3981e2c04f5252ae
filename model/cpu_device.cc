// The CPU device: host memory (calloc, kept for reuse by a block cache) and the OpenBLAS/OpenMP
// kernels of model/kernels_cpu.h;
// at MatmulPrecision::kBf16 the matmuls and attention run the bf16 kernels of
// model/kernels_cpu_bf16.h instead; at activation dtype bf16 every model kernel runs its
// bf16-activation overload. Copies are memcpy and events are complete at once: the CPU
// computes synchronously.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <unordered_map>
#include <mutex>

#include <omp.h>
#include <sanitizer/asan_interface.h>  // ASAN_(UN)POISON_MEMORY_REGION; no-ops without ASan

#include "model/device.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_bf16.h"
#include "model/kernels_cpu_internal.h"
#include "model/kernels_cpu_llama.h"

namespace shardgpt {

namespace {

// Forwards every kernel to its free function in model/kernels_cpu.h, or, for the matmuls and
// attention at MatmulPrecision::kBf16, in model/kernels_cpu_bf16.h.
class CpuKernels final : public Kernels {
 public:
  // Each model kernel: the fp32-activation overload (F casts) or the bf16 one (H casts) of the
  // same free function, by activation_dtype().
  void encoder_forward(void* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) const override {
    if (act16()) return shardgpt::encoder_forward(H(out), tokens, wte, wpe, B, T, C);
    shardgpt::encoder_forward(F(out), tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) const override {
    if (act16()) return shardgpt::encoder_backward(dwte, dwpe, H(dout), tokens, B, T, C);
    shardgpt::encoder_backward(dwte, dwpe, F(dout), tokens, B, T, C);
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* w, const float* b,
                         int N, int C) const override {
    if (act16()) return shardgpt::layernorm_forward(H(out), mean, rstd, H(inp), w, b, N, C);
    shardgpt::layernorm_forward(F(out), mean, rstd, F(inp), w, b, N, C);
  }
  void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) const override {
    if (act16()) return shardgpt::layernorm_backward(H(dinp), dw, db, H(dout), H(inp), w, mean, rstd, N, C);
    shardgpt::layernorm_backward(F(dinp), dw, db, F(dout), F(inp), w, mean, rstd, N, C);
  }
  void matmul_forward(void* out, const void* inp, const float* w, const float* bias, int N, int C,
                      int OC) const override {
    if (bf16() && act16()) return shardgpt::matmul_forward_bf16(H(out), H(inp), w, bias, N, C, OC, &weights_);
    if (bf16()) return shardgpt::matmul_forward_bf16(F(out), F(inp), w, bias, N, C, OC, &weights_);
    if (act16()) return shardgpt::matmul_forward(H(out), H(inp), w, bias, N, C, OC);
    shardgpt::matmul_forward(F(out), F(inp), w, bias, N, C, OC);
  }
  void matmul_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const float* w,
                       int N, int C, int OC) const override {
    if (bf16() && act16())
      return shardgpt::matmul_backward_bf16(H(dinp), dw, dbias, H(dout), H(inp), w, N, C, OC, &weights_);
    if (bf16()) return shardgpt::matmul_backward_bf16(F(dinp), dw, dbias, F(dout), F(inp), w, N, C, OC, &weights_);
    if (act16()) return shardgpt::matmul_backward(H(dinp), dw, dbias, H(dout), H(inp), w, N, C, OC);
    shardgpt::matmul_backward(F(dinp), dw, dbias, F(dout), F(inp), w, N, C, OC);
  }
  // The twins of the GELU epilogues: the matmul's fp32 result x first (at bf16 activations
  // the fp32-activation kernel at the same precision on the widened, exact, operands), then
  // the element-wise half on it. At fp32 activations the separate kernels are that already.
  void matmul_gelu_forward(void* out, void* pre, const void* inp, const float* w, const float* bias, int N, int C,
                           int OC) const override {
    const size_t n = static_cast<size_t>(N) * OC;
    if (!act16()) {
      matmul_forward(pre, inp, w, bias, N, C, OC);
      return shardgpt::gelu_forward(F(out), F(pre), n);
    }
    float* x = cpu_internal::scratch(x_, n);
    const float* in = cpu_internal::Widen(H(inp), static_cast<size_t>(N) * C, operand_);
    if (bf16()) shardgpt::matmul_forward_bf16(x, in, w, bias, N, C, OC, &weights_);
    else shardgpt::matmul_forward(x, in, w, bias, N, C, OC);
    shardgpt::gelu_epilogue_forward(H(out), H(pre), x, n);
  }
  void matmul_dgelu_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* pre,
                             const float* w, int N, int C, int OC) const override {
    const size_t n = static_cast<size_t>(N) * C;
    matmul_backward(nullptr, dw, dbias, dout, inp, w, N, C, OC);
    float* x = cpu_internal::scratch(x_, n);
    std::fill(x, x + n, 0.0f);
    const float* d = act16() ? cpu_internal::Widen(H(dout), static_cast<size_t>(N) * OC, operand_) : F(dout);
    if (bf16()) shardgpt::matmul_backward_bf16(x, nullptr, nullptr, d, nullptr, w, N, C, OC, &weights_);
    else shardgpt::matmul_backward(x, nullptr, nullptr, d, nullptr, w, N, C, OC);
    if (act16()) return shardgpt::gelu_epilogue_backward(H(dinp), H(pre), x, n);
    shardgpt::gelu_epilogue_backward(F(dinp), F(pre), x, n);
  }
  void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH) const override {
    if (bf16_attention() && act16()) return shardgpt::attention_forward_bf16(H(out), lse, H(qkv), B, T, C, NH);
    if (bf16_attention()) return shardgpt::attention_forward_bf16(F(out), lse, F(qkv), B, T, C, NH);
    if (act16()) return shardgpt::attention_forward(H(out), lse, H(qkv), B, T, C, NH);
    shardgpt::attention_forward(F(out), lse, F(qkv), B, T, C, NH);
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                          int B, int T, int C, int NH) const override {
    if (bf16_attention() && act16())
      return shardgpt::attention_backward_bf16(H(dqkv), H(dout), H(qkv), H(out), lse, B, T, C, NH);
    if (bf16_attention())
      return shardgpt::attention_backward_bf16(F(dqkv), F(dout), F(qkv), F(out), lse, B, T, C, NH);
    if (act16()) return shardgpt::attention_backward(H(dqkv), H(dout), H(qkv), H(out), lse, B, T, C, NH);
    shardgpt::attention_backward(F(dqkv), F(dout), F(qkv), F(out), lse, B, T, C, NH);
  }
  void gelu_forward(void* out, const void* inp, size_t n) const override {
    if (act16()) return shardgpt::gelu_forward(H(out), H(inp), n);
    shardgpt::gelu_forward(F(out), F(inp), n);
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) const override {
    if (act16()) return shardgpt::gelu_backward(H(dinp), H(inp), H(dout), n);
    shardgpt::gelu_backward(F(dinp), F(inp), F(dout), n);
  }
  void residual_forward(void* out, const void* a, const void* b, size_t n) const override {
    if (act16()) return shardgpt::residual_forward(H(out), H(a), H(b), n);
    shardgpt::residual_forward(F(out), F(a), F(b), n);
  }
  void residual_layernorm_forward(void* res_out, void* ln_out, float* mean, float* rstd, const void* a,
                                  const void* b, const float* w, const float* bias, int N, int C) const override {
    if (act16())
      return shardgpt::residual_layernorm_forward(H(res_out), H(ln_out), mean, rstd, H(a), H(b), w, bias, N, C);
    shardgpt::residual_layernorm_forward(F(res_out), F(ln_out), mean, rstd, F(a), F(b), w, bias, N, C);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const float* w, int N, int C,
                       float eps) const override {
    if (act16()) return shardgpt::rmsnorm_forward(H(out), rstd, H(inp), w, N, C, eps);
    shardgpt::rmsnorm_forward(F(out), rstd, F(inp), w, N, C, eps);
  }
  void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const float* w, const float* rstd,
                        int N, int C) const override {
    if (act16()) return shardgpt::rmsnorm_backward(H(dinp), dw, H(dout), H(inp), w, rstd, N, C);
    shardgpt::rmsnorm_backward(F(dinp), dw, F(dout), F(inp), w, rstd, N, C);
  }
  void rope_forward(void* qkv, int B, int T, int NH, int KV, int hs, float theta) const override {
    if (act16()) return shardgpt::rope_forward(H(qkv), B, T, NH, KV, hs, theta);
    shardgpt::rope_forward(F(qkv), B, T, NH, KV, hs, theta);
  }
  void rope_backward(void* dqkv, int B, int T, int NH, int KV, int hs, float theta) const override {
    if (act16()) return shardgpt::rope_backward(H(dqkv), B, T, NH, KV, hs, theta);
    shardgpt::rope_backward(F(dqkv), B, T, NH, KV, hs, theta);
  }
  void swiglu_forward(void* out, const void* gate_up, int N, int Fh) const override {
    if (act16()) return shardgpt::swiglu_forward(H(out), H(gate_up), N, Fh);
    shardgpt::swiglu_forward(F(out), F(gate_up), N, Fh);
  }
  void swiglu_backward(void* dgate_up, const void* gate_up, const void* dout, int N, int Fh) const override {
    if (act16()) return shardgpt::swiglu_backward(H(dgate_up), H(gate_up), H(dout), N, Fh);
    shardgpt::swiglu_backward(F(dgate_up), F(gate_up), F(dout), N, Fh);
  }
  void kv_repeat_forward(void* out, const void* qkv, int N, int NH, int KV, int hs) const override {
    if (act16()) return shardgpt::kv_repeat_forward(H(out), H(qkv), N, NH, KV, hs);
    shardgpt::kv_repeat_forward(F(out), F(qkv), N, NH, KV, hs);
  }
  void kv_repeat_backward(void* dqkv, const void* dout, int N, int NH, int KV, int hs) const override {
    if (act16()) return shardgpt::kv_repeat_backward(H(dqkv), H(dout), N, NH, KV, hs);
    shardgpt::kv_repeat_backward(F(dqkv), F(dout), N, NH, KV, hs);
  }
  bool has_llama_kernels() const override { return true; }
  double crossentropy_softmax(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                              float dloss_scale) const override {
    if (act16()) return shardgpt::crossentropy_softmax(H(logits), losses, targets, N, V, Vp, dloss_scale);
    return shardgpt::crossentropy_softmax(F(logits), losses, targets, N, V, Vp, dloss_scale);
  }
  void crossentropy_softmax_acc(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                float dloss_scale, double* loss_acc) const override {
    crossentropy_softmax(logits, losses, targets, N, V, Vp, dloss_scale);
    shardgpt::add_mean_loss(loss_acc, losses, N);
  }
  void convert(const void* src, DType from, void* dst, DType to, size_t n) const override {
    shardgpt::convert(src, from, dst, to, n);
  }
  void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) const override {
    shardgpt::accumulate(dst, dtype, src, src_dtype, n);
  }
  double sum_squares(const void* x, DType dtype, size_t n) const override {
    return shardgpt::sum_squares(x, dtype, n);
  }
  void sum_squares_to(double* dst, const void* x, DType dtype, size_t n) const override {
    *dst = shardgpt::sum_squares(x, dtype, n);
  }
  void sum_f64(double* dst, const double* src, size_t n, double divisor) const override {
    shardgpt::sum_f64(dst, src, n, divisor);
  }
  void clip_factor(float* out, const double* ss, float grad_clip) const override {
    shardgpt::clip_factor(out, ss, grad_clip);
  }
  void begin_weight_reuse() override { weights_.Begin(); }
  void end_weight_reuse() override { weights_.End(); }
  void note_bf16_source(const float* widened, const void* bf16, size_t n) override {
    weights_.NoteSource(widened, static_cast<const uint16_t*>(bf16), n);
  }
  // The device is freeing [p, p + bytes): nothing derived from it may be served again.
  void ForgetMemory(const void* p, size_t bytes) { weights_.Forget(p, bytes); }
  void adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype, float* m,
                   float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg, int64_t t,
                   const float* grad_scale_dev, float grad_scale) const override {
    shardgpt::adamw_mixed(master, stored, stored_dtype, grad, grad_dtype, m, v, n, lr, weight_decay, cfg, t,
                          grad_scale_dev ? *grad_scale_dev : grad_scale);
  }

 private:
  bool bf16() const { return precision_ == MatmulPrecision::kBf16; }
  // Attention's products at kBf16: bf16 when Bf16AttentionProducts() (by default where the
  // batched oneDNN attention runs on bf16 dot-product instructions: faster than the fp32 tiles),
  // else fp32 (OpenBLAS tiles, on the widened activations).
  bool bf16_attention() const { return bf16() && Bf16AttentionProducts(); }
  bool act16() const { return act_dtype_ == DType::kBF16; }
  // Activation pointers as the kernels take them: fp32, or bf16 bits.
  static float* F(void* p) { return static_cast<float*>(p); }
  static const float* F(const void* p) { return static_cast<const float*>(p); }
  static uint16_t* H(void* p) { return static_cast<uint16_t*>(p); }
  static const uint16_t* H(const void* p) { return static_cast<const uint16_t*>(p); }
  // The bf16 weight copies of the current reuse window (mutable: the kernels are const calls;
  // the training thread only, as every kernel).
  mutable Bf16WeightCache weights_;
  // The GELU epilogue twins' fp32 matmul result and widened operand (the training thread's).
  mutable std::vector<float> x_, operand_;
};

class DoneEvent final : public DeviceEvent {
 public:
  void Synchronize() override {}
};

// With pretend_device_memory, the device also checks that every pointer it is given as device
// memory lies inside one of its allocations (as a GPU would fault on a host pointer), so tests
// of the device-memory paths fail loudly when host memory reaches them.
class CpuDeviceImpl final : public Device {
 public:
  explicit CpuDeviceImpl(bool pretend_device_memory) : pretend_(pretend_device_memory) {}
  std::string name() const override { return pretend_ ? "cpu (as device memory)" : "cpu"; }
  bool is_cuda() const override { return false; }
  bool host_accessible() const override { return !pretend_; }
  ~CpuDeviceImpl() override { ReleaseCache(); }
  void* Allocate(size_t bytes, const std::string& what) override { return AllocateBlock(bytes, what, true); }
  void* AllocateUnfilled(size_t bytes, const std::string& what) override { return AllocateBlock(bytes, what, false); }
  // Keeps the block for the next Allocate of its size (poisoned for ASan while cached, so a use
  // after Free is still reported).
  void Free(void* p) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      std::fprintf(stderr, "shardgpt: internal error: Device::Free given %p, which this device did not allocate\n", p);
      std::abort();
    }
    if (pretend_) allocations_.erase(reinterpret_cast<uintptr_t>(p));
    kernels_.ForgetMemory(p, it->second);
    ASAN_POISON_MEMORY_REGION(p, it->second);
    cached_.emplace(it->second, p);
    live_.erase(it);
  }
  // Allocations and frees of host memory from the system (calloc/free): a block taken from or
  // returned to the cache is neither. Host syncs: none (the CPU computes synchronously).
  DeviceCounters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceCounters c;
    c.allocations = system_allocations_, c.frees = system_frees_, c.known = true;
    return c;
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override { Move(Dev(dst, bytes, "CopyToDevice"), src, bytes); }
  void CopyToHost(void* dst, const void* src, size_t bytes) override { Move(dst, Dev(src, bytes, "CopyToHost"), bytes); }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Move(Dev(dst, bytes, "Copy"), Dev(src, bytes, "Copy"), bytes);
  }
  void Zero(void* p, size_t bytes) override {
    if (bytes) ZeroParallel(Dev(p, bytes, "Zero"), bytes);
  }
  void Synchronize() override {}
  std::shared_ptr<DeviceEvent> RecordEvent() override { return std::make_shared<DoneEvent>(); }
  void* AllocateHost(size_t bytes) override { return std::malloc(bytes > 0 ? bytes : 1); }
  void FreeHost(void* p) override { std::free(p); }
  void StageToHost(void* dst, const void* src, size_t bytes) override { Move(dst, Dev(src, bytes, "StageToHost"), bytes); }
  void StageToDevice(void* dst, const void* src, size_t bytes) override { Move(Dev(dst, bytes, "StageToDevice"), src, bytes); }
  Kernels& kernels() override { return kernels_; }

 private:
  // Allocate (zero: zero-filled) and AllocateUnfilled: a cached block of the rounded size, else calloc.
  void* AllocateBlock(size_t bytes, const std::string& what, bool zero) {
    if (bytes == 0) return nullptr;
    const size_t size = BlockSize(bytes);
    void* p = TakeCached(size);
    if (p != nullptr) {
      if (zero) ZeroParallel(p, size);
    } else {
      p = std::calloc(size, 1);
      if (p == nullptr) {  // what the cache holds may be what is missing
        ReleaseCache();
        p = std::calloc(size, 1);
      }
      if (p == nullptr)
        throw DeviceOutOfMemory("out of host memory allocating " + what + " (" + std::to_string(bytes) +
                                " bytes); try a higher --zero-stage or a smaller --micro-batch");
      std::lock_guard<std::mutex> lock(mu_);
      system_allocations_++;
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = size;
    if (pretend_) allocations_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  static void Move(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  // p, checked to be device memory when pretending.
  template <typename P>
  P Dev(P p, size_t bytes, const char* call) {
    if (!pretend_ || bytes == 0) return p;
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.upper_bound(a);
    if (it == allocations_.begin() || a + bytes > std::prev(it)->first + std::prev(it)->second) {
      std::fprintf(stderr, "shardgpt: internal error: Device::%s given %zu bytes at %p, which is not device memory\n",
                   call, bytes, static_cast<const void*>(p));
      std::abort();
    }
    return p;
  }
  // Why a block cache: a fresh calloc of a large block is mmap'ed, untouched pages, so the first
  // kernel to write it takes a page fault per 4 KiB page, from every thread at once, which costs
  // a large product (the tied LM head's weight gradient, allocated every step at --dtype bf16)
  // several times its compute. Blocks are reused by exact rounded size: a training step asks for
  // the same sizes every step, so from the second step on nothing comes from the system.
  static size_t BlockSize(size_t bytes) { return (bytes + 255) / 256 * 256; }
  void* TakeCached(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cached_.find(size);
    if (it == cached_.end()) return nullptr;
    void* p = it->second;
    cached_.erase(it);
    ASAN_UNPOISON_MEMORY_REGION(p, size);
    return p;
  }
  void ReleaseCache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : cached_) {
      ASAN_UNPOISON_MEMORY_REGION(p, size);
      std::free(p);
      system_frees_++;
    }
    cached_.clear();
  }
  // memset over the compute threads (one thread below 4 MiB): a reused block is written by one
  // pass instead of faulting; Zero's activation gradients (the backward's dinp buffers, ~40 MB
  // per block of the small config) in half the time of one thread's memset.
  static void ZeroParallel(void* p, size_t bytes) {
    constexpr size_t kChunk = size_t{1} << 20;
    const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
    char* c = static_cast<char*>(p);
#pragma omp parallel for schedule(static) num_threads(ComputeThreads()) if (chunks > 4)
    for (int64_t j = 0; j < chunks; j++) {
      const size_t off = static_cast<size_t>(j) * kChunk;
      std::memset(c + off, 0, std::min(kChunk, bytes - off));
    }
  }
  const bool pretend_;
  CpuKernels kernels_;
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> allocations_;  // pretend_ only: start -> bytes asked for
  std::unordered_map<void*, size_t> live_;   // allocated block -> its (rounded) size
  std::multimap<size_t, void*> cached_;      // freed blocks by size, for reuse
  uint64_t system_allocations_ = 0, system_frees_ = 0;
};

}  // namespace

Device& CpuDevice() {
  static CpuDeviceImpl device(false);
  return device;
}

std::unique_ptr<Device> NewCpuDevice(bool pretend_device_memory) {
  return std::make_unique<CpuDeviceImpl>(pretend_device_memory);
}

}  // namespace shardgpt
