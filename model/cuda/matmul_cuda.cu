// Matmuls through cuBLASLt, and the bias gradient. CPU twins: matmul_forward / matmul_backward.
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
// A shape with no kBf16 algorithm (cuBLASLt's choice, e.g. for unaligned pointers) runs as
// kExact; one with no bias-epilogue algorithm gets the bias written first and accumulates onto it.
//
// Algorithms: the heuristic is asked once per (shape, transposes, leading dimensions, precision,
// epilogue, beta, pointer alignment); its answer and the descriptors are kept in plans_. One
// algorithm per shape also keeps results bitwise reproducible (cuBLAS is deterministic for a
// fixed algorithm; split-K reductions, if chosen, are ordered).
#include <string>

#include "model/cuda/device_util.cuh"
#include "model/cuda/launch.cuh"
#include "model/cuda/kernels_cuda.h"

namespace shardgpt {

namespace {

// out[n, o] = bias[o]: the fallback when no bias-epilogue algorithm exists for a shape.
__global__ void broadcast_bias_kernel(float* out, const float* bias, int N, int OC) {
  const size_t total = (size_t)N * OC;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
    out[i] = bias[i % OC];
}

// Partial column sums of X[N, OC] over one chunk of kRowsPerChunk rows (blockIdx.y) for 32
// columns (blockIdx.x). Block (32, 8): thread (x, y) sums rows y, y+8, ... of the chunk in order,
// then row y = 0 adds the 8 sums in order.  partial[chunk][o] = sum_{n in chunk} X[n, o]
__global__ void column_sums_partial_kernel(float* partial, const float* X, int N, int OC) {
  __shared__ float s[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int o = blockIdx.x * 32 + tx;
  const int n0 = blockIdx.y * cuda::kRowsPerChunk, n1 = min(N, n0 + cuda::kRowsPerChunk);
  float acc = 0.0f;
  if (o < OC)
    for (int n = n0 + ty; n < n1; n += 8) acc += X[(size_t)n * OC + o];
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
CudaKernels::GemmPlan& CudaKernels::Plan(const GemmKey& key, const float* bias) const {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  GemmPlan& p = plans_.emplace(key, GemmPlan{}).first->second;
  const bool bf16 = key.precision == MatmulPrecision::kBf16;
  const cudaDataType_t operand_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t epilogue = key.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  SHARDGPT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (key.bias) {
    const cudaDataType_t bias_type = CUDA_R_32F;
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
  SHARDGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, key.m, key.n, key.ldd));

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
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.d, p.d, ph.pref, 1, &result, &found);
  // NOT_SUPPORTED: no algorithm for this configuration; the caller falls back (bias) or fails.
  if (s != CUBLAS_STATUS_NOT_SUPPORTED) cuda::CheckCublas(s, "cublasLtMatmulAlgoGetHeuristic");
  p.found = s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.found) p.algo = result.algo;
  return p;
}

void CudaKernels::Gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B,
                       int ldb, float* D, int ldd, float beta, const float* bias) const {
  // The operands as the plan reads them: bf16 copies (256-byte aligned scratch) for kBf16.
  const void* a_op = A;
  const void* b_op = B;
  if (precision_ == MatmulPrecision::kBf16) {
    a_op = Bf16Copy(A, trans_a ? k : m, trans_a ? m : k, lda, kOperandA);
    b_op = Bf16Copy(B, trans_b ? n : k, trans_b ? k : n, ldb, kOperandB);
  }
  const uint32_t align = std::min(std::min(Alignment(a_op), Alignment(b_op)), Alignment(D));
  const uint32_t bias_align = bias ? Alignment(bias) : 256u;
  GemmKey key{trans_a, trans_b, m, n, k, lda, ldb, ldd, precision_, bias != nullptr, beta != 0.0f, align, bias_align};
  GemmPlan* found = &Plan(key, bias);
  if (!found->found && key.precision == MatmulPrecision::kBf16) {
    // No bf16 algorithm for this configuration: this shape runs in fp32, on the fp32 inputs.
    key.precision = MatmulPrecision::kExact;
    key.alignment = std::min(std::min(Alignment(A), Alignment(B)), Alignment(D));
    a_op = A, b_op = B;
    found = &Plan(key, bias);
  }
  GemmPlan& plan = *found;
  if (!plan.found && bias) {
    // No epilogue algorithm for this shape: D = bias broadcast (D is contiguous: ldd == m, as in
    // matmul_forward, the only caller with a bias), then D += A B.
    SHARDGPT_LAUNCH(broadcast_bias_kernel, cuda::GridFor((size_t)m * n, 256), 256, 0, stream_)(D, bias, n, m);
    SHARDGPT_CUDA_CHECK_LAUNCH("broadcast_bias_kernel");
    Gemm(trans_a, trans_b, m, n, k, A, lda, B, ldb, D, ldd, 1.0f, nullptr);
    return;
  }
  if (!plan.found)
    throw std::runtime_error("CUDA: cublasLtMatmulAlgoGetHeuristic: no algorithm for a " + std::to_string(m) + "x" +
                             std::to_string(n) + "x" + std::to_string(k) + " matmul (alignment " +
                             std::to_string(align) + " bytes)");
  if (bias)
    SHARDGPT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f;
  SHARDGPT_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, a_op, plan.a, b_op, plan.b, &beta, D, plan.d, D,
                                       plan.d, &plan.algo, workspace_, kWorkspaceBytes, stream_));
}

void CudaKernels::ColumnSums(float* dst, const float* X, int N, int OC) const {
  const int chunks = (N + cuda::kRowsPerChunk - 1) / cuda::kRowsPerChunk;
  float* partial = static_cast<float*>(Scratch(sizeof(float) * chunks * OC));
  SHARDGPT_LAUNCH(column_sums_partial_kernel, dim3((OC + 31) / 32, chunks), dim3(32, 8), 0, stream_)(partial, X, N, OC);
  SHARDGPT_CUDA_CHECK_LAUNCH("column_sums_partial_kernel");
  SHARDGPT_LAUNCH(add_chunk_sums_kernel, (OC + 255) / 256, 256, 0, stream_)(dst, partial, chunks, OC, OC);
  SHARDGPT_CUDA_CHECK_LAUNCH("add_chunk_sums_kernel");
}

// out^T (OC x N) = w^T(stored C x OC, transposed) @ inp^T (C x N) + bias
void CudaKernels::matmul_forward(void* out_v, const void* inp_v, const float* w, const float* bias, int N, int C,
                                 int OC) const {
  float* out = static_cast<float*>(out_v);
  const float* inp = static_cast<const float*>(inp_v);
  if (N == 0 || OC == 0) return;
  Bind();
  if (C == 0) {  // empty product: out = bias (or 0)
    if (bias) {
      SHARDGPT_LAUNCH(broadcast_bias_kernel, cuda::GridFor((size_t)N * OC, 256), 256, 0, stream_)(out, bias, N, OC);
      SHARDGPT_CUDA_CHECK_LAUNCH("broadcast_bias_kernel");
    } else {
      SHARDGPT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * N * OC, stream_));
    }
    return;
  }
  Gemm(/*trans_a=*/true, /*trans_b=*/false, /*m=*/OC, /*n=*/N, /*k=*/C, w, C, inp, C, out, OC, 0.0f, bias);
}

void CudaKernels::matmul_backward(void* dinp_v, float* dw, float* dbias, const void* dout_v, const void* inp_v,
                                  const float* w, int N, int C, int OC) const {
  float* dinp = static_cast<float*>(dinp_v);
  const float* dout = static_cast<const float*>(dout_v);
  const float* inp = static_cast<const float*>(inp_v);
  if (N == 0 || C == 0 || OC == 0) return;
  Bind();
  // dinp^T (C x N) += w (stored C x OC) @ dout^T (OC x N)
  if (dinp) Gemm(false, false, /*m=*/C, /*n=*/N, /*k=*/OC, w, C, dout, OC, dinp, C, 1.0f, nullptr);
  // dw^T (C x OC) += inp^T (C x N) @ (dout^T (OC x N))^T
  if (dw) Gemm(false, true, /*m=*/C, /*n=*/OC, /*k=*/N, inp, C, dout, OC, dw, C, 1.0f, nullptr);
  if (dbias) ColumnSums(dbias, dout, N, OC);
}

}  // namespace shardgpt
