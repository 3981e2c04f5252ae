// The tensor-core causal attention (attention_tc_cuda.cu): flash-attention-2 style forward and
// backward on bf16 mma.sync (model/cuda/mma.cuh), used by CudaKernels::attention_forward /
// attention_backward (attention_cuda.cu) at MatmulPrecision::kBf16 for the head sizes below.
// Internal to model/cuda/. Same buffers and maths as the CPU twins attention_forward_bf16 /
// attention_backward_bf16 (model/kernels_cpu_bf16.h): q, k, v, dO and the probabilities are
// rounded to bf16 for the products, softmax statistics, lse and D are fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardgpt {
namespace cuda {

// Head sizes the tensor-core kernels are instantiated for.
inline bool TensorCoreAttentionSupports(int hs) { return hs == 64 || hs == 128; }

// out[B,T,C], lse[B,NH,T] (writes) from qkv[B,T,3C]; scale = 1/sqrt(hs).
void AttentionForwardTc(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, float scale,
                        cudaStream_t stream);
// dqkv[B,T,3C] += from dout[B,T,C], qkv, the forward's lse and D[B,NH,T] = rowsum(dO * o).
void AttentionBackwardTc(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int B,
                         int T, int C, int NH, float scale, cudaStream_t stream);
// The same on bf16 activations (raw bits), read and written as they are: out = bf16(the fp32
// result), dqkv = bf16(fp32(dqkv) + the fp32 gradient) (no fp32 scratch, no conversion pass).
void AttentionForwardTc(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH, float scale,
                        cudaStream_t stream);
void AttentionBackwardTc(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse, const float* D,
                         int B, int T, int C, int NH, float scale, cudaStream_t stream);

}  // namespace cuda
}  // namespace shardgpt
