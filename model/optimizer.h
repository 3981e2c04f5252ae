// AdamW's element-wise update and the learning-rate schedules.
//
// AdamW is element-wise, which is what lets ZeRO shard it: a rank that owns a slice of the
// parameters, their averaged gradient and their moments updates that slice alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cmath>

#include "base/status.h"

namespace shardgpt {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to 2-D weights and embeddings only (see ParamLayout::DecayRanges)
};

// One AdamW step (PyTorch semantics, decoupled weight decay, bias correction), t >= 1:
//   g = grad * grad_scale                 (grad_scale carries the clipping factor)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p = p - lr * (wd * p + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps))
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float weight_decay,
                  const AdamWConfig& cfg, int64_t t, float grad_scale);

// The bias corrections of step t: c1 = 1/(1-b1^t), c2 = 1/(1-b2^t) (float, as adamw_update).
inline float AdamWC1(const AdamWConfig& cfg, int64_t t) {
  return 1.0f / (1.0f - std::pow(cfg.beta1, static_cast<float>(t)));
}
inline float AdamWC2(const AdamWConfig& cfg, int64_t t) {
  return 1.0f / (1.0f - std::pow(cfg.beta2, static_cast<float>(t)));
}

// adamw_update's per-element step on one element (g already widened to fp32, not yet scaled).
// Every CPU AdamW loop calls this one expression, so they agree bit for bit (adamw_mixed in
// model/kernels_cpu.h; the CUDA twin in model/cuda/kernels_cuda.cu repeats it).
// Each multiply-add is an explicit fma and no other add has a product operand, so no compiler
// can contract the expression differently (GCC here, nvcc on a GPU, in a vector or a scalar
// loop): the bits are the same on every backend and path.
//   m = fma(b1, m, (1-b1) g);  v = fma(b2, v, ((1-b2) g) g)
//   p = fma(-lr, fma(wd, p, (m c1) / (sqrt(v c2) + eps)), p)
inline void adamw_element(float* p, float grad, float* m, float* v, float lr, float wd, float b1, float b2, float eps,
                          float c1, float c2, float grad_scale) {
  const float g = grad * grad_scale;
  const float mi = std::fma(b1, *m, (1.0f - b1) * g);
  const float vi = std::fma(b2, *v, ((1.0f - b2) * g) * g);
  *m = mi;
  *v = vi;
  *p = std::fma(-lr, std::fma(wd, *p, (mi * c1) / (std::sqrt(vi * c2) + eps)), *p);
}

// Learning rate per step: linear warmup over warmup_steps to max_lr, then
//   cosine   : cosine decay to min_lr = max_lr * min_lr_frac at the last step
//   linear   : linear decay to min_lr
//   constant : max_lr
//   wsd      : warmup-stable-decay: constant, then linear decay to min_lr over the last
//              decay_frac of the steps
struct LrSchedule {
  enum class Kind { kCosine, kLinear, kConstant, kWsd };
  Kind kind = Kind::kCosine;
  float max_lr = 6e-4f;
  float min_lr_frac = 0.1f;
  int warmup_steps = 0;
  int total_steps = 1;
  float decay_frac = 0.2f;  // wsd only

  static StatusOr<Kind> ParseKind(const std::string& name);
  float At(int step) const;  // step is 0-based
};

}  // namespace shardgpt
