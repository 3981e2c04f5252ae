#include "parallel/memory_model.h"

#include <algorithm>
#include <map>
#include <string>

#include "model/gpt.h"

namespace shardgpt {

namespace {

// Live transient buffers in allocation order; remembers the largest total and what made it.
class Timeline {
 public:
  enum Kind { kGathered, kScratch, kComm };
  bool Has(const std::string& key) const { return live_.count(key) > 0; }
  void Alloc(const std::string& key, Kind kind, double bytes, const std::string& where) {
    if (Has(key)) return;
    live_[key] = {kind, bytes};
    now_ += bytes;
    if (now_ > peak_.total) {
      peak_ = Snapshot{now_, 0, 0, 0, where};
      for (const auto& kv : live_) (kv.second.first == kGathered ? peak_.gathered : kv.second.first == kScratch ? peak_.scratch : peak_.comm) += kv.second.second;
    }
  }
  void Free(const std::string& key) {
    auto it = live_.find(key);
    if (it == live_.end()) return;
    now_ -= it->second.second;
    live_.erase(it);
  }
  // Renames a live buffer (a gradient scratch handed to the communicator as its send buffer).
  void Move(const std::string& from, const std::string& to) {
    auto it = live_.find(from);
    if (it == live_.end()) return;
    live_[to] = it->second;
    live_.erase(it);
  }
  void FreeAll(const std::string& prefix) {
    for (auto it = live_.begin(); it != live_.end();)
      if (it->first.compare(0, prefix.size(), prefix) == 0) now_ -= it->second.second, it = live_.erase(it);
      else ++it;
  }
  struct Snapshot {
    double total = 0, gathered = 0, scratch = 0, comm = 0;
    std::string where;
  };
  const Snapshot& peak() const { return peak_; }

 private:
  std::map<std::string, std::pair<Kind, double>> live_;
  double now_ = 0;
  Snapshot peak_;
};

}  // namespace

double OptimizerWorkspaceBytes(const ShardPlan&, const EngineOptions&) {
  // AdamW reads the bf16 gradient in its one pass (Kernels::adamw_mixed): no fp32 copy of it.
  return 0;
}

// Replays one step in the engine's order (gpt.h's hook order, ParamStore and GradReducer's
// allocations). Keys: g<u> gathered unit, c<u> fp32 compute copy, s<u> fp32 gradient scratch,
// send<u> a gradient in its reduce-scatter, red<u> a reduce-dtype conversion buffer.
MemoryPrediction PredictPeakMemory(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int B,
                                   int T, int accum, Recompute recompute) {
  MemoryPrediction p;
  const StateSizes s = PersistentStateSizes(plan, o, &layout);  // rank 0: Muon packs second moments per rank
  p.params = s.params, p.grads = s.grads, p.optimizer = s.optimizer;
  p.workspace = OptimizerWorkspaceBytes(plan, o);
  p.activations = static_cast<double>(GPT::ActivationBytes(layout.config(), B, T, recompute, o.act_dtype));

  const int U = plan.num_units(), E = ParamLayout::kEmbedUnit, F = layout.final_unit();
  const bool bf16 = o.dtype == DType::kBF16, stage3 = o.shards_params();
  const bool every_micro = !o.keeps_full_grads();
  const double elt = DTypeSize(o.dtype), rd = DTypeSize(o.reduce_dtype);
  auto padded = [&](int u) { return static_cast<double>(plan.unit(u).padded); };
  auto name = [&](int u) { return layout.units()[u].name; };
  auto key = [](const char* k, int u) { return std::string(k) + std::to_string(u); };
  auto root = [&](int u) { return u == E || u == F; };
  Timeline tl;

  auto gather = [&](int u, const std::string& where) { tl.Alloc(key("g", u), Timeline::kGathered, padded(u) * elt, where); };
  auto compute_view = [&](int u, const std::string& where) {
    if (bf16) tl.Alloc(key("c", u), Timeline::kGathered, padded(u) * 4, where);
  };
  auto release = [&](int u) { tl.Free(key("c", u)), tl.Free(key("g", u)); };
  // stage 0 buckets: the units of each, to know when a bucket completes
  const std::vector<std::vector<int>> buckets = o.zero_stage == 0 ? PlanBuckets(plan, o) : std::vector<std::vector<int>>{};
  int in_flight = -1;  // every-micro: the unit whose reduce-scatter may still run

  const int micro_batches = std::min(accum, 2);  // from the second on, every micro-batch repeats
  for (int m = 0; m < micro_batches; m++) {
    const bool sync = m == micro_batches - 1;
    const std::string mb = micro_batches > 1 ? " (micro-batch " + std::to_string(m + 1) + ")" : "";
    std::vector<int> ready(buckets.size(), 0);
    // ---- forward: PreForward(E), blocks, PreForward(F), PostForward(F), PostForward(E)
    auto pre_forward = [&](int u) {
      const std::string where = "forward of " + name(u) + mb;
      if (stage3) {
        gather(u, where);
        if (u + 1 < U) gather(u + 1, where);  // prefetch
      }
      compute_view(u, where);
    };
    auto post_forward = [&](int u) {
      if (root(u)) return;
      if (!stage3) tl.Free(key("c", u));
      else if (o.reshard_after_forward) release(u);
    };
    pre_forward(E);
    for (int u = 1; u < F; u++) pre_forward(u), post_forward(u);
    pre_forward(F), post_forward(F), post_forward(E);
    // ---- backward: PreBackward(F), PostBackward(F), blocks L..1, PreBackward(E), PostBackward(E)
    // (the previous micro-batch's last reduce-scatter counts as in flight until the first wait)
    auto pre_backward = [&](int u) {
      const std::string where = "backward of " + name(u) + mb;
      if (stage3) {
        gather(u, where);
        if (u - 1 >= 1) gather(u - 1, where);  // prefetch (the embed unit is still gathered)
      }
      compute_view(u, where);
      if (every_micro || bf16) tl.Alloc(key("s", u), Timeline::kScratch, padded(u) * 4, where);
    };
    auto post_backward = [&](int u) {
      const std::string where = "end of the backward of " + name(u) + mb;
      if (every_micro) {
        // at most one unit waits: the previous one's reduce-scatter is waited for first
        if (in_flight >= 0) tl.Free(key("send", in_flight));
        if (o.reduce_dtype == DType::kBF16) {
          tl.Alloc(key("send", u), Timeline::kComm, padded(u) * 2, where);
          tl.Free(key("s", u));
        } else {
          tl.Move(key("s", u), key("send", u));
        }
        in_flight = u;
      } else {
        tl.Free(key("s", u));  // accumulated into the full gradient
        if (sync && o.reduce_dtype != o.dtype) {
          // a conversion buffer per reduction, counted as in flight until the optimizer step
          if (o.zero_stage == 0) {
            for (size_t b = 0; b < buckets.size(); b++)
              if (std::find(buckets[b].begin(), buckets[b].end(), u) != buckets[b].end() &&
                  ++ready[b] == static_cast<int>(buckets[b].size())) {
                double count = 0;
                for (int v : buckets[b]) count += padded(v);
                tl.Alloc(key("red", u), Timeline::kComm, count * rd, where);
              }
          } else {
            tl.Alloc(key("red", u), Timeline::kComm, padded(u) * rd, where);
          }
        }
      }
      if (stage3) release(u);
      else tl.Free(key("c", u));
    };
    pre_backward(F), post_backward(F);
    for (int u = F - 1; u >= 1; u--) pre_backward(u), post_backward(u);
    pre_backward(E), post_backward(E);
  }
  // Step: every reduction is waited for; the optimizer's workspace is persistent
  const Timeline::Snapshot& pk = tl.peak();
  p.gathered = pk.gathered, p.grad_scratch = pk.scratch, p.comm = pk.comm;
  p.where = pk.total > 0 ? pk.where : "between steps (no transient buffers)";
  return p;
}

int LargestFittingMicroBatch(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int T,
                             int accum, Recompute recompute, double budget_bytes, int max_b) {
  auto fits = [&](int b) { return PredictPeakMemory(layout, plan, o, b, T, accum, recompute).peak() <= budget_bytes; };
  if (max_b < 1 || !fits(1)) return 0;
  int lo = 1, hi = 2;  // fits(lo); grow hi until it does not fit, then bisect
  while (hi <= max_b && fits(hi)) lo = hi, hi *= 2;
  if (hi > max_b) {
    if (fits(max_b)) return max_b;
    hi = max_b;
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace shardgpt
