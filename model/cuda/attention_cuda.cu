// Causal multi-head self-attention, flash-attention style, fp32. CPU twins: attention_forward /
// attention_backward (model/kernels_cpu.cc).
//
// Which kernels run: at MatmulPrecision::kBf16 (--dtype bf16, or --compute-dtype bf16) with head
// size 64 or 128, the bf16 tensor-core kernels of attention_tc_cuda.cu (CPU twins
// attention_forward_bf16 / attention_backward_bf16); otherwise, and always at kExact (which
// promises fp32 products), the fp32 kernels of this file, for head sizes up to 128. With
// --attention cudnn (set_cudnn_attention), cuDNN's SDPA on bf16 copies (attention_cudnn.cc).
//
// Memory O(B*T*C + B*NH*T): the [T,T] scores are never stored; the forward saves out and the
// per-row log-sum-exp, the backward recomputes P.
//
// Per (b, h), with q, k, v, o, dO the [T,hs] slices of that head (rows of qkv[B,T,3C], stride 3C:
// q at channel h*hs, k at C + h*hs, v at 2C + h*hs; o and dO rows of [B,T,C]), scale = 1/sqrt(hs):
//   forward:  S = q k^T * scale (causal: key s <= query t);  lse_t = log sum_s exp(S_ts);
//             o = softmax(S) v, by the online softmax over key tiles (running max m, sum l):
//               m' = max(m, max_j S_tj);  l = l e^(m-m') + sum_j e^(S_tj-m');  o = o e^(m-m') + sum_j e^(S_tj-m') v_j
//             and at the end o /= l, lse = m + log l.
//   backward: D_t = dO_t . o_t;  P = exp(S - lse);  dP = dO v^T;  dS = P * (dP - D);
//             dq += dS k * scale;  dk += dS^T q * scale;  dv += P^T dO.
//
// Kernels: one for D, one for dq (a block per query tile, looping over key tiles), one for dk and
// dv (a block per key tile, looping over query tiles): every gradient element is summed by one
// thread in a fixed order, so there are no atomics and the results are bitwise reproducible.
//
// Tiles: kTile = 32 queries x 32 keys per step, blocks of 8 warps; each warp owns kRpw = 4 rows
// of its block's tile, lane j works on the tile's column j (a key in the forward and dq kernels,
// a query in the dk/dv kernel), then the lanes' values are broadcast with __shfl_sync for the
// products with v, k, dO or q, where lane i owns head dims i, i+32, ... (DPL = dims per lane,
// a template argument: hs <= 32 * DPL, DPL <= 4, so hs <= 128). Shared-memory rows are padded
// to hs+1 floats so that lanes reading different rows hit different banks.
#include <string>

#include "model/cuda/attention_cudnn.h"
#include "model/cuda/attention_tc.h"
#include "model/cuda/device_util.cuh"
#include "model/cuda/launch.cuh"
#include "model/cuda/kernels_cuda.h"

namespace shardgpt {

namespace {

using cuda::load_f32;

constexpr int kTile = 32;
constexpr int kWarps = 8;
constexpr int kRpw = kTile / kWarps;  // rows per warp
constexpr int kAttThreads = kWarps * 32;
constexpr int kMaxHeadSize = 128;

// dst[r][d] (row stride ld) = src[(row0 + r) * stride + d] for r < kTile, d < hs; rows past T are 0.
__device__ __forceinline__ void load_tile(float* dst, const float* src, int row0, int T, int64_t stride, int hs,
                                          int ld) {
  for (int i = threadIdx.x; i < kTile * hs; i += blockDim.x) {
    const int r = i / hs, d = i - r * hs, t = row0 + r;
    dst[r * ld + d] = t < T ? src[(int64_t)t * stride + d] : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; d++) s += a[d] * b[d];
  return s;
}

// ---- forward: a block per (query tile, b*NH + h) ----
template <int DPL>
__global__ void __launch_bounds__(kAttThreads)
    attention_forward_kernel(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  SHARDGPT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ld = hs + 1;
  float* Qs = smem;
  float* Ks = Qs + kTile * ld;
  float* Vs = Ks + kTile * ld;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float* q = qkv + (int64_t)b * T * C3 + h * hs;
  load_tile(Qs, q, q0, T, C3, hs, ld);

  float m[kRpw], l[kRpw], acc[kRpw][DPL];
  #pragma unroll
  for (int rr = 0; rr < kRpw; rr++) {
    m[rr] = -INFINITY, l[rr] = 0.0f;
    #pragma unroll
    for (int i = 0; i < DPL; i++) acc[rr][i] = 0.0f;
  }
  const int q_last = min(q0 + kTile, T) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {  // key tiles up to the diagonal one
    __syncthreads();                             // the previous tile is consumed
    load_tile(Ks, q + C, k0, T, C3, hs, ld);
    load_tile(Vs, q + 2 * C, k0, T, C3, hs, ld);
    __syncthreads();
    const int key = k0 + lane;
    #pragma unroll
    for (int rr = 0; rr < kRpw; rr++) {
      const int r = warp * kRpw + rr, t = q0 + r;
      const float s = key <= t ? dot(Qs + r * ld, Ks + lane * ld, hs) * scale : -INFINITY;
      const float m_new = fmaxf(m[rr], cuda::warp_max(s));
      if (m_new == -INFINITY) continue;  // no key of this row yet (warp-uniform)
      const float p = expf(s - m_new);
      const float alpha = expf(m[rr] - m_new);
      l[rr] = l[rr] * alpha + cuda::warp_sum(p);
      #pragma unroll
      for (int i = 0; i < DPL; i++) acc[rr][i] *= alpha;
      #pragma unroll
      for (int j = 0; j < 32; j++) {
        const float pj = __shfl_sync(cuda::kFullMask, p, j);
        #pragma unroll
        for (int i = 0; i < DPL; i++) {
          const int d = lane + 32 * i;
          if (d < hs) acc[rr][i] += pj * Vs[j * ld + d];
        }
      }
      m[rr] = m_new;
    }
  }
  #pragma unroll
  for (int rr = 0; rr < kRpw; rr++) {
    const int t = q0 + warp * kRpw + rr;
    if (t >= T) continue;
    float* o = out + ((int64_t)b * T + t) * C + h * hs;
    #pragma unroll
    for (int i = 0; i < DPL; i++) {
      const int d = lane + 32 * i;
      if (d < hs) o[d] = acc[rr][i] / l[rr];
    }
    if (lane == 0) lse[(int64_t)bh * T + t] = m[rr] + logf(l[rr]);
  }
}

// ---- backward, step 1: D[b,h,t] = dO_t . o_t  (one warp per (b, h, t), [B,NH,T] order) ----
template <typename A>
__global__ void attention_backward_d_kernel(float* D, const A* dout, const A* out, int B, int T, int C, int NH) {
  const int hs = C / NH, lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= (int64_t)B * NH * T) return;
  const int t = (int)(row % T);
  const int64_t bh = row / T;
  const int h = (int)(bh % NH), b = (int)(bh / NH);
  const int64_t off = ((int64_t)b * T + t) * C + h * hs;
  float s = 0.0f;
  for (int i = lane; i < hs; i += 32) s += load_f32(dout, off + i) * load_f32(out, off + i);
  s = cuda::warp_sum(s);
  if (lane == 0) D[row] = s;
}

// ---- backward, step 2: dq_t += scale * sum_{s<=t} dS_ts k_s; a block per (query tile, bh) ----
template <int DPL>
__global__ void __launch_bounds__(kAttThreads)
    attention_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                 const float* Dg, int T, int C, int NH, float scale) {
  SHARDGPT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ld = hs + 1;
  float* Qs = smem;
  float* dOs = Qs + kTile * ld;
  float* Ks = dOs + kTile * ld;
  float* Vs = Ks + kTile * ld;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float* q = qkv + (int64_t)b * T * C3 + h * hs;
  const float* dO = dout + (int64_t)b * T * C + h * hs;
  load_tile(Qs, q, q0, T, C3, hs, ld);
  load_tile(dOs, dO, q0, T, C, hs, ld);

  float lse_r[kRpw], D_r[kRpw], acc[kRpw][DPL];
  #pragma unroll
  for (int rr = 0; rr < kRpw; rr++) {
    const int t = q0 + warp * kRpw + rr;
    lse_r[rr] = t < T ? lse[(int64_t)bh * T + t] : 0.0f;
    D_r[rr] = t < T ? Dg[(int64_t)bh * T + t] : 0.0f;
    #pragma unroll
    for (int i = 0; i < DPL; i++) acc[rr][i] = 0.0f;
  }
  const int q_last = min(q0 + kTile, T) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {
    __syncthreads();
    load_tile(Ks, q + C, k0, T, C3, hs, ld);
    load_tile(Vs, q + 2 * C, k0, T, C3, hs, ld);
    __syncthreads();
    const int key = k0 + lane;
    #pragma unroll
    for (int rr = 0; rr < kRpw; rr++) {
      const int r = warp * kRpw + rr, t = q0 + r;
      float ds = 0.0f;  // dS_t,key = P (dP - D)
      if (t < T && key <= t) {
        const float p = expf(dot(Qs + r * ld, Ks + lane * ld, hs) * scale - lse_r[rr]);
        const float dp = dot(dOs + r * ld, Vs + lane * ld, hs);
        ds = p * (dp - D_r[rr]);
      }
      #pragma unroll
      for (int j = 0; j < 32; j++) {
        const float dsj = __shfl_sync(cuda::kFullMask, ds, j);
        #pragma unroll
        for (int i = 0; i < DPL; i++) {
          const int d = lane + 32 * i;
          if (d < hs) acc[rr][i] += dsj * Ks[j * ld + d];
        }
      }
    }
  }
  #pragma unroll
  for (int rr = 0; rr < kRpw; rr++) {
    const int t = q0 + warp * kRpw + rr;
    if (t >= T) continue;
    float* dq = dqkv + ((int64_t)b * T + t) * C3 + h * hs;
    #pragma unroll
    for (int i = 0; i < DPL; i++) {
      const int d = lane + 32 * i;
      if (d < hs) dq[d] += acc[rr][i] * scale;
    }
  }
}

// ---- backward, step 3: dv_s += sum_{t>=s} P_ts dO_t;  dk_s += scale * sum_{t>=s} dS_ts q_t;
//      a block per (key tile, bh), looping over the query tiles from the diagonal one ----
template <int DPL>
__global__ void __launch_bounds__(kAttThreads)
    attention_backward_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                  const float* Dg, int T, int C, int NH, float scale) {
  SHARDGPT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ld = hs + 1;
  float* Ks = smem;
  float* Vs = Ks + kTile * ld;
  float* Qs = Vs + kTile * ld;
  float* dOs = Qs + kTile * ld;
  float* ls = dOs + kTile * ld;  // lse of the query tile
  float* Ds = ls + kTile;        // D of the query tile
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.x * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float* q = qkv + (int64_t)b * T * C3 + h * hs;
  const float* dO = dout + (int64_t)b * T * C + h * hs;
  load_tile(Ks, q + C, k0, T, C3, hs, ld);
  load_tile(Vs, q + 2 * C, k0, T, C3, hs, ld);

  float dk[kRpw][DPL], dv[kRpw][DPL];
  #pragma unroll
  for (int rr = 0; rr < kRpw; rr++)
    #pragma unroll
    for (int i = 0; i < DPL; i++) dk[rr][i] = dv[rr][i] = 0.0f;
  for (int q0 = k0; q0 < T; q0 += kTile) {
    __syncthreads();
    load_tile(Qs, q, q0, T, C3, hs, ld);
    load_tile(dOs, dO, q0, T, C, hs, ld);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const int t = q0 + i;
      ls[i] = t < T ? lse[(int64_t)bh * T + t] : 0.0f;
      Ds[i] = t < T ? Dg[(int64_t)bh * T + t] : 0.0f;
    }
    __syncthreads();
    const int t = q0 + lane;  // this lane's query
    #pragma unroll
    for (int rr = 0; rr < kRpw; rr++) {
      const int kr = warp * kRpw + rr, s = k0 + kr;  // this warp row's key
      float p = 0.0f, ds = 0.0f;
      if (t < T && s <= t) {
        p = expf(dot(Qs + lane * ld, Ks + kr * ld, hs) * scale - ls[lane]);
        const float dp = dot(dOs + lane * ld, Vs + kr * ld, hs);
        ds = p * (dp - Ds[lane]);
      }
      #pragma unroll
      for (int r = 0; r < 32; r++) {
        const float pr = __shfl_sync(cuda::kFullMask, p, r);
        const float dsr = __shfl_sync(cuda::kFullMask, ds, r);
        #pragma unroll
        for (int i = 0; i < DPL; i++) {
          const int d = lane + 32 * i;
          if (d < hs) {
            dv[rr][i] += pr * dOs[r * ld + d];
            dk[rr][i] += dsr * Qs[r * ld + d];
          }
        }
      }
    }
  }
  #pragma unroll
  for (int rr = 0; rr < kRpw; rr++) {
    const int s = k0 + warp * kRpw + rr;
    if (s >= T) continue;
    float* dks = dqkv + ((int64_t)b * T + s) * C3 + C + h * hs;
    float* dvs = dks + C;
    #pragma unroll
    for (int i = 0; i < DPL; i++) {
      const int d = lane + 32 * i;
      if (d < hs) {
        dks[d] += dk[rr][i] * scale;
        dvs[d] += dv[rr][i];
      }
    }
  }
}

// Kernels needing more than 48 KiB of dynamic shared memory must say so before their launch.
template <typename Kernel>
void AllowSharedMemory(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    SHARDGPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

struct AttentionShape {
  int B, T, C, NH, hs;
  float scale;
  dim3 grid;  // (tiles of T, B*NH)
};

AttentionShape Shape(const char* what, int B, int T, int C, int NH) {
  AttentionShape a{B, T, C, NH, NH > 0 ? C / NH : 0, 0.0f, dim3()};
  if (NH <= 0 || C % NH != 0 || a.hs < 1 || a.hs > kMaxHeadSize)
    throw std::runtime_error(std::string(what) + ": head size C/NH = " + std::to_string(C) + "/" +
                             std::to_string(NH) + " is not supported by the CUDA kernels (a whole number of at "
                             "most " + std::to_string(kMaxHeadSize) + ")");
  if ((int64_t)B * NH > 65535)
    throw std::runtime_error(std::string(what) + ": B*NH = " + std::to_string((int64_t)B * NH) +
                             " exceeds the CUDA grid limit of 65535");
  a.scale = 1.0f / std::sqrt((float)a.hs);  // as the CPU twin
  a.grid = dim3((T + kTile - 1) / kTile, B * NH);
  return a;
}

template <int DPL>
void LaunchForward(const AttentionShape& a, float* out, float* lse, const float* qkv, cudaStream_t stream) {
  const size_t smem = sizeof(float) * 3 * kTile * (a.hs + 1);
  AllowSharedMemory(attention_forward_kernel<DPL>, smem);
  SHARDGPT_LAUNCH(attention_forward_kernel<DPL>, a.grid, kAttThreads, smem, stream)(out, lse, qkv, a.T, a.C, a.NH, a.scale);
  SHARDGPT_CUDA_CHECK_LAUNCH("attention_forward_kernel");
}

template <int DPL>
void LaunchBackward(const AttentionShape& a, float* dqkv, const float* dout, const float* qkv, const float* lse,
                    const float* D, cudaStream_t stream) {
  const size_t smem_dq = sizeof(float) * 4 * kTile * (a.hs + 1);
  AllowSharedMemory(attention_backward_dq_kernel<DPL>, smem_dq);
  SHARDGPT_LAUNCH(attention_backward_dq_kernel<DPL>, a.grid, kAttThreads, smem_dq, stream)(dqkv, dout, qkv, lse, D, a.T, a.C,
                                                                              a.NH, a.scale);
  SHARDGPT_CUDA_CHECK_LAUNCH("attention_backward_dq_kernel");
  const size_t smem_dkv = smem_dq + sizeof(float) * 2 * kTile;
  AllowSharedMemory(attention_backward_dkv_kernel<DPL>, smem_dkv);
  SHARDGPT_LAUNCH(attention_backward_dkv_kernel<DPL>, a.grid, kAttThreads, smem_dkv, stream)(dqkv, dout, qkv, lse, D, a.T, a.C,
                                                                                a.NH, a.scale);
  SHARDGPT_CUDA_CHECK_LAUNCH("attention_backward_dkv_kernel");
}

int DimsPerLane(int hs) { return (hs + 31) / 32; }

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// bf16 activations: cuDNN and the tensor-core kernels take the bf16 tensors as they are (the
// tensor-core kernels round out and dqkv = bf16(fp32(dqkv) + gradient) from fp32 in registers);
// the fp32 CUDA-core kernels (kExact, or head sizes without tensor-core kernels) get widened
// fp32 copies in scratch, rounded into the bf16 buffers after. Every result is the fp32
// computation's, rounded once, as in the CPU twins.
void CudaKernels::attention_forward(void* out_v, float* lse, const void* qkv_v, int B, int T, int C, int NH) const {
  if (B == 0 || T == 0) return;
  Bind();
  const AttentionShape a = Shape("attention_forward", B, T, C, NH);
  const bool act16 = act_dtype_ == DType::kBF16;
  const size_t n_qkv = (size_t)B * T * 3 * C, n_o = (size_t)B * T * C;
  if (cudnn_attention_) {  // bf16 copies in (or the bf16 activations), cuDNN, fp32 out
    const size_t ws = cuda::CudnnAttentionWorkspace(device_, stream_, false, B, T, C, NH, a.scale);
    char* base = static_cast<char*>(Scratch(Align256(n_qkv * 2) + Align256(n_o * 2) + ws));
    auto* qkv16 = act16 ? static_cast<uint16_t*>(const_cast<void*>(qkv_v)) : reinterpret_cast<uint16_t*>(base);
    auto* o16 = act16 ? static_cast<uint16_t*>(out_v) : reinterpret_cast<uint16_t*>(base + Align256(n_qkv * 2));
    if (!act16) convert(qkv_v, DType::kF32, qkv16, DType::kBF16, n_qkv);
    cuda::CudnnAttentionForward(device_, stream_, o16, lse, qkv16, B, T, C, NH, a.scale,
                                base + Align256(n_qkv * 2) + Align256(n_o * 2));
    if (!act16) convert(o16, DType::kBF16, out_v, DType::kF32, n_o);
    return;
  }
  if (precision_ == MatmulPrecision::kBf16 && cuda::TensorCoreAttentionSupports(a.hs)) {
    if (act16)
      cuda::AttentionForwardTc(static_cast<uint16_t*>(out_v), lse, static_cast<const uint16_t*>(qkv_v), B, T, C, NH,
                               a.scale, stream_);
    else
      cuda::AttentionForwardTc(static_cast<float*>(out_v), lse, static_cast<const float*>(qkv_v), B, T, C, NH, a.scale,
                               stream_);
    tc_attention_forwards_++;
    return;
  }
  float* out = static_cast<float*>(out_v);
  const float* qkv = static_cast<const float*>(qkv_v);
  if (act16) {  // fp32 out and widened qkv in scratch for the CUDA-core kernels
    char* base = static_cast<char*>(Scratch(Align256(n_o * 4) + n_qkv * 4));
    out = reinterpret_cast<float*>(base);
    float* q32 = reinterpret_cast<float*>(base + Align256(n_o * 4));
    convert(qkv_v, DType::kBF16, q32, DType::kF32, n_qkv);
    qkv = q32;
  }
  switch (DimsPerLane(a.hs)) {
    case 1: LaunchForward<1>(a, out, lse, qkv, stream_); break;
    case 2: LaunchForward<2>(a, out, lse, qkv, stream_); break;
    case 3: LaunchForward<3>(a, out, lse, qkv, stream_); break;
    default: LaunchForward<4>(a, out, lse, qkv, stream_); break;
  }
  if (act16) convert(out, DType::kF32, out_v, DType::kBF16, n_o);
}

void CudaKernels::attention_backward(void* dqkv_v, const void* dout_v, const void* qkv_v, const void* out_v,
                                     const float* lse, int B, int T, int C, int NH) const {
  if (B == 0 || T == 0) return;
  Bind();
  const AttentionShape a = Shape("attention_backward", B, T, C, NH);
  const bool act16 = act_dtype_ == DType::kBF16;
  const size_t n_qkv = (size_t)B * T * 3 * C, n_o = (size_t)B * T * C;
  if (cudnn_attention_) {  // bf16 copies in (or the bf16 activations), cuDNN, dqkv += the bf16 gradient
    const size_t ws = cuda::CudnnAttentionWorkspace(device_, stream_, true, B, T, C, NH, a.scale);
    const size_t s_qkv = Align256(n_qkv * 2), s_o = Align256(n_o * 2);
    char* base = static_cast<char*>(Scratch(2 * s_qkv + 2 * s_o + ws));
    auto* dqkv16 = reinterpret_cast<uint16_t*>(base + s_qkv);
    const uint16_t *qkv16 = static_cast<const uint16_t*>(qkv_v), *o16 = static_cast<const uint16_t*>(out_v),
                   *do16 = static_cast<const uint16_t*>(dout_v);
    if (!act16) {
      auto* q = reinterpret_cast<uint16_t*>(base);
      auto* o = reinterpret_cast<uint16_t*>(base + 2 * s_qkv);
      auto* d = reinterpret_cast<uint16_t*>(base + 2 * s_qkv + s_o);
      convert(qkv_v, DType::kF32, q, DType::kBF16, n_qkv);
      convert(out_v, DType::kF32, o, DType::kBF16, n_o);
      convert(dout_v, DType::kF32, d, DType::kBF16, n_o);
      qkv16 = q, o16 = o, do16 = d;
    }
    cuda::CudnnAttentionBackward(device_, stream_, dqkv16, do16, qkv16, o16, lse, B, T, C, NH, a.scale,
                                 base + 2 * s_qkv + 2 * s_o);
    accumulate(dqkv_v, act_dtype_, dqkv16, DType::kBF16, n_qkv);
    return;
  }
  const int64_t rows = (int64_t)B * NH * T;
  const bool tc = precision_ == MatmulPrecision::kBf16 && cuda::TensorCoreAttentionSupports(a.hs);
  // scratch: D, then for the CUDA-core kernels at bf16 activations the fp32 dqkv and widened dout, qkv
  const size_t s_d = Align256(sizeof(float) * rows), s_q = Align256(n_qkv * 4), s_o = Align256(n_o * 4);
  const bool widen = act16 && !tc;
  char* base = static_cast<char*>(Scratch(s_d + (widen ? 2 * s_q + s_o : 0)));
  float* D = reinterpret_cast<float*>(base);
  const int rows_per_block = 256 / 32;
  const unsigned d_grid = (unsigned)((rows + rows_per_block - 1) / rows_per_block);
  if (act16)
    SHARDGPT_LAUNCH(attention_backward_d_kernel<uint16_t>, d_grid, 256, 0, stream_)(
        D, static_cast<const uint16_t*>(dout_v), static_cast<const uint16_t*>(out_v), B, T, C, NH);
  else
    SHARDGPT_LAUNCH(attention_backward_d_kernel<float>, d_grid, 256, 0, stream_)(
        D, static_cast<const float*>(dout_v), static_cast<const float*>(out_v), B, T, C, NH);
  SHARDGPT_CUDA_CHECK_LAUNCH("attention_backward_d_kernel");
  if (tc) {
    if (act16)
      cuda::AttentionBackwardTc(static_cast<uint16_t*>(dqkv_v), static_cast<const uint16_t*>(dout_v),
                                static_cast<const uint16_t*>(qkv_v), lse, D, B, T, C, NH, a.scale, stream_);
    else
      cuda::AttentionBackwardTc(static_cast<float*>(dqkv_v), static_cast<const float*>(dout_v),
                                static_cast<const float*>(qkv_v), lse, D, B, T, C, NH, a.scale, stream_);
    tc_attention_backwards_++;
    return;
  }
  float* dqkv = static_cast<float*>(dqkv_v);
  const float* dout = static_cast<const float*>(dout_v);
  const float* qkv = static_cast<const float*>(qkv_v);
  if (widen) {
    dqkv = reinterpret_cast<float*>(base + s_d);
    float* q32 = reinterpret_cast<float*>(base + s_d + s_q);
    float* d32 = reinterpret_cast<float*>(base + s_d + 2 * s_q);
    convert(dqkv_v, DType::kBF16, dqkv, DType::kF32, n_qkv);
    convert(qkv_v, DType::kBF16, q32, DType::kF32, n_qkv);
    convert(dout_v, DType::kBF16, d32, DType::kF32, n_o);
    qkv = q32, dout = d32;
  }
  switch (DimsPerLane(a.hs)) {
    case 1: LaunchBackward<1>(a, dqkv, dout, qkv, lse, D, stream_); break;
    case 2: LaunchBackward<2>(a, dqkv, dout, qkv, lse, D, stream_); break;
    case 3: LaunchBackward<3>(a, dqkv, dout, qkv, lse, D, stream_); break;
    default: LaunchBackward<4>(a, dqkv, dout, qkv, lse, D, stream_); break;
  }
  if (act16) convert(dqkv, DType::kF32, dqkv_v, DType::kBF16, n_qkv);
}

}  // namespace shardgpt
