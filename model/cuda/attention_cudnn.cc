// Causal attention through cuDNN's SDPA (the cuDNN frontend graph API, header-only C++), for
// --attention cudnn. Built only when CMake found cudnn_frontend.h and cuDNN 9
// (SHARDGPT_HAVE_CUDNN_FRONTEND, nvcc builds; see docs/CUDA.md). Checked against the own kernels
// by gpu-check's --attention cudnn run (losses of the same steps).
//
// Layout: cuDNN reads bf16 q, k, v straight out of a bf16 copy of qkv[B,T,3,NH,hs] through
// strides (dims [B,NH,T,hs]), writes bf16 o[B,T,NH,hs] and the fp32 "Stats" = log-sum-exp
// (natural log, [B,NH,T,1]: our lse). The backward takes bf16 q, k, v, o, dO and the stats,
// writes bf16 dq, dk, dv into a bf16 dqkv, which the caller adds to the fp32 dqkv. The
// backward asks for cuDNN's deterministic algorithm. One graph per shape, built once.
// Plain C++ (no kernels of its own): the host compiler parses the frontend's large headers
// once, where nvcc would parse them once per GPU architecture.
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

#include "model/cuda/attention_cudnn.h"

#ifdef SHARDGPT_HAVE_CUDNN_FRONTEND
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace shardgpt {
namespace cuda {

#ifdef SHARDGPT_HAVE_CUDNN_FRONTEND

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

void Check(fe::error_t e, const char* what) {  // (get_message() is not const)
  if (!e.is_good()) throw std::runtime_error(std::string("cuDNN frontend: ") + what + ": " + e.get_message());
}

struct Key {
  int device, B, T, NH, hs;
  bool backward;
  bool operator<(const Key& o) const {
    return std::tie(device, B, T, NH, hs, backward) < std::tie(o.device, o.B, o.T, o.NH, o.hs, o.backward);
  }
};

// Per process: one handle per device, one graph per shape (the training thread is the only caller).
std::map<int, cudnnHandle_t>& Handles() {
  static std::map<int, cudnnHandle_t> h;
  return h;
}
std::map<Key, std::shared_ptr<fe::graph::Graph>>& Graphs() {
  static std::map<Key, std::shared_ptr<fe::graph::Graph>> g;
  return g;
}

cudnnHandle_t Handle(int device, cudaStream_t stream) {
  auto& h = Handles()[device];
  if (!h && cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) {
    h = nullptr;
    throw std::runtime_error("cuDNN: cudnnCreate failed");
  }
  if (cudnnSetStream(h, stream) != CUDNN_STATUS_SUCCESS) throw std::runtime_error("cuDNN: cudnnSetStream failed");
  return h;
}

std::shared_ptr<fe::graph::Tensor_attributes> Qkv(fe::graph::Graph& g, const char* name, int64_t uid, int B, int T,
                                                  int NH, int hs) {
  const int64_t H = NH, S = hs, TT = T;
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, H, TT, S})
                      .set_stride({3 * H * S * TT, S, 3 * H * S, 1}));
}
std::shared_ptr<fe::graph::Tensor_attributes> Rows(fe::graph::Graph& g, const char* name, int64_t uid, int B, int T,
                                                   int NH, int hs) {
  const int64_t H = NH, S = hs, TT = T;
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({B, H, TT, S}).set_stride({H * S * TT, S, H * S, 1}));
}

fe::graph::Graph& GraphFor(const Key& k, cudnnHandle_t handle, float scale) {
  auto& slot = Graphs()[k];
  if (slot) return *slot;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t B = k.B, H = k.NH, TT = k.T, S = k.hs;
  auto q = Qkv(*g, "q", kQ, k.B, k.T, k.NH, k.hs), kk = Qkv(*g, "k", kK, k.B, k.T, k.NH, k.hs),
       v = Qkv(*g, "v", kV, k.B, k.T, k.NH, k.hs);
  if (!k.backward) {
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_causal_mask(true).set_attn_scale(scale);
    auto [o, stats] = g->sdpa(q, kk, v, opts);
    o->set_output(true).set_uid(kO).set_dim({B, H, TT, S}).set_stride({H * S * TT, S, H * S, 1});
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, TT, 1}).set_stride(
        {H * TT, TT, 1, 1});
  } else {
    auto o = Rows(*g, "o", kO, k.B, k.T, k.NH, k.hs), dO = Rows(*g, "dO", kDO, k.B, k.T, k.NH, k.hs);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({B, H, TT, 1})
                               .set_stride({H * TT, TT, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_causal_mask(true)
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dO, stats, opts);
    dq->set_output(true).set_uid(kDQ).set_dim({B, H, TT, S}).set_stride({3 * H * S * TT, S, 3 * H * S, 1});
    dk->set_output(true).set_uid(kDK).set_dim({B, H, TT, S}).set_stride({3 * H * S * TT, S, 3 * H * S, 1});
    dv->set_output(true).set_uid(kDV).set_dim({B, H, TT, S}).set_stride({3 * H * S * TT, S, 3 * H * S, 1});
  }
  Check(g->validate(), "validate");
  Check(g->build_operation_graph(handle), "build_operation_graph");
  Check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  Check(g->check_support(handle), "check_support (this GPU / cuDNN has no SDPA engine for the shape)");
  Check(g->build_plans(handle), "build_plans");
  slot = g;
  return *g;
}

}  // namespace

bool CudnnAttentionBuilt() { return true; }

size_t CudnnAttentionWorkspace(int device, cudaStream_t stream, bool backward, int B, int T, int C, int NH,
                               float scale) {
  cudnnHandle_t h = Handle(device, stream);
  int64_t ws = 0;
  Check(GraphFor(Key{device, B, T, NH, C / NH, backward}, h, scale).get_workspace_size(ws), "get_workspace_size");
  return (size_t)ws;
}

void CudnnAttentionForward(int device, cudaStream_t stream, uint16_t* o16, float* lse, const uint16_t* qkv16, int B,
                           int T, int C, int NH, float scale, void* workspace) {
  cudnnHandle_t h = Handle(device, stream);
  auto& g = GraphFor(Key{device, B, T, NH, C / NH, false}, h, scale);
  uint16_t* q = const_cast<uint16_t*>(qkv16);
  std::unordered_map<int64_t, void*> pack = {{kQ, q}, {kK, q + C}, {kV, q + 2 * C}, {kO, o16}, {kStats, lse}};
  Check(g.execute(h, pack, workspace), "execute (forward)");
}

void CudnnAttentionBackward(int device, cudaStream_t stream, uint16_t* dqkv16, const uint16_t* dout16,
                            const uint16_t* qkv16, const uint16_t* o16, const float* lse, int B, int T, int C, int NH,
                            float scale, void* workspace) {
  cudnnHandle_t h = Handle(device, stream);
  auto& g = GraphFor(Key{device, B, T, NH, C / NH, true}, h, scale);
  uint16_t* q = const_cast<uint16_t*>(qkv16);
  std::unordered_map<int64_t, void*> pack = {{kQ, q},
                                             {kK, q + C},
                                             {kV, q + 2 * C},
                                             {kO, const_cast<uint16_t*>(o16)},
                                             {kDO, const_cast<uint16_t*>(dout16)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, dqkv16},
                                             {kDK, dqkv16 + C},
                                             {kDV, dqkv16 + 2 * C}};
  Check(g.execute(h, pack, workspace), "execute (backward)");
}

#else  // no cuDNN frontend in this build: CheckAttentionChoice refuses --attention cudnn first

bool CudnnAttentionBuilt() { return false; }
namespace {
[[noreturn]] void NotBuilt() { throw std::runtime_error("--attention cudnn: this build has no cuDNN frontend"); }
}  // namespace
size_t CudnnAttentionWorkspace(int, cudaStream_t, bool, int, int, int, int, float) { NotBuilt(); }
void CudnnAttentionForward(int, cudaStream_t, uint16_t*, float*, const uint16_t*, int, int, int, int, float, void*) {
  NotBuilt();
}
void CudnnAttentionBackward(int, cudaStream_t, uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                            const float*, int, int, int, int, float, void*) {
  NotBuilt();
}

#endif

}  // namespace cuda
}  // namespace shardgpt
