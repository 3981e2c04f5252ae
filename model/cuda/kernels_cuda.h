// CudaKernels: the Kernels interface (model/kernels.h) on one GPU. Internal to model/cuda/:
// included only by the .cu files (it needs the CUDA headers).
//
// Files: kernels_cuda.cu   encoder, layernorm, gelu, residual (+ fused residual+layernorm), crossentropy, engine kernels
//        matmul_cuda.cu    matmuls through cuBLASLt (the GELU epilogues of --gelu fused), bias gradient
//        attention_cuda.cu flash-style causal attention, forward and backward
//        llama_cuda.cu     the Llama block: RMSNorm, rotary embeddings, SwiGLU, kv_repeat
//                          (CPU twins: model/kernels_cpu_llama.h)
// Each kernel's maths and shapes are those of its CPU twin (model/kernels_cpu.h, same name);
// the comment above each kernel names the twin and restates the maths.
//
// DETERMINISM: every kernel is bitwise reproducible run to run on the same GPU and build. No
// floating-point atomics anywhere; every sum is taken by one thread in a fixed order, or by a
// fixed reduction tree (warp butterflies, per-block partials added in block order) whose shape
// depends only on the problem size. Host-returned sums (losses, sum of squares) are finished
// on the host in double, in row / block order; the device-side ones (the *_acc / *_to
// kernels) by one thread in block order or a fixed block tree. The embedding backward sorts
// positions by token (integer compares, no atomics) so each wte row adds its positions in
// increasing order, as the CPU twin does. Matmuls reuse the cached cuBLASLt algorithm for
// their shape, and cuBLAS is deterministic for a fixed algorithm.
//
// Streams: every kernel runs on the device's compute stream; only the kernels returning a host
// value (crossentropy_softmax, sum_squares) wait for it. Their *_acc / *_to twins, the
// embedding backward (tokens sorted on the device) and everything else never wait.
// Thread contract: one caller thread (the training thread), as for every Kernels.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "base/status.h"
#include "model/bf16_source_notes.h"
#include "model/kernels.h"

namespace shardgpt {
namespace cuda {

// Throws std::runtime_error("CUDA: <call>: <error string> (<error name>)"), <call> being the
// function's name. For failures that have no error path (inside a kernel call).
[[noreturn]] void ThrowCudaError(const char* call, cudaError_t e);
[[noreturn]] void ThrowCublasError(const char* call, cublasStatus_t s);
inline void Check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) ThrowCudaError(call, e);
}
inline void CheckCublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) ThrowCublasError(call, s);
}
// "<error string> (<error name>, <code>)", e.g. "out of memory (cudaErrorMemoryAllocation, 2)".
std::string ErrorText(cudaError_t e);
// "<status string> (<status name>)", e.g. "the functionality requested is not supported (CUBLAS_STATUS_NOT_SUPPORTED)".
std::string CublasText(cublasStatus_t s);

}  // namespace cuda

#define SHARDGPT_CUDA_CHECK(call) ::shardgpt::cuda::Check((call), #call)
#define SHARDGPT_CUBLAS_CHECK(call) ::shardgpt::cuda::CheckCublas((call), #call)
// After a <<<...>>> launch: a bad configuration surfaces here, not at the next call.
#define SHARDGPT_CUDA_CHECK_LAUNCH(kernel_name) ::shardgpt::cuda::Check(cudaGetLastError(), kernel_name)

class CudaKernels final : public Kernels {
 public:
  // Uses (does not own) the device's compute stream. Init() before any kernel.
  CudaKernels(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaKernels() override;
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  // Creates the cuBLASLt handle and the matmul workspace; errors are one line.
  Status Init();

  void encoder_forward(void* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) const override;
  void encoder_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) const override;
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* w, const float* b,
                         int N, int C) const override;
  void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) const override;
  void matmul_forward(void* out, const void* inp, const float* w, const float* bias, int N, int C,
                      int OC) const override;
  void matmul_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const float* w,
                       int N, int C, int OC) const override;
  void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH) const override;
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                          int B, int T, int C, int NH) const override;
  void gelu_forward(void* out, const void* inp, size_t n) const override;
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) const override;
  void matmul_gelu_forward(void* out, void* pre, const void* inp, const float* w, const float* bias, int N, int C,
                           int OC) const override;
  void matmul_dgelu_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* pre,
                             const float* w, int N, int C, int OC) const override;
  void residual_forward(void* out, const void* a, const void* b, size_t n) const override;
  void residual_layernorm_forward(void* res_out, void* ln_out, float* mean, float* rstd, const void* a,
                                  const void* b, const float* w, const float* bias, int N, int C) const override;
  double crossentropy_softmax(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                              float dloss_scale) const override;
  void crossentropy_softmax_acc(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                float dloss_scale, double* loss_acc) const override;

  // The Llama block (llama_cuda.cu): maths, shapes and accumulation as the CPU twins.
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const float* w, int N, int C,
                       float eps) const override;
  void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const float* w, const float* rstd,
                        int N, int C) const override;
  void rope_forward(void* qkv, int B, int T, int NH, int KV, int hs, float theta) const override;
  void rope_backward(void* dqkv, int B, int T, int NH, int KV, int hs, float theta) const override;
  void swiglu_forward(void* out, const void* gate_up, int N, int F) const override;
  void swiglu_backward(void* dgate_up, const void* gate_up, const void* dout, int N, int F) const override;
  void kv_repeat_forward(void* out, const void* qkv, int N, int NH, int KV, int hs) const override;
  void kv_repeat_backward(void* dqkv, const void* dout, int N, int NH, int KV, int hs) const override;
  bool has_llama_kernels() const override { return true; }

  void convert(const void* src, DType from, void* dst, DType to, size_t n) const override;
  void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) const override;
  double sum_squares(const void* x, DType dtype, size_t n) const override;
  void sum_squares_to(double* dst, const void* x, DType dtype, size_t n) const override;
  void sum_f64(double* dst, const double* src, size_t n, double divisor) const override;
  void clip_factor(float* out, const double* ss, float grad_clip) const override;
  void adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype, float* m,
                   float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg, int64_t t,
                   const float* grad_scale_dev, float grad_scale) const override;

  // The weight reuse window for bf16 storage: inside it, a matmul operand lying in a noted fp32
  // compute copy is read from the bf16 parameters it was widened from (no Bf16Copy: no
  // conversion kernel, no scratch). ForgetMemory: CudaDevice::Free of [p, p + bytes) drops
  // every note touching it (a freed compute copy or gathered unit may hold other weights next).
  void begin_weight_reuse() override;
  void end_weight_reuse() override;
  void note_bf16_source(const float* widened, const void* bf16, size_t n) override;
  void ForgetMemory(const void* p, size_t bytes);
  // Matmul operands read from a noted bf16 source since this kernel set was made (tests).
  uint64_t operands_from_stored() const { return operands_from_stored_.load(); }
  // Forward biases read from a noted bf16 source (a bf16 D with its bf16 bias in one call).
  uint64_t biases_from_stored() const { return biases_from_stored_.load(); }
  // matmul_gelu_forward / matmul_dgelu_backward calls whose GELU ran in cuBLASLt's epilogue
  // (the others: an fp32 result, then the element-wise half as its own kernel) (tests).
  uint64_t gelu_in_epilogue() const { return gelu_in_epilogue_.load(); }
  // Matmul calls that took a fallback because cuBLASLt's heuristic failed or had no algorithm,
  // or an algorithm was refused at its call (tests).
  uint64_t gemm_fallbacks() const { return gemm_fallbacks_.load(); }
  // attention_forward / attention_backward calls that ran the bf16 tensor-core kernels
  // (attention_tc_cuda.cu; not cuDNN, not the fp32 CUDA-core kernels) (tests, train's --log rows).
  uint64_t tc_attention_forwards() const { return tc_attention_forwards_.load(); }
  uint64_t tc_attention_backwards() const { return tc_attention_backwards_.load(); }

  // --attention cudnn: attention through cuDNN's SDPA (attention_cudnn.cc; bf16 products
  // at every precision). Only where CudnnAttentionBuilt() (attention_cudnn.h).
  void set_cudnn_attention(bool on) { cudnn_attention_ = on; }

  // Bytes of the cuBLASLt workspace, allocated once by Init().
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

 private:
  // Slots of Scratch() (below): separate buffers for uses that overlap.
  enum ScratchSlot { kGeneral = 0, kOperandA = 1, kOperandB = 2, kResult = 3, kNumSlots = 4 };
  // Calls f(A{}) with A the activation storage: float, or uint16_t (bf16 bits).
  template <class F>
  void WithAct(F f) const {
    if (act_dtype_ == DType::kBF16) f(uint16_t{});
    else f(float{});
  }

  // ---- matmul_cuda.cu ----
  // Column-major GEMM on the compute stream, cuBLAS conventions:
  //   D[m,n] = op(A)[m,k] op(B)[k,n] + beta * D  (+ bias[m] broadcast over columns, if bias)
  // op(X) = X^T when the flag is set. Row-major callers swap operands (see matmul_forward).
  // kBf16: A and B are first rounded to bf16 copies (convert_kernel, RNE as base/bf16.h) and
  // multiplied as CUDA_R_16BF operands with CUBLAS_COMPUTE_32F: exactly bf16-rounded inputs,
  // fp32 accumulation, fp32 out. (CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands would let
  // cuBLAS choose bf16 or TF32 rounding: not what the CPU twin computes.)
  // Each operand fp32 or bf16 (an activation at bf16 activations); D fp32, or bf16 with kBf16
  // (cuBLASLt rounds the fp32 accumulation once). kExact widens bf16 operands to fp32 copies.
  // The bias has D's type (cuBLASLt's rule outside fp8: CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
  // gelu: kForward = GELU_AUX(_BIAS): D = gelu(x), aux = x; kBackward = DGELU (beta 0):
  // D = x * gelu'(aux); aux has D's type and layout (m x n, ld ldd). Returns false only for a
  // GELU epilogue that has no algorithm (nothing is written: the caller computes it another way).
  enum class GeluEpilogue { kNone, kForward, kBackward };
  bool Gemm(bool trans_a, bool trans_b, int m, int n, int k, const void* A, DType a_type, int lda, const void* B,
            DType b_type, int ldb, void* D, DType d_type, int ldd, float beta, const void* bias,
            GeluEpilogue gelu = GeluEpilogue::kNone, const void* aux = nullptr) const;
  // The bf16 copy of the column-major rows x cols matrix X (leading dimension ld) in `slot`.
  const uint16_t* Bf16Copy(const float* X, int rows, int cols, int ld, ScratchSlot slot) const;
  // The fp32 copy (exact) of a bf16 one.
  const float* F32Copy(const uint16_t* X, int rows, int cols, int ld, ScratchSlot slot) const;
  // One cuBLASLt configuration: descriptors and the heuristic's algorithm, made once per key.
  struct GemmKey {
    bool trans_a, trans_b;
    int m, n, k, lda, ldb, ldd;
    MatmulPrecision precision;
    bool bias;           // CUBLASLT_EPILOGUE_BIAS, or the GELU epilogue's _BIAS form
    bool accumulate;     // beta != 0
    uint32_t alignment;       // of the A, B and D pointers (bytes, power of 2, <= 256)
    uint32_t bias_alignment;  // of the bias pointer, which the heuristic reads itself (256 without)
    bool d_bf16;              // D (and C) CUDA_R_16BF, else CUDA_R_32F
    GeluEpilogue gelu;        // with bias: GELU_AUX_BIAS / DGELU; without: GELU_AUX / DGELU
    uint32_t aux_alignment;   // of the GELU epilogue's aux pointer, read by the heuristic too
    bool operator<(const GemmKey& o) const {
      return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldd, precision, bias, accumulate, alignment,
                      bias_alignment, d_bf16, gelu, aux_alignment) <
             std::tie(o.trans_a, o.trans_b, o.m, o.n, o.k, o.lda, o.ldb, o.ldd, o.precision, o.bias, o.accumulate,
                      o.alignment, o.bias_alignment, o.d_bf16, o.gelu, o.aux_alignment);
    }
  };
  // algos: the heuristic's algorithms in its order, those with a successful state; one that
  // cublasLtMatmul refuses is dropped, so later calls start at the next. Empty: the heuristic
  // had none or failed (any status): the caller's fallback runs.
  struct GemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    std::vector<cublasLtMatmulAlgo_t> algos;
    cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;  // for the error line
  };
  // Runs D = A B (+ beta D) with the plan's algorithms in order until one is accepted, with
  // this call's bias and GELU aux pointers (null: none) set on the plan's descriptor; false
  // when none is accepted (the plan is then empty).
  bool RunPlan(GemmPlan& plan, const void* a_op, const void* b_op, void* D, float beta, const void* bias,
               const void* aux) const;
  // The product on fp32 copies of bf16 operands into an fp32 result (rounded into a bf16 D):
  // the path where cuBLASLt has no bf16 algorithm for a call on bf16 activations.
  bool GemmWidened(bool trans_a, bool trans_b, int m, int n, int k, const void* A, DType a_type, int lda,
                   const void* B, DType b_type, int ldb, void* D, DType d_type, int ldd, float beta,
                   const void* bias) const;
  GemmPlan& Plan(const GemmKey& key, const void* bias, const void* aux) const;
  // At bf16 activations: whether cuBLASLt can write a forward matmul's result in bf16 itself
  // (bf16 products, and no bias or a bias noted as the widening of stored bf16 values: then
  // *d_bias = those bf16 values, the bias of D's type); else the fp32 result goes to scratch.
  bool Bf16ResultDirect(const float* bias, int OC, const void** d_bias) const;
  // dst[OC] += sum_n X[n, :] over X[N, OC], deterministic (matmul's dbias).
  void ColumnSums(float* dst, const void* X, int N, int OC) const;  // X in the activation dtype

  // ---- kernels_cuda.cu ----
  // Device scratch shared by all kernels (they run one after another on the compute stream),
  // grown on demand; the old buffer is freed only after the stream has drained. Slots are
  // separate buffers for uses that overlap: kGeneral (partial sums, index lists), kOperandA and
  // kOperandB (a bf16 matmul's bf16 copies of its two inputs).
  void* Scratch(size_t bytes, ScratchSlot slot = kGeneral) const;
  // The GELU epilogues' element-wise halves on an fp32 matmul result x, where no cuBLASLt
  // epilogue serves (CPU twins gelu_epilogue_forward / _backward): pre = x, out = gelu(x)
  // (activation dtype); dinp = x * gelu'(pre) (writes).
  void GeluEpilogueForward(void* out, void* pre, const float* x, size_t n) const;
  void GeluEpilogueBackward(void* dinp, const void* pre, const float* x, size_t n) const;
  // sum_squares' per-block partials (in the general scratch); *blocks = their count.
  double* SumSquaresPartials(const void* x, DType dtype, size_t n, unsigned* blocks) const;
  // Makes this thread's current device ours (cheap; kernels may be called from any thread).
  void Bind() const;

  const int device_;
  const cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  mutable std::map<GemmKey, GemmPlan> plans_;
  Bf16SourceNotes sources_;  // note_bf16_source's notes of the open window
  mutable std::atomic<uint64_t> operands_from_stored_{0};
  mutable std::atomic<uint64_t> biases_from_stored_{0};
  mutable std::atomic<uint64_t> gemm_fallbacks_{0};
  mutable std::atomic<uint64_t> gelu_in_epilogue_{0};
  mutable std::atomic<uint64_t> tc_attention_forwards_{0}, tc_attention_backwards_{0};
  bool cudnn_attention_ = false;
  mutable void* scratch_[kNumSlots] = {};
  mutable size_t scratch_bytes_[kNumSlots] = {};
  // Host staging of the losses and the sum-of-squares partials (the host-returning kernels).
  mutable std::vector<float> host_floats_;
  mutable std::vector<double> host_doubles_;
};

}  // namespace shardgpt
