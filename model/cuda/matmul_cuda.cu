// Matmuls through cuBLASLt, and the bias gradient. CPU twins: matmul_forward / matmul_backward
// (and, with the GELU in the epilogue, matmul_gelu_forward / matmul_dgelu_backward).
//
//   forward:  out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC]                  (bias may be null)
//   backward: dinp[N,C] += dout[N,OC] @ w;  dw[OC,C] += dout^T @ inp;  dbias[OC] += sum_n dout[n,:]
//
// Row-major to cuBLAS's column-major: a row-major X[r,c] is the column-major X^T, so
// "out = inp @ w^T" is "out^T = w @ inp^T" in column-major: A = w (seen C x OC, transposed),
// B = inp (C x N), D = out (OC x N). The bias, one value per row of that D, is added in the
// epilogue (CUBLASLT_EPILOGUE_BIAS). The backward GEMMs accumulate with beta = 1. dbias is NOT
// the BGRADB epilogue (that one overwrites; ours accumulates): it is our own column sum with a
// fixed reduction order.
//
// Precision: kExact = fp32 operands, CUBLAS_COMPUTE_32F (cuBLASLt uses TF32 only when asked
// for by CUBLAS_COMPUTE_32F_FAST_TF32, so products are fp32); kBf16 = bf16 copies of A and B
// (RNE, as the CPU twin rounds them) as CUDA_R_16BF operands, CUBLAS_COMPUTE_32F: tensor cores
// on exactly bf16-rounded inputs, fp32 accumulation, fp32 D. Not CUBLAS_COMPUTE_32F_FAST_16BF
// on fp32 operands: cuBLAS documents that one as free to round the inputs to bf16 or to TF32.
//
// bf16 activations (Kernels::activation_dtype()): the activation operands (inp, dout) are
// CUDA_R_16BF as stored, only the fp32 weight gets a bf16 copy; D is bf16 where cuBLASLt can
// round the fp32 accumulation itself (no bias: the LM head, and dinp with beta = 1 reading the
// bf16 dinp), else fp32 in scratch rounded once after (a bias epilogue stays fp32, as the CPU
// twin adds an fp32 bias). kExact at bf16 activations widens the operands to fp32 copies.
//
// A shape with no kBf16 algorithm (cuBLASLt's choice, e.g. for unaligned pointers) runs as
// kExact (fp32 operands only; on bf16 activations it is an error naming the shape); one with no
// bias-epilogue algorithm gets the bias written first and accumulates onto it.
//
// --gelu fused (matmul_gelu_forward / matmul_dgelu_backward, at the end): the fc matmul with
// GELU_AUX_BIAS (D = gelu(x + bias), aux = x + bias, both rounded once from fp32) and the fc
// projection's data gradient with DGELU (beta 0: D = x * gelu'(aux)). aux has D's type and
// layout (AUX_LD = ldd; AUX_DATA_TYPE left unset: D's type outside fp8). cuBLASLt's GELU is its
// own tanh approximation, not gelu_forward's instructions: the results agree to rounding.
//
// Algorithms: the heuristic is asked once per (shape, transposes, leading dimensions, precision,
// epilogue, beta, pointer alignments); its answer and the descriptors are kept in plans_. One
// algorithm per shape also keeps results bitwise reproducible (cuBLAS is deterministic for a
// fixed algorithm; split-K reductions, if chosen, are ordered).
#include <string>

#include "model/cuda/device_util.cuh"
#include "model/cuda/launch.cuh"
#include "model/cuda/kernels_cuda.h"

namespace shardgpt {

namespace {

// out[n, o] = bias[o]: the fallback when no bias-epilogue algorithm exists for a shape (fp32, or
// bf16 out with its bf16 bias).
template <typename T>
__global__ void broadcast_bias_kernel(T* out, const T* bias, int N, int OC) {
  const size_t total = (size_t)N * OC;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
    out[i] = bias[i % OC];
}

// D[m x n] (contiguous, D's type) = bias[m] broadcast to every column.
void BroadcastBias(void* D, DType d_type, const void* bias, int m, int n, cudaStream_t stream) {
  if (d_type == DType::kF32)
    SHARDGPT_LAUNCH(broadcast_bias_kernel<float>, cuda::GridFor((size_t)m * n, 256), 256, 0, stream)(
        static_cast<float*>(D), static_cast<const float*>(bias), n, m);
  else
    SHARDGPT_LAUNCH(broadcast_bias_kernel<uint16_t>, cuda::GridFor((size_t)m * n, 256), 256, 0, stream)(
        static_cast<uint16_t*>(D), static_cast<const uint16_t*>(bias), n, m);
  SHARDGPT_CUDA_CHECK_LAUNCH("broadcast_bias_kernel");
}

// Partial column sums of X[N, OC] over one chunk of kRowsPerChunk rows (blockIdx.y) for 32
// columns (blockIdx.x). Block (32, 8): thread (x, y) sums rows y, y+8, ... of the chunk in order,
// then row y = 0 adds the 8 sums in order.  partial[chunk][o] = sum_{n in chunk} X[n, o]
template <typename A>
__global__ void column_sums_partial_kernel(float* partial, const A* X, int N, int OC) {
  SHARDGPT_SHARED(float, s, [8][33]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int o = blockIdx.x * 32 + tx;
  const int n0 = blockIdx.y * cuda::kRowsPerChunk, n1 = min(N, n0 + cuda::kRowsPerChunk);
  float acc = 0.0f;
  if (o < OC)
    for (int n = n0 + ty; n < n1; n += 8) acc += cuda::load_f32(X, (size_t)n * OC + o);
  s[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && o < OC) {
    float sum = 0.0f;
    for (int k = 0; k < 8; k++) sum += s[k][tx];
    partial[(size_t)blockIdx.y * OC + o] = sum;
  }
}

// Largest power of two (<= 256) dividing the address: what the heuristic may assume.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return low >= 256 ? 256u : static_cast<uint32_t>(low);
}

}  // namespace

namespace {
struct PreferenceHandle {  // destroys the heuristic's preference descriptor on every path
  cublasLtMatmulPreference_t pref = nullptr;
  ~PreferenceHandle() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
};
}  // namespace

// Made once per key. The plan enters plans_ before its descriptors are made, so that the
// destructor frees them even if a call below throws.
CudaKernels::GemmPlan& CudaKernels::Plan(const GemmKey& key, const void* bias, const void* aux) const {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  GemmPlan& p = plans_.emplace(key, GemmPlan{}).first->second;
  const bool bf16 = key.precision == MatmulPrecision::kBf16;
  const cudaDataType_t operand_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t d_type = key.d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t epilogue = key.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (key.gelu == GeluEpilogue::kForward)
    epilogue = key.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (key.gelu == GeluEpilogue::kBackward) epilogue = CUBLASLT_EPILOGUE_DGELU;
  SHARDGPT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (key.gelu != GeluEpilogue::kNone) {
    // aux: D's layout and (left unset, cuBLASLt's default outside fp8) D's type; the heuristic
    // reads the pointer's value for its alignment, as the bias's.
    const int64_t aux_ld = key.ldd;
    SHARDGPT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    SHARDGPT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  if (key.bias) {
    const cudaDataType_t bias_type = d_type;  // D's type: cuBLASLt's rule outside fp8
    SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                         sizeof(bias_type)));
    // The heuristic reads the pointer's value for its alignment.
    SHARDGPT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // Stored shapes (rows x cols, column-major) of A, B and D (D is also C: beta reads it).
  SHARDGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, operand_type, key.trans_a ? key.k : key.m,
                                                   key.trans_a ? key.m : key.k, key.lda));
  SHARDGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, operand_type, key.trans_b ? key.n : key.k,
                                                   key.trans_b ? key.k : key.n, key.ldb));
  SHARDGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, d_type, key.m, key.n, key.ldd));

  PreferenceHandle ph;
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&ph.pref));
  const uint64_t ws = kWorkspaceBytes;
  SHARDGPT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(ph.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The bias pointer's alignment is the heuristic's own reading (of BIAS_POINTER), so it is part
  // of the key: a later, less aligned bias must not reuse this plan.
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    SHARDGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ph.pref, attr, &key.alignment, sizeof(key.alignment)));
  }
  // Up to kAlgos candidates, in the heuristic's order. Any failure of the heuristic
  // (NOT_SUPPORTED: none for this configuration; any other status: it could not choose) leaves
  // the plan empty, and the caller falls back (the bias broadcast, fp32 products, widened
  // operands) or names the shape.
  constexpr int kAlgos = 4;
  cublasLtMatmulHeuristicResult_t results[kAlgos] = {};
  int found = 0;
  p.heuristic_status = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.d, p.d, ph.pref, kAlgos, results, &found);
  if (p.heuristic_status == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found && i < kAlgos; i++)
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes)
        p.algos.push_back(results[i].algo);
  return p;
}

bool CudaKernels::RunPlan(GemmPlan& plan, const void* a_op, const void* b_op, void* D, float beta, const void* bias,
                          const void* aux) const {
  if (plan.algos.empty()) return false;
  // this call's pointers: the plan's descriptor is shared by every call of its key
  if (bias)
    SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (aux)
    SHARDGPT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  const float alpha = 1.0f;
  while (!plan.algos.empty()) {
    const cublasStatus_t s = cublasLtMatmul(lt_, plan.desc, &alpha, a_op, plan.a, b_op, plan.b, &beta, D, plan.d, D,
                                            plan.d, &plan.algos.front(), workspace_, kWorkspaceBytes, stream_);
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    // refused at its call (nothing was queued): this shape's next candidate, now and later
    plan.algos.erase(plan.algos.begin());
    gemm_fallbacks_++;
  }
  return false;
}

// fp32 copies of the bf16 operands (kOperandA/B), an fp32 result in kResult (a bf16 D widened
// into it first where beta reads it, or the bf16 bias broadcast into D first), then one rounding
// into D: the bf16 activations' path where cuBLASLt has no bf16 algorithm.
bool CudaKernels::GemmWidened(bool trans_a, bool trans_b, int m, int n, int k, const void* A, DType a_type, int lda,
                              const void* B, DType b_type, int ldb, void* D, DType d_type, int ldd, float beta,
                              const void* bias) const {
  const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const void* a32 = a_type == DType::kBF16 ? F32Copy(static_cast<const uint16_t*>(A), a_rows, a_cols, lda, kOperandA) : A;
  const void* b32 = b_type == DType::kBF16 ? F32Copy(static_cast<const uint16_t*>(B), b_rows, b_cols, ldb, kOperandB) : B;
  const size_t span = (size_t)(n - 1) * ldd + m;  // D's elements, column-major with leading dimension ldd
  if (bias) {  // D = bias (D's type), then D += A B: as the bias fallback below (ldd == m)
    BroadcastBias(D, d_type, bias, m, n, stream_);
    beta = 1.0f;
  }
  void* d32 = D;
  if (d_type == DType::kBF16) {
    d32 = Scratch(sizeof(float) * span, kResult);
    if (beta != 0.0f) convert(D, DType::kBF16, d32, DType::kF32, span);
  }
  GemmKey key{trans_a, trans_b, m, n, k, lda, ldb, ldd, MatmulPrecision::kExact, false, beta != 0.0f,
              std::min(std::min(Alignment(a32), Alignment(b32)), Alignment(d32)), 256u, false, GeluEpilogue::kNone,
              256u};
  if (!RunPlan(Plan(key, nullptr, nullptr), a32, b32, d32, beta, nullptr, nullptr)) return false;
  if (d_type == DType::kBF16) convert(d32, DType::kF32, D, DType::kBF16, span);
  return true;
}

bool CudaKernels::Gemm(bool trans_a, bool trans_b, int m, int n, int k, const void* A, DType a_type, int lda,
                       const void* B, DType b_type, int ldb, void* D, DType d_type, int ldd, float beta,
                       const void* bias, GeluEpilogue gelu, const void* aux) const {
  // The operands as the plan reads them, of one type: at kBf16 the bf16 operands as they are
  // (activations) and bf16 copies (256-byte aligned scratch) of the fp32 ones (weights); at
  // kExact fp32 copies of the bf16 ones (widening is exact). D is fp32, or bf16 at kBf16.
  const bool bf16 = precision_ == MatmulPrecision::kBf16;
  if (d_type == DType::kBF16 && !bf16)
    throw std::logic_error("CudaKernels::Gemm: a bf16 result needs bf16 products (the callers round fp32 ones)");
  const void* a_op = A;
  const void* b_op = B;
  const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  if (bf16 && a_type == DType::kF32) a_op = Bf16Copy(static_cast<const float*>(A), a_rows, a_cols, lda, kOperandA);
  if (bf16 && b_type == DType::kF32) b_op = Bf16Copy(static_cast<const float*>(B), b_rows, b_cols, ldb, kOperandB);
  if (!bf16 && a_type == DType::kBF16) a_op = F32Copy(static_cast<const uint16_t*>(A), a_rows, a_cols, lda, kOperandA);
  if (!bf16 && b_type == DType::kBF16) b_op = F32Copy(static_cast<const uint16_t*>(B), b_rows, b_cols, ldb, kOperandB);
  const uint32_t align = std::min(std::min(Alignment(a_op), Alignment(b_op)), Alignment(D));
  const uint32_t bias_align = bias ? Alignment(bias) : 256u;
  const bool with_gelu = gelu != GeluEpilogue::kNone;
  GemmKey key{trans_a, trans_b, m, n, k, lda, ldb, ldd, precision_, bias != nullptr, beta != 0.0f, align, bias_align,
              d_type == DType::kBF16, gelu, with_gelu ? Alignment(aux) : 256u};
  GemmPlan* found = &Plan(key, bias, aux);
  if (RunPlan(*found, a_op, b_op, D, beta, bias, with_gelu ? aux : nullptr)) return true;
  const std::string heuristic = cuda::CublasText(found->heuristic_status);
  if (key.precision == MatmulPrecision::kBf16) {
    // No bf16 algorithm for this configuration: this shape runs on fp32 operands, into an fp32
    // result (bf16 activations: fp32 copies of them, the result rounded once into D).
    if (with_gelu) return false;  // the caller's fp32 route (the separate GELU) takes it
    gemm_fallbacks_++;
    if (a_type == DType::kBF16 || b_type == DType::kBF16 || d_type == DType::kBF16) {
      if (GemmWidened(trans_a, trans_b, m, n, k, A, a_type, lda, B, b_type, ldb, D, d_type, ldd, beta, bias)) return true;
      throw std::runtime_error("CUDA: cuBLASLt has no algorithm for a " + std::to_string(m) + "x" + std::to_string(n) +
                               "x" + std::to_string(k) + " matmul on bf16 activations, in bf16 or in fp32 (heuristic: " +
                               heuristic + ")");
    }
    key.precision = MatmulPrecision::kExact;
    key.alignment = std::min(std::min(Alignment(A), Alignment(B)), Alignment(D));
    a_op = A, b_op = B;
    found = &Plan(key, bias, aux);
    if (RunPlan(*found, a_op, b_op, D, beta, bias, nullptr)) return true;
  }
  if (with_gelu) return false;
  if (bias) {
    // No epilogue algorithm for this shape: D = bias broadcast (D is contiguous: ldd == m, as in
    // matmul_forward, the only caller with a bias), then D += A B (rounded once: a bf16 bias is
    // exactly representable in the bf16 D it is broadcast into).
    BroadcastBias(D, d_type, bias, m, n, stream_);
    gemm_fallbacks_++;
    return Gemm(trans_a, trans_b, m, n, k, A, a_type, lda, B, b_type, ldb, D, d_type, ldd, 1.0f, nullptr);
  }
  throw std::runtime_error("CUDA: cuBLASLt has no algorithm for a " + std::to_string(m) + "x" + std::to_string(n) +
                           "x" + std::to_string(k) + " matmul (alignment " + std::to_string(align) +
                           " bytes; heuristic: " + heuristic + ")");
}

void CudaKernels::ColumnSums(float* dst, const void* X, int N, int OC) const {
  const int chunks = (N + cuda::kRowsPerChunk - 1) / cuda::kRowsPerChunk;
  float* partial = static_cast<float*>(Scratch(sizeof(float) * chunks * OC));
  const dim3 grid((OC + 31) / 32, chunks), block(32, 8);
  if (act_dtype_ == DType::kBF16)
    SHARDGPT_LAUNCH(column_sums_partial_kernel<uint16_t>, grid, block, 0, stream_)(
        partial, static_cast<const uint16_t*>(X), N, OC);
  else
    SHARDGPT_LAUNCH(column_sums_partial_kernel<float>, grid, block, 0, stream_)(partial, static_cast<const float*>(X),
                                                                                N, OC);
  SHARDGPT_CUDA_CHECK_LAUNCH("column_sums_partial_kernel");
  SHARDGPT_LAUNCH(add_chunk_sums_kernel, (OC + 255) / 256, 256, 0, stream_)(dst, partial, chunks, OC, OC);
  SHARDGPT_CUDA_CHECK_LAUNCH("add_chunk_sums_kernel");
}

bool CudaKernels::Bf16ResultDirect(const float* bias, int OC, const void** d_bias) const {
  if (precision_ != MatmulPrecision::kBf16) return false;
  if (bias == nullptr) return true;
  const uint16_t* stored = sources_.Find(bias, OC);
  if (stored == nullptr) return false;
  *d_bias = stored;
  biases_from_stored_++;
  return true;
}

// out^T (OC x N) = w^T(stored C x OC, transposed) @ inp^T (C x N) + bias
// bf16 activations: inp goes to cuBLASLt as it is; out is written in bf16 by cuBLASLt itself
// (bf16 products, fp32 accumulation, one rounding) when there is no bias, or when the fp32 bias
// is a noted widening of stored bf16 values (bf16 storage: the bias epilogue of a bf16 D takes a
// bf16 bias, and that one is the fp32 bias exactly). Else (an fp32 bias that may not be bf16
// values, or fp32 products) the fp32 result goes to scratch and is rounded into out once: 8
// bytes per output element more of memory traffic.
void CudaKernels::matmul_forward(void* out, const void* inp, const float* w, const float* bias, int N, int C,
                                 int OC) const {
  if (N == 0 || OC == 0) return;
  Bind();
  const DType act = act_dtype_;
  const void* d_bias = bias;
  const bool direct = act == DType::kF32 || (C > 0 && Bf16ResultDirect(bias, OC, &d_bias));
  void* D = direct ? out : Scratch(sizeof(float) * N * OC, kResult);
  const DType d_type = direct ? act : DType::kF32;
  if (C == 0) {  // empty product: out = bias (or 0)
    if (bias) {
      SHARDGPT_LAUNCH(broadcast_bias_kernel<float>, cuda::GridFor((size_t)N * OC, 256), 256, 0, stream_)(
          static_cast<float*>(D), bias, N, OC);
      SHARDGPT_CUDA_CHECK_LAUNCH("broadcast_bias_kernel");
    } else {
      SHARDGPT_CUDA_CHECK(cudaMemsetAsync(D, 0, DTypeSize(d_type) * N * OC, stream_));
    }
  } else {
    Gemm(/*trans_a=*/true, /*trans_b=*/false, /*m=*/OC, /*n=*/N, /*k=*/C, w, DType::kF32, C, inp, act, C, D, d_type,
         OC, 0.0f, d_bias);
  }
  if (!direct) convert(D, DType::kF32, out, act, (size_t)N * OC);
}

// bf16 activations: dinp += in bf16 by cuBLASLt (beta = 1 reads the bf16 dinp, one rounding of
// fp32(dinp) + product) at bf16 products; at fp32 products dinp is widened into scratch, added
// to there and rounded back. dw (fp32) reads inp and dout as they are stored.
void CudaKernels::matmul_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                                  const float* w, int N, int C, int OC) const {
  if (N == 0 || C == 0 || OC == 0) return;
  Bind();
  const DType act = act_dtype_;
  if (dinp) {
    // dinp^T (C x N) += w (stored C x OC) @ dout^T (OC x N)
    const bool direct = act == DType::kF32 || precision_ == MatmulPrecision::kBf16;
    void* D = direct ? dinp : Scratch(sizeof(float) * N * C, kResult);
    if (!direct) convert(dinp, act, D, DType::kF32, (size_t)N * C);
    Gemm(false, false, /*m=*/C, /*n=*/N, /*k=*/OC, w, DType::kF32, C, dout, act, OC, D, direct ? act : DType::kF32,
         C, 1.0f, nullptr);
    if (!direct) convert(D, DType::kF32, dinp, act, (size_t)N * C);
  }
  // dw^T (C x OC) += inp^T (C x N) @ (dout^T (OC x N))^T
  if (dw) Gemm(false, true, /*m=*/C, /*n=*/OC, /*k=*/N, inp, act, C, dout, act, OC, dw, DType::kF32, C, 1.0f, nullptr);
  if (dbias) ColumnSums(dbias, dout, N, OC);
}

// The fc matmul with its GELU (Kernels::matmul_gelu_forward). Where the fast path's conditions
// hold (matmul_forward's `direct`: D in the activation dtype, its bias of D's type) one
// cuBLASLt call with GELU_AUX_BIAS writes out = gelu(x) and pre = x, each rounded once from the
// fp32 x: no GELU pass, and pre is not read back. Otherwise (fp32 products on bf16
// activations, an fp32 bias that is not stored bf16 values, or no algorithm with the epilogue)
// x goes to fp32 scratch and gelu_epilogue_forward_kernel writes both: the same arithmetic.
void CudaKernels::matmul_gelu_forward(void* out, void* pre, const void* inp, const float* w, const float* bias, int N,
                                      int C, int OC) const {
  if (N == 0 || OC == 0) return;
  Bind();
  const size_t n = static_cast<size_t>(N) * OC;
  if (C == 0) {  // empty product: x = bias (or 0), as matmul_forward writes it
    matmul_forward(pre, inp, w, bias, N, C, OC);
    return gelu_forward(out, pre, n);
  }
  const DType act = act_dtype_;
  const void* d_bias = bias;
  const bool direct = act == DType::kF32 || Bf16ResultDirect(bias, OC, &d_bias);
  if (direct && Gemm(true, false, OC, N, C, w, DType::kF32, C, inp, act, C, out, act, OC, 0.0f, d_bias,
                     GeluEpilogue::kForward, pre)) {
    gelu_in_epilogue_++;
    return;
  }
  float* x = static_cast<float*>(Scratch(sizeof(float) * n, kResult));
  Gemm(true, false, OC, N, C, w, DType::kF32, C, inp, act, C, x, DType::kF32, OC, 0.0f, bias);
  GeluEpilogueForward(out, pre, x, n);
}

// The fc projection's backward with the GELU's (Kernels::matmul_dgelu_backward): dinp =
// (dout @ w) * gelu'(pre) by cuBLASLt's DGELU epilogue (beta 0: it writes), where D can be the
// activation dtype (matmul_backward's `direct`); else the fp32 product in scratch and
// gelu_epilogue_backward_kernel. dw and dbias as matmul_backward's.
void CudaKernels::matmul_dgelu_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                                        const void* pre, const float* w, int N, int C, int OC) const {
  if (N == 0 || C == 0) return;
  Bind();
  const DType act = act_dtype_;
  const size_t n = static_cast<size_t>(N) * C;
  if (OC == 0) {  // empty product: dinp = 0
    SHARDGPT_CUDA_CHECK(cudaMemsetAsync(dinp, 0, DTypeSize(act) * n, stream_));
    return;
  }
  const bool direct = act == DType::kF32 || precision_ == MatmulPrecision::kBf16;
  if (direct && Gemm(false, false, C, N, OC, w, DType::kF32, C, dout, act, OC, dinp, act, C, 0.0f, nullptr,
                     GeluEpilogue::kBackward, pre)) {
    gelu_in_epilogue_++;
  } else {
    float* x = static_cast<float*>(Scratch(sizeof(float) * n, kResult));
    Gemm(false, false, C, N, OC, w, DType::kF32, C, dout, act, OC, x, DType::kF32, C, 0.0f, nullptr);
    GeluEpilogueBackward(dinp, pre, x, n);
  }
  matmul_backward(nullptr, dw, dbias, dout, inp, w, N, C, OC);
}

}  // namespace shardgpt
