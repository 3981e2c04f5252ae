// cuDNN's SDPA for --attention cudnn (attention_cudnn.cc), on bf16 buffers; internal to
// model/cuda/ (attention_cuda.cu converts to and from the fp32 Kernels buffers). Without the
// cuDNN frontend in the build, CudnnAttentionBuilt() is false and the others throw.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace shardgpt {
namespace cuda {

bool CudnnAttentionBuilt();
// Bytes of cuDNN workspace the forward (backward) graph of this shape needs (builds it once).
size_t CudnnAttentionWorkspace(int device, cudaStream_t stream, bool backward, int B, int T, int C, int NH,
                               float scale);
// o16[B,T,C] (bf16), lse[B,NH,T] (fp32, natural log) from qkv16[B,T,3C] (bf16).
void CudnnAttentionForward(int device, cudaStream_t stream, uint16_t* o16, float* lse, const uint16_t* qkv16, int B,
                           int T, int C, int NH, float scale, void* workspace);
// dqkv16[B,T,3C] (bf16, written) from bf16 dout, qkv, o and the forward's lse.
void CudnnAttentionBackward(int device, cudaStream_t stream, uint16_t* dqkv16, const uint16_t* dout16,
                            const uint16_t* qkv16, const uint16_t* o16, const float* lse, int B, int T, int C, int NH,
                            float scale, void* workspace);

}  // namespace cuda
}  // namespace shardgpt
