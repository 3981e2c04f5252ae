// CPU kernels of the GPT forward and backward pass (fp32).
//
// Each kernel's forward sits next to its backward, with mirrored signatures (outputs,
// inputs, weights, sizes; the backward puts its d-prefixed gradients first). Backward
// kernels ACCUMULATE into parameter gradients (dw, db: +=) and into activation gradients
// (dinp: +=) unless the comment says "writes"; callers zero gradient buffers explicitly.
//
// Dimension letters, used in every shape comment:
//   B batch, T sequence length, C channels (n_embd), NH heads, hs = C/NH head size,
//   V real vocabulary, Vp padded vocabulary (multiple of 128), N = B*T rows, OC out channels.
//
// Threading: one thread pool, OpenMP's. Element-wise kernels split rows across it; matmuls
// split their output across it, each thread calling a single-threaded OpenBLAS cblas_sgemm on
// its own slice (OpenBLAS's own pool is set to 1 thread): two pools would spin against each
// other on a small machine.
// SetComputeThreads() sizes the pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "model/optimizer.h"

namespace shardgpt {

// Sets the OpenMP and OpenBLAS thread counts used by all kernels (>= 1).
void SetComputeThreads(int threads);
int ComputeThreads();

// out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
// dwte[tokens[b,t], :] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:]
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

// y = (x - mean) * rstd * w + b over the last dim. out[N,C]; mean, rstd [N] (saved for backward).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N, int C);
// dinp[N,C] +=, dw[C] +=, db[C] += ; fused: one pass over each row.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);

// out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC]   (bias may be null)
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC);
// dinp[N,C] += dout @ w;  dw[OC,C] += dout^T @ inp;  dbias[OC] += sum_n dout (dbias may be null;
// dinp may be null when the input gradient is not needed).
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int C, int OC);

// Causal multi-head self-attention, memory O(B*T*C + B*NH*T), not O(B*NH*T*T):
// scores are recomputed in backward from the saved per-row log-sum-exp (flash-attention style).
// qkv[B,T,3C] holds q, k, v for each position (in that order, heads contiguous within each).
// out[B,T,C] (writes), lse[B,NH,T] (writes). scale = 1/sqrt(hs).
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv[B,T,3C] +=; needs the forward's out and lse.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int B, int T, int C, int NH);
// How the fp32 attention runs its score/value products (same maths, other summation order):
// kSgemm  row blocks of single-threaded OpenBLAS sgemm calls (model/kernels_cpu_internal.h);
// kTiled  register tiles of our own (model/attention_cpu_tiled.h), for hs % 16 == 0 (else kSgemm);
//         the backward past T = 512 runs kSgemm (kTiledAttentionBackwardMaxT: OpenBLAS is faster there).
// Default: kTiled where the build has AVX-512 (16-lane tiles fill its registers; on AVX2 they
// would spill), else kSgemm. SetFp32Attention: tests and measurements (not while kernels run).
enum class Fp32Attention { kSgemm, kTiled };
Fp32Attention CurrentFp32Attention();
void SetFp32Attention(Fp32Attention a);
const char* Fp32AttentionName(Fp32Attention a);  // "sgemm" or "tiled"
// The way attention_forward (backward: attention_backward) runs now at that shape.
Fp32Attention Fp32AttentionFor(int T, int C, int NH, bool backward);

// GELU, tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, size_t n);
// dinp[n] += dout * gelu'(inp)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
// The element-wise halves of Kernels::matmul_gelu_forward / matmul_dgelu_backward (the CPU
// twins of cuBLASLt's GELU_AUX_BIAS and DGELU epilogues), on a matmul's fp32 result x:
//   gelu_epilogue_forward:  pre[n] = x, out[n] = gelu(x)  (writes both; bf16: each rounded once,
//                           the GELU of the unrounded x)
//   gelu_epilogue_backward: dinp[n] = x * gelu'(pre)      (writes; x = dout @ w unrounded)
void gelu_epilogue_forward(float* out, float* pre, const float* x, size_t n);
void gelu_epilogue_forward(uint16_t* out, uint16_t* pre, const float* x, size_t n);
void gelu_epilogue_backward(float* dinp, const float* pre, const float* x, size_t n);
void gelu_epilogue_backward(uint16_t* dinp, const uint16_t* pre, const float* x, size_t n);

// out[n] = a + b  (writes)
void residual_forward(float* out, const float* a, const float* b, size_t n);
// res_out[N,C] = a + b, then ln_out[N,C] = layernorm(res_out) with w, bias; mean, rstd [N]
// (writes all four). Row by row: each row's sum is added while its statistics are taken, so
// the residual stream is read once from cache. Bitwise equal to residual_forward followed by
// layernorm_forward (the same additions and the same per-row LayerNorm code).
void residual_layernorm_forward(float* res_out, float* ln_out, float* mean, float* rstd, const float* a,
                                const float* b, const float* w, const float* bias, int N, int C);
// da += dout; db += dout
void residual_backward(float* da, float* db, const float* dout, size_t n);

// Fused softmax + cross-entropy over the real vocabulary V of logits[N,Vp] (padded columns
// [V,Vp) are ignored: they never win and never get probability).
// losses[n] (writes) = -log softmax(logits[n])[targets[n]].
// If dloss_scale != 0, logits are overwritten IN PLACE by the gradient of
// (dloss_scale * sum_n losses[n]): (softmax - onehot) * dloss_scale, padded columns set to 0.
// Returns sum_n losses[n] in double.
double crossentropy_softmax(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                            float dloss_scale);

// ---- the model kernels above on bf16 activations (raw bits, base/bf16.h) ----
// Same maths, shapes and accumulate semantics; every activation and activation gradient is
// bf16, while weights, biases, LayerNorm parameters, every parameter gradient, mean/rstd, lse
// and the losses stay fp32. All arithmetic is fp32: each bf16 operand widened on load (exact),
// each result rounded to nearest even on store; an accumulated activation gradient (dinp +=)
// is dinp = bf16(fp32(dinp) + contribution), rounded once per call. The result is thus the
// fp32 kernel's on the same (bf16) inputs, rounded once, except that residual_layernorm reads
// the rounded sum (what a separate layernorm_forward would read). The matmuls and attention
// here are the fp32 products (MatmulPrecision::kExact): operands widened to fp32 scratch,
// the fp32 kernel, the result rounded.
void encoder_forward(uint16_t* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const uint16_t* dout, const int32_t* tokens, int B, int T, int C);
void layernorm_forward(uint16_t* out, float* mean, float* rstd, const uint16_t* inp, const float* w, const float* b,
                       int N, int C);
void layernorm_backward(uint16_t* dinp, float* dw, float* db, const uint16_t* dout, const uint16_t* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C);
void matmul_forward(uint16_t* out, const uint16_t* inp, const float* w, const float* bias, int N, int C, int OC);
void matmul_backward(uint16_t* dinp, float* dw, float* dbias, const uint16_t* dout, const uint16_t* inp,
                     const float* w, int N, int C, int OC);
void attention_forward(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH);
void attention_backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                        const float* lse, int B, int T, int C, int NH);
void gelu_forward(uint16_t* out, const uint16_t* inp, size_t n);
void gelu_backward(uint16_t* dinp, const uint16_t* inp, const uint16_t* dout, size_t n);
void residual_forward(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n);
void residual_layernorm_forward(uint16_t* res_out, uint16_t* ln_out, float* mean, float* rstd, const uint16_t* a,
                                const uint16_t* b, const float* w, const float* bias, int N, int C);
// logits bf16 [N,Vp], dlogits written in place in bf16 (each rounded once), losses fp32.
double crossentropy_softmax(uint16_t* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                            float dloss_scale);

// *loss_acc += float(sum_n losses[n] / N), the sum in double in row order: the mean loss of a
// micro-batch added to a step's total (the twin of the device-side loss).
void add_mean_loss(double* loss_acc, const float* losses, int N);

// ---- element-wise kernels of the engine (gradients, dtype conversion, norm) ----

// dst (to) = src (from), n elements; bf16 narrowing rounds to nearest even (base/bf16.h).
void convert(const void* src, DType from, void* dst, DType to, size_t n);
// dst (dtype) += src (src_dtype), n elements; a bf16 destination: dst = bf16(fp32(dst) + src),
// rounded once (RNE).
void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n);
// sum_i x[i]^2, accumulated in double: blocks of 32Ki elements (each over 8 interleaved
// partial sums), the blocks added in index order; the same bits on any thread count.
double sum_squares(const void* x, DType dtype, size_t n);
// *dst = (sum_i src[i]) / divisor, added in index order.
void sum_f64(double* dst, const double* src, size_t n, double divisor);
// out[0] = norm = float(sqrt(*ss)); out[1] = grad_clip / (norm + 1e-6f) if grad_clip > 0 and
// norm > grad_clip, else 1.
void clip_factor(float* out, const double* ss, float grad_clip);

// One AdamW step and the stored parameters in one pass over (master, m, v, grad, stored):
//   g = fp32(grad[i]);  adamw_element(master[i], g, m[i], v[i])  (model/optimizer.h)
//   stored[i] = stored_dtype(master[i])   (bf16: RNE; skipped when stored == master, fp32)
// Bitwise what convert(grad -> fp32), adamw_update, convert(master -> stored) give, without
// the fp32 gradient copy or the second pass over the master.
void adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype, float* m,
                 float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg, int64_t t,
                 float grad_scale);

}  // namespace shardgpt
