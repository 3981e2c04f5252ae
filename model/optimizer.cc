#include "model/optimizer.h"

#include <cmath>

namespace shardgpt {

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float weight_decay,
                  const AdamWConfig& cfg, int64_t t, float grad_scale) {
  const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
  const float c1 = AdamWC1(cfg, t), c2 = AdamWC2(cfg, t);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++)  // vec: adamw_update
    adamw_element(param + i, grad[i], m + i, v + i, lr, weight_decay, b1, b2, eps, c1, c2, grad_scale);
}

StatusOr<LrSchedule::Kind> LrSchedule::ParseKind(const std::string& name) {
  if (name == "cosine") return Kind::kCosine;
  if (name == "linear") return Kind::kLinear;
  if (name == "constant") return Kind::kConstant;
  if (name == "wsd") return Kind::kWsd;
  return Status::InvalidArgument("--lr-schedule: unknown schedule '" + name + "' (expected cosine, linear, constant or wsd)");
}

float LrSchedule::At(int step) const {
  if (step < warmup_steps) return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  const float min_lr = max_lr * min_lr_frac;
  const int decay_steps = total_steps - warmup_steps;
  if (kind == Kind::kConstant || decay_steps <= 1) return max_lr;
  // progress in [0, 1] over the steps after warmup; the last step reaches min_lr
  const float progress = static_cast<float>(step - warmup_steps) / static_cast<float>(decay_steps - 1);
  switch (kind) {
    case Kind::kCosine:
      return min_lr + 0.5f * (max_lr - min_lr) * (1.0f + std::cos(3.14159265358979f * std::min(progress, 1.0f)));
    case Kind::kLinear:
      return max_lr - (max_lr - min_lr) * std::min(progress, 1.0f);
    case Kind::kWsd: {
      const float stable = 1.0f - decay_frac;
      if (progress <= stable) return max_lr;
      return max_lr - (max_lr - min_lr) * std::min((progress - stable) / decay_frac, 1.0f);
    }
    default:
      return max_lr;
  }
}

}  // namespace shardgpt
