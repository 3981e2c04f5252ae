// Causal attention for fp32 on register tiles of our own, the CPU's default for fp32 where the
// host has AVX-512 (kernels_cpu.cc's attention_forward/backward; CurrentFp32Attention).
//
// The same maths as the blocked sgemm attention of model/kernels_cpu_internal.h (see there):
//   forward:  S = q k^T * scale (s <= t);  lse_t = log sum_s exp(S_ts);  o = exp(S - lse) v
//   backward: P = exp(q k^T * scale - lse);  dP = dO v^T;  D_t = dO_t . o_t;  dS = P (dP - D);
//             dq += scale dS k;  dk += scale dS^T q;  dv += P^T dO
// but the score/value products are three small register-tile kernels (16-lane vectors, GCC
// vector extensions) instead of thousands of tiny sgemm calls, each packing its operands
// (bench_kernels BM_Attention*, tiled:0 against tiled:1; docs/PERFORMANCE.md): rows of 8
// queries for the scores and values, 4 key columns for dk/dv, skipping every 16-column group
// above the diagonal. k and v are copied transposed once per head for the score products
// (the reduction runs over hs, contiguous in both operands). Each (b, h) is one thread's work
// in a fixed order, so the results do not depend on the thread count.
//
// Needs hs % 16 == 0 (AttentionTiledFits); kernels_cpu.cc runs the sgemm kernel otherwise.
#pragma once

namespace shardgpt {
namespace cpu_internal {

inline bool AttentionTiledFits(int C, int NH) { return NH > 0 && C % NH == 0 && (C / NH) % 16 == 0; }
// Past this T the backward runs the sgemm kernel: its dk/dv products walk down columns of the
// [T, T] probability tiles, and once those outgrow L2 OpenBLAS's packed panels win (the two
// break even at 512: bench_kernels BM_AttentionBackward). The forward keeps only 8 rows of
// scores: tiled at every T.
constexpr int kTiledAttentionBackwardMaxT = 512;

// out[B,T,C] (writes), lse[B,NH,T] (writes) from qkv[B,T,3C]; OpenMP over (b,h).
void AttentionForwardTiled(int threads, float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv[B,T,3C] +=; needs the forward's out and lse.
void AttentionBackwardTiled(int threads, float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int B, int T, int C, int NH);

}  // namespace cpu_internal
}  // namespace shardgpt
