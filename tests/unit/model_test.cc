// Whole-model properties on a tiny config: gradient against finite differences, loss at
// initialisation, overfitting one batch, gradient accumulation equivalence, layout.
#include <gtest/gtest.h>

#include "test_util.h"

#include <stdexcept>
#include <string>

#include <algorithm>

#include <cstring>

#include <cmath>
#include <vector>

#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "model/rng.h"

namespace shardgpt {
namespace {

using testutil::RandomTokens;

TEST(Layout, TensorsTileUnitsExactly) {
  GPTConfig c{3, 2, 16, 8, 100};
  ParamLayout layout(c);
  EXPECT_EQ(layout.num_units(), 5);
  size_t total = 0;
  for (const UnitInfo& u : layout.units()) {
    size_t off = 0;
    for (int i = u.first_tensor; i < u.first_tensor + u.num_tensors; i++) {
      EXPECT_EQ(layout.tensors()[i].offset, off) << layout.tensors()[i].name;
      off += layout.tensors()[i].numel;
    }
    EXPECT_EQ(off, u.numel);
    EXPECT_EQ(u.offset, total);
    total += u.numel;
  }
  EXPECT_EQ(total, layout.total_numel());
  // GPT-2 124M has 124,475,904 parameters with the padded vocabulary (as llm.c counts them)
  ParamLayout gpt2(PresetConfig("d12").value());
  EXPECT_EQ(gpt2.total_numel(), 124475904u);
  EXPECT_EQ(gpt2.config().padded_vocab(), 50304);
}

TEST(Layout, DecayRangesFollowTensorKinds) {
  ParamLayout layout(GPTConfig{1, 2, 16, 8, 128});
  const int u = layout.block_unit(0);
  auto ranges = layout.DecayRanges(u, 0, layout.units()[u].numel);
  size_t decayed = 0;
  for (const auto& r : ranges) decayed += r.decay ? r.end - r.begin : 0;
  const size_t C = 16;
  EXPECT_EQ(decayed, 3 * C * C + C * C + 4 * C * C + 4 * C * C);  // the four weight matrices
}

TEST(Model, ActivationBytesFormulaMatchesAllocation) {
  GPTConfig c{2, 2, 32, 16, 300};
  GPT model(c, 3, 16);
  EXPECT_EQ(model.activation_bytes(), GPT::ActivationBytes(c, 3, 16));
}

TEST(Model, LossAtInitIsLnVocab) {
  SetComputeThreads(1);
  GPTConfig c{2, 4, 64, 32, 256};
  ParamLayout layout(c);
  LocalParams p(layout);
  InitParameters(layout, 1, p.params());
  GPT model(c, 4, 32);
  auto x = RandomTokens(4 * 32, 256, 1), y = RandomTokens(4 * 32, 256, 2);
  const float loss = model.Forward(p, x.data(), y.data(), 4, 32, 0.0f);
  EXPECT_NEAR(loss, std::log(256.0f), 0.05f);
}

// The device boundary refuses token ids outside [0, V) (inputs and targets) before any kernel
// indexes wte with them; an id of exactly V (one past the table) is the case that matters.
TEST(Model, ForwardRefusesTokenIdsOutsideTheVocabulary) {
  SetComputeThreads(1);
  GPTConfig c{1, 2, 32, 16, 300};
  ParamLayout layout(c);
  LocalParams p(layout);
  InitParameters(layout, 1, p.params());
  GPT model(c, 2, 16);
  auto x = RandomTokens(2 * 16, 300, 1), y = RandomTokens(2 * 16, 300, 2);
  EXPECT_NO_THROW(model.Forward(p, x.data(), y.data(), 2, 16, 0.0f));
  x[7] = 300;
  EXPECT_THROW(model.Forward(p, x.data(), y.data(), 2, 16, 0.0f), std::out_of_range);
  x[7] = -1;
  EXPECT_THROW(model.Forward(p, x.data(), nullptr, 2, 16, 0.0f), std::out_of_range);
  x[7] = 3;
  y[31] = 300;
  try {
    model.Forward(p, x.data(), y.data(), 2, 16, 1.0f);
    ADD_FAILURE() << "a target id of V was accepted";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("target token id 300 at position 31"), std::string::npos) << e.what();
  }
}

// d(mean loss)/d(theta) by central differences on a sample of parameters of every tensor.
TEST(Model, GradientMatchesFiniteDifferences) {
  SetComputeThreads(1);
  GPTConfig c{2, 2, 16, 8, 100};  // padded vocab 128: padded logits must not matter
  ParamLayout layout(c);
  LocalParams p(layout);
  InitParameters(layout, 3, p.params());
  Rng rng(5);
  // larger weights than GPT-2 init so every path carries a visible gradient
  for (size_t i = 0; i < layout.total_numel(); i++) p.params()[i] += 0.1f * rng.Normal();
  const int B = 2, T = 8;
  GPT model(c, B, T);
  auto x = RandomTokens(B * T, 100, 7), y = RandomTokens(B * T, 100, 8);
  p.ZeroGrads();
  model.Forward(p, x.data(), y.data(), B, T, 1.0f);
  model.Backward(p);
  std::vector<float> grad(p.grads(), p.grads() + layout.total_numel());
  int checked = 0;
  for (const TensorInfo& t : layout.tensors()) {
    const size_t base = layout.units()[t.unit].offset + t.offset;
    for (int k = 0; k < 4; k++) {
      size_t i = base + (rng.Next() % t.numel);
      if (t.name == "wte.weight") i = base + (rng.Next() % (100 * 16));  // real vocabulary rows
      float& w = p.params()[i];
      const float saved = w, eps = 1e-2f;
      w = saved + eps;
      const double lp = model.Forward(p, x.data(), y.data(), B, T, 0.0f);
      w = saved - eps;
      const double lm = model.Forward(p, x.data(), y.data(), B, T, 0.0f);
      w = saved;
      const double fd = (lp - lm) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 2e-3 + 5e-2 * std::fabs(fd)) << t.name << " element " << i - base;
      checked++;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(layout.tensors().size()) * 4);
  // padded vocabulary rows of wte get no gradient from the LM head
  const size_t pad_begin = 100 * 16, pad_end = 128 * 16;
  for (size_t i = pad_begin; i < pad_end; i++) ASSERT_EQ(grad[i], 0.0f);
}

// A micro-batches of B with loss scaled by 1/A give the gradient of one batch of A*B.
TEST(Model, GradientAccumulationEqualsLargeBatch) {
  SetComputeThreads(1);
  GPTConfig c{2, 2, 32, 16, 256};
  ParamLayout layout(c);
  LocalParams big(layout), acc(layout);
  InitParameters(layout, 9, big.params());
  std::copy(big.params(), big.params() + layout.total_numel(), acc.params());
  const int A = 4, B = 2, T = 16;
  auto x = RandomTokens(A * B * T, 256, 10), y = RandomTokens(A * B * T, 256, 11);
  GPT model_big(c, A * B, T), model_small(c, B, T);
  big.ZeroGrads();
  const float loss_big = model_big.Forward(big, x.data(), y.data(), A * B, T, 1.0f);
  model_big.Backward(big);
  acc.ZeroGrads();
  double loss_acc = 0;
  for (int m = 0; m < A; m++) {
    loss_acc += model_small.Forward(acc, x.data() + m * B * T, y.data() + m * B * T, B, T, 1.0f / A) / A;
    model_small.Backward(acc);
  }
  EXPECT_NEAR(loss_big, loss_acc, 1e-5);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < layout.total_numel(); i++) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(big.grads()[i] - acc.grads()[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(big.grads()[i])));
  }
  EXPECT_GT(max_abs, 1e-3);
  EXPECT_LT(max_diff, 1e-5 * max_abs + 1e-7);
}

// A tiny model memorises one batch: the loss falls far below ln(V).
TEST(Model, OverfitsOneBatch) {
  SetComputeThreads(1);
  GPTConfig c{2, 2, 32, 16, 64};
  ParamLayout layout(c);
  LocalParams p(layout);
  InitParameters(layout, 4, p.params());
  const size_t n = layout.total_numel();
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  const int B = 2, T = 16;
  auto x = RandomTokens(B * T, 64, 12), y = RandomTokens(B * T, 64, 13);
  GPT model(c, B, T);
  AdamWConfig cfg;
  float first = 0, last = 0;
  for (int step = 1; step <= 150; step++) {
    p.ZeroGrads();
    last = model.Forward(p, x.data(), y.data(), B, T, 1.0f);
    if (step == 1) first = last;
    model.Backward(p);
    adamw_update(p.params(), p.grads(), m.data(), v.data(), n, 3e-3f, 0.0f, cfg, step, 1.0f);
  }
  EXPECT_NEAR(first, std::log(64.0f), 0.1f);
  EXPECT_LT(last, 0.3f);
}

TEST(Model, SameSeedSameBits) {
  SetComputeThreads(1);
  GPTConfig c{2, 2, 32, 16, 256};
  ParamLayout layout(c);
  auto run = [&]() {
    LocalParams p(layout);
    InitParameters(layout, 21, p.params());
    GPT model(c, 2, 16);
    auto x = RandomTokens(32, 256, 1), y = RandomTokens(32, 256, 2);
    p.ZeroGrads();
    float loss = model.Forward(p, x.data(), y.data(), 2, 16, 1.0f);
    model.Backward(p);
    return std::make_pair(loss, std::vector<float>(p.grads(), p.grads() + layout.total_numel()));
  };
  auto a = run(), b = run();
  EXPECT_EQ(a.first, b.first);
  EXPECT_TRUE(a.second == b.second);
}

TEST(Optimizer, AdamWFirstStepMovesByLr) {
  // with m, v = 0 the bias-corrected first step is lr * sign(g) (up to eps)
  std::vector<float> p{1.0f, -2.0f, 0.5f}, g{0.3f, -0.001f, 2.0f}, m(3), v(3);
  AdamWConfig cfg;
  adamw_update(p.data(), g.data(), m.data(), v.data(), 3, 0.01f, 0.0f, cfg, 1, 1.0f);
  EXPECT_NEAR(p[0], 0.99f, 1e-5);
  EXPECT_NEAR(p[1], -1.99f, 1e-5);
  EXPECT_NEAR(p[2], 0.49f, 1e-5);
  // decoupled weight decay shrinks the parameter by lr * wd * p
  std::vector<float> q{1.0f}, z{0.0f}, m1(1), v1(1);
  adamw_update(q.data(), z.data(), m1.data(), v1.data(), 1, 0.1f, 0.5f, cfg, 1, 1.0f);
  EXPECT_NEAR(q[0], 0.95f, 1e-6);
}

TEST(Optimizer, Schedules) {
  LrSchedule s;
  s.max_lr = 1.0f, s.min_lr_frac = 0.1f, s.warmup_steps = 10, s.total_steps = 110;
  EXPECT_NEAR(s.At(0), 0.1f, 1e-6);
  EXPECT_NEAR(s.At(9), 1.0f, 1e-6);
  EXPECT_NEAR(s.At(10), 1.0f, 1e-6);
  EXPECT_NEAR(s.At(109), 0.1f, 1e-5);  // cosine reaches the floor at the last step
  EXPECT_NEAR(s.At(60), 0.55f, 0.02f);
  s.kind = LrSchedule::Kind::kLinear;
  EXPECT_NEAR(s.At(109), 0.1f, 1e-5);
  s.kind = LrSchedule::Kind::kConstant;
  EXPECT_NEAR(s.At(100), 1.0f, 1e-6);
  s.kind = LrSchedule::Kind::kWsd;
  s.decay_frac = 0.2f;
  EXPECT_NEAR(s.At(80), 1.0f, 1e-6);   // stable phase
  EXPECT_NEAR(s.At(109), 0.1f, 1e-5);  // decayed
  EXPECT_FALSE(LrSchedule::ParseKind("exp").ok());
}

}  // namespace
// A rank initialising only its slices gets bitwise the full initialisation's values, for
// slices that start and end anywhere (inside tensors, across tensor boundaries, in wte's
// padded rows).
TEST(Model, InitParameterRangeIsTheFullInitsSlice) {
  const GPTConfig c{2, 2, 32, 16, 200};  // Vp = 256: padded wte rows
  ParamLayout layout(c);
  std::vector<float> full(layout.total_numel());
  InitParameters(layout, 42, full.data());
  Rng pick(3);
  for (int trial = 0; trial < 200; trial++) {
    const int u = static_cast<int>(pick.Next() % layout.num_units());
    const size_t n = layout.units()[u].numel;
    size_t a = pick.Next() % (n + 1), b = pick.Next() % (n + 1);
    if (a > b) std::swap(a, b);
    std::vector<float> slice(b - a);
    InitParameterRange(layout, 42, u, a, b, slice.data());
    const float* want = full.data() + layout.units()[u].offset + a;
    // compared as vectors: an empty slice's data() may be null, which memcmp must not get
    ASSERT_TRUE(std::equal(slice.begin(), slice.end(), want, [](float x, float y) {
      return std::memcmp(&x, &y, sizeof x) == 0;  // bitwise
    })) << "unit " << u << " [" << a << ", " << b << ")";
  }
}

}  // namespace shardgpt
