// CPU kernels of the Llama block: RMSNorm, rotary position embeddings, SwiGLU and the
// sharing of key/value heads by groups of query heads (grouped-query attention).
//
// Conventions as model/kernels_cpu.h: forward next to backward; backward kernels ACCUMULATE (+=)
// into every gradient (activation and parameter) unless the comment says "writes"; the maths is
// fp32 (double where noted); each kernel has an fp32 overload and a bf16 one (uint16_t bits:
// widened on load, rounded to nearest even once on store; an accumulated bf16 gradient is read,
// added in fp32 and rounded once per call). Parameters and statistics are always fp32.
//
// Dimension letters: N rows (= B*T), C channels, T sequence length, NH query heads, KV key/value
// heads (NH % KV == 0), hs head size (even), F the SwiGLU hidden width.
// The packed projection row qkv[n] holds NH query heads, then KV key heads, then KV value heads,
// hs values each: width W = (NH + 2 KV) hs. Row n = b*T + t is at position t.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardgpt {

// RMSNorm: rstd[n] = 1 / sqrt(mean_c x[n,c]^2 + eps) (sum in double), out[n,c] = x[n,c] rstd[n] w[c].
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps);
void rmsnorm_forward(uint16_t* out, float* rstd, const uint16_t* inp, const float* w, int N, int C, float eps);
// With g = dout * w:  dinp[n,c] += rstd (g[c] - x[n,c] rstd^2 mean_c'(g x));  dw[c] += sum_n dout x rstd.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C);
void rmsnorm_backward(uint16_t* dinp, float* dw, const uint16_t* dout, const uint16_t* inp, const float* w,
                      const float* rstd, int N, int C);

// Rotary embeddings in place on the query and key heads of qkv[B*T, W] (the value heads are
// untouched), Hugging Face's rotate-half pairing: for i < hs/2, with the angle
// a = t * inv_freq[i], inv_freq[i] = 1 / theta^(2i/hs) (both computed in fp32, as transformers):
//   x'[i] = x[i] cos a - x[i + hs/2] sin a;   x'[i + hs/2] = x[i + hs/2] cos a + x[i] sin a.
// cos and sin are fp32 (of the fp32 angle) at both dtypes, and the bf16 overload rounds only the
// result: transformers on bf16 tensors rounds cos/sin to bf16 and each product and sum too, so
// the two differ by about a bf16 ulp.
void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, float theta);
void rope_forward(uint16_t* qkv, int B, int T, int NH, int KV, int hs, float theta);
// The transpose (rotation by -a), in place on the gradient dqkv[B*T, W]: the rotation is
// linear and orthogonal, so backward is the inverse rotation. Writes (in place), no accumulation.
void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, float theta);
void rope_backward(uint16_t* dqkv, int B, int T, int NH, int KV, int hs, float theta);

// SwiGLU on gate_up[N, 2F] (gate in columns [0, F), up in [F, 2F)):
//   out[n,j] = silu(g) u = g / (1 + exp(-g)) * u   (writes out[N, F])
void swiglu_forward(float* out, const float* gate_up, int N, int F);
void swiglu_forward(uint16_t* out, const uint16_t* gate_up, int N, int F);
// With s = sigmoid(g):  dgate += dout u s (1 + g (1 - s));  dup += dout g s   (dgate_up[N, 2F]).
void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int N, int F);
void swiglu_backward(uint16_t* dgate_up, const uint16_t* gate_up, const uint16_t* dout, int N, int F);

// Grouped-query attention's key/value sharing, so that the multi-head attention kernels run
// unchanged: out[N, 3C] (C = NH hs, the [q | k | v] row attention_forward reads) takes q as is
// and query head h's key and value from kv head h / (NH / KV). Writes out.
void kv_repeat_forward(float* out, const float* qkv, int N, int NH, int KV, int hs);
void kv_repeat_forward(uint16_t* out, const uint16_t* qkv, int N, int NH, int KV, int hs);
// dqkv[N, W] += dq as is, and for each kv head the sum of its group's query heads' dk, dv
// (summed in fp32 in head order, then added once).
void kv_repeat_backward(float* dqkv, const float* dout, int N, int NH, int KV, int hs);
void kv_repeat_backward(uint16_t* dqkv, const uint16_t* dout, int N, int NH, int KV, int hs);

}  // namespace shardgpt
