// Whole-model properties of --arch llama on tiny configs: the parameter table, the config's
// refusals, gradients against finite differences (grouped-query, multi-query, tied and untied
// heads), activation bytes against the allocation, recomputation bitwise, bf16 activations close
// to fp32.
#include <gtest/gtest.h>

#include "test_util.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "io/file_checks.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/param_layout.h"
#include "model/rng.h"

namespace shardgpt {
namespace {

using testutil::RandomTokens;

GPTConfig Llama(int L, int NH, int KV, int C, int F, int V, bool tied, int maxT = 16) {
  GPTConfig c{L, NH, C, maxT, V};
  c.arch = Arch::kLlama;
  c.n_kv_head = KV, c.ffn_hidden = F, c.tie_embeddings = tied;
  return c;
}

TEST(LlamaLayout, HuggingFaceNamesAndShapes) {
  const GPTConfig c = Llama(2, 8, 2, 64, 96, 300, /*tied=*/false);
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().message();
  ParamLayout layout(c);
  ASSERT_EQ(layout.num_units(), 4);
  auto shape = [&](const std::string& name) {
    const int i = layout.Find(name);
    EXPECT_GE(i, 0) << name;
    return i < 0 ? std::vector<int64_t>{} : layout.tensors()[i].shape;
  };
  EXPECT_EQ(shape("embed_tokens.weight"), (std::vector<int64_t>{384, 64}));
  EXPECT_EQ(shape("layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shape("layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{16, 64}));  // 2 kv heads of 8
  EXPECT_EQ(shape("layers.1.self_attn.v_proj.weight"), (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(shape("layers.1.self_attn.o_proj.weight"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shape("layers.1.mlp.gate_proj.weight"), (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(shape("layers.1.mlp.up_proj.weight"), (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(shape("layers.1.mlp.down_proj.weight"), (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(shape("lm_head.weight"), (std::vector<int64_t>{384, 64}));
  EXPECT_EQ(layout.Find("wpe.weight"), -1);  // no learned positions
  for (const TensorInfo& t : layout.tensors()) EXPECT_EQ(t.name.find("bias"), std::string::npos) << t.name;
  // q|k|v and gate|up are adjacent: one matmul weight each
  const int q = layout.Find("layers.0.self_attn.q_proj.weight"), k = layout.Find("layers.0.self_attn.k_proj.weight");
  const int v = layout.Find("layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(layout.tensors()[k].offset, layout.tensors()[q].offset + layout.tensors()[q].numel);
  EXPECT_EQ(layout.tensors()[v].offset, layout.tensors()[k].offset + layout.tensors()[k].numel);
  const int g = layout.Find("layers.0.mlp.gate_proj.weight"), u = layout.Find("layers.0.mlp.up_proj.weight");
  EXPECT_EQ(layout.tensors()[u].offset, layout.tensors()[g].offset + layout.tensors()[g].numel);
  // the file checks' parameter count (its own sum) agrees with the table
  uint64_t count = 0;
  ASSERT_TRUE(FileParamCount(c, &count));
  EXPECT_EQ(count, layout.total_numel());
  GPTConfig tied = c;
  tied.tie_embeddings = true;
  ASSERT_TRUE(FileParamCount(tied, &count));
  EXPECT_EQ(count, ParamLayout(tied).total_numel());
  EXPECT_EQ(ParamLayout(tied).Find("lm_head.weight"), -1);
}

TEST(LlamaConfig, DefaultsAndRefusals) {
  GPTConfig c = Llama(2, 4, 0, 768, 0, 256, false);
  EXPECT_EQ(c.ffn(), 2048);  // 8/3 x 768 = 2048, a multiple of 256
  c.n_embd = 64;
  EXPECT_EQ(c.ffn(), 256);  // 170.7 rounded up to 256
  EXPECT_EQ(c.kv_heads(), 4);
  auto refused = [](GPTConfig x, const std::string& needle) {
    const Status s = x.Validate();
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  GPTConfig bad = c;
  bad.n_kv_head = 3;
  refused(bad, "--n-kv-head 3 must divide --n-head 4");
  bad = c, bad.n_head = 64, bad.n_embd = 64 * 3;  // head size 3
  refused(bad, "even head size");
  bad = c, bad.rope_theta = 0.5f;
  refused(bad, "--rope-theta");
  bad = c, bad.norm_eps = 0.0f;
  refused(bad, "--norm-eps");
  GPTConfig gpt2{2, 4, 64, 16, 256};
  gpt2.n_kv_head = 2;
  refused(gpt2, "--n-kv-head is a llama option");
  gpt2 = GPTConfig{2, 4, 64, 16, 256}, gpt2.tie_embeddings = false;
  refused(gpt2, "always tied");
  EXPECT_NE(c.ToString().find("llama KV4 F256"), std::string::npos) << c.ToString();
  GPTConfig other = c;
  other.n_kv_head = 2;
  EXPECT_EQ(c.FirstDifference(other), "n_kv_head: 4 vs 2");
  other = c, other.arch = Arch::kGpt2;
  EXPECT_EQ(c.FirstDifference(other), "arch: llama vs gpt2");
}

// d(mean loss)/d(theta) by central differences on a sample of every tensor's elements.
void CheckGradient(const GPTConfig& c) {
  SetComputeThreads(1);
  ParamLayout layout(c);
  LocalParams p(layout);
  InitParameters(layout, 3, p.params());
  Rng rng(5);
  for (size_t i = 0; i < layout.total_numel(); i++) p.params()[i] += 0.1f * rng.Normal();
  const int B = 2, T = 7;  // odd T: positions restart per sequence inside one call
  GPT model(c, B, T);
  auto x = RandomTokens(B * T, c.vocab_size, 7), y = RandomTokens(B * T, c.vocab_size, 8);
  p.ZeroGrads();
  model.Forward(p, x.data(), y.data(), B, T, 1.0f);
  model.Backward(p);
  std::vector<float> grad(p.grads(), p.grads() + layout.total_numel());
  for (const TensorInfo& t : layout.tensors()) {
    const size_t base = layout.units()[t.unit].offset + t.offset;
    const size_t real = t.shape[0] == c.padded_vocab() ? static_cast<size_t>(c.vocab_size) * c.n_embd : t.numel;
    for (int k = 0; k < 4; k++) {
      const size_t i = base + rng.Next() % real;
      float& w = p.params()[i];
      const float saved = w, eps = 1e-2f;
      w = saved + eps;
      const double lp = model.Forward(p, x.data(), y.data(), B, T, 0.0f);
      w = saved - eps;
      const double lm = model.Forward(p, x.data(), y.data(), B, T, 0.0f);
      w = saved;
      const double fd = (lp - lm) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 2e-3 + 5e-2 * std::fabs(fd)) << c.ToString() << " " << t.name << " element " << i - base;
    }
  }
}

TEST(LlamaModel, GradientMatchesFiniteDifferencesGroupedQueryUntied) { CheckGradient(Llama(2, 4, 2, 16, 24, 100, false)); }
TEST(LlamaModel, GradientMatchesFiniteDifferencesMultiQueryTied) { CheckGradient(Llama(2, 4, 1, 16, 24, 100, true)); }
TEST(LlamaModel, GradientMatchesFiniteDifferencesMultiHead) { CheckGradient(Llama(1, 2, 2, 16, 40, 100, false)); }

TEST(LlamaModel, ActivationBytesFormulaMatchesAllocation) {
  const GPTConfig c = Llama(2, 4, 2, 32, 48, 300, false);
  for (Recompute r : {Recompute::kNone, Recompute::kGelu, Recompute::kBlock}) {
    GPT model(c, 3, 16, CpuDevice(), nullptr, r);
    EXPECT_EQ(model.activation_bytes(), GPT::ActivationBytes(c, 3, 16, r)) << RecomputeName(r);
  }
}

// The same steps with every recompute mode: bitwise the same losses and gradients.
TEST(LlamaModel, RecomputeIsBitwise) {
  SetComputeThreads(1);
  const GPTConfig c = Llama(3, 4, 2, 32, 48, 120, false);
  ParamLayout layout(c);
  std::vector<std::vector<float>> grads;
  std::vector<float> losses;
  for (Recompute r : {Recompute::kNone, Recompute::kGelu, Recompute::kBlock}) {
    LocalParams p(layout);
    InitParameters(layout, 11, p.params());
    GPT model(c, 2, 9, CpuDevice(), nullptr, r);
    auto x = RandomTokens(18, 120, 1), y = RandomTokens(18, 120, 2);
    p.ZeroGrads();
    losses.push_back(model.Forward(p, x.data(), y.data(), 2, 9, 1.0f));
    model.Backward(p);
    grads.emplace_back(p.grads(), p.grads() + layout.total_numel());
  }
  for (size_t m = 1; m < grads.size(); m++) {
    EXPECT_EQ(losses[m], losses[0]) << m;
    EXPECT_EQ(grads[m], grads[0]) << m;
  }
}

// bf16 activations: the loss and the gradient's direction stay close to the fp32 run's.
TEST(LlamaModel, Bf16ActivationsCloseToFp32) {
  SetComputeThreads(1);
  const GPTConfig c = Llama(2, 4, 2, 32, 48, 120, false);
  ParamLayout layout(c);
  auto x = RandomTokens(2 * 12, 120, 3), y = RandomTokens(2 * 12, 120, 4);
  std::vector<float> loss;
  std::vector<std::vector<float>> grads;
  Kernels& k = CpuDevice().kernels();
  for (DType d : {DType::kF32, DType::kBF16}) {
    k.set_activation_dtype(d);
    {
      LocalParams p(layout);
      InitParameters(layout, 2, p.params());
      GPT model(c, 2, 12);
      p.ZeroGrads();
      loss.push_back(model.Forward(p, x.data(), y.data(), 2, 12, 1.0f));
      model.Backward(p);
      grads.emplace_back(p.grads(), p.grads() + layout.total_numel());
    }
  }
  k.set_activation_dtype(DType::kF32);
  EXPECT_NEAR(loss[1], loss[0], 1e-2 * loss[0]);
  EXPECT_NE(loss[1], loss[0]);  // the bf16 path ran
  double dot = 0, n0 = 0, n1 = 0;
  for (size_t i = 0; i < grads[0].size(); i++)
    dot += double(grads[0][i]) * grads[1][i], n0 += double(grads[0][i]) * grads[0][i], n1 += double(grads[1][i]) * grads[1][i];
  EXPECT_GT(dot / std::sqrt(n0 * n1), 0.99);
}

}  // namespace
}  // namespace shardgpt
