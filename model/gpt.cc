// GPT-2 forward and backward on the CPU kernels. The backward is the forward in reverse;
// review the two side by side (an op added to one is added, reversed, to the other).
#include "model/gpt.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "model/kernels_cpu.h"

namespace shardgpt {

namespace {
void Zero(std::vector<float>& v, size_t n) { std::memset(v.data(), 0, n * sizeof(float)); }
}  // namespace

GPT::GPT(const GPTConfig& config, int B, int T) : config_(config), layout_(config), maxB_(B), maxT_(T) {
  assert(T <= config.max_seq_len);
  const size_t N = static_cast<size_t>(B) * T, C = config.n_embd, NH = config.n_head;
  const size_t Vp = config.padded_vocab();
  inputs_.resize(N);
  encoded_.resize(N * C);
  lnf_.resize(N * C);
  lnf_mean_.resize(N);
  lnf_rstd_.resize(N);
  logits_.resize(N * Vp);
  losses_.resize(N);
  scratch_.resize(N * C);
  layers_.resize(config.n_layer);
  for (LayerActs& a : layers_) {
    a.ln1.resize(N * C), a.ln1_mean.resize(N), a.ln1_rstd.resize(N), a.qkv.resize(N * 3 * C);
    a.atty.resize(N * C), a.lse.resize(N * NH), a.res2.resize(N * C), a.ln2.resize(N * C);
    a.ln2_mean.resize(N), a.ln2_rstd.resize(N), a.fch.resize(N * 4 * C), a.fch_gelu.resize(N * 4 * C);
    a.res3.resize(N * C);
  }
  dres_.resize(N * C), dln_.resize(N * C), dqkv_.resize(N * 3 * C), datty_.resize(N * C);
  dfch_.resize(N * 4 * C), dfch_gelu_.resize(N * 4 * C);
}

size_t GPT::activation_bytes() const {
  size_t n = encoded_.size() + lnf_.size() + lnf_mean_.size() + lnf_rstd_.size() + logits_.size() + losses_.size() +
             scratch_.size() + dres_.size() + dln_.size() + dqkv_.size() + datty_.size() + dfch_.size() +
             dfch_gelu_.size();
  for (const LayerActs& a : layers_)
    n += a.ln1.size() + a.ln1_mean.size() + a.ln1_rstd.size() + a.qkv.size() + a.atty.size() + a.lse.size() +
         a.res2.size() + a.ln2.size() + a.ln2_mean.size() + a.ln2_rstd.size() + a.fch.size() + a.fch_gelu.size() +
         a.res3.size();
  return n * sizeof(float) + inputs_.size() * sizeof(int32_t);
}

size_t GPT::ActivationBytes(const GPTConfig& c, int B, int T) {
  const size_t N = static_cast<size_t>(B) * T, C = c.n_embd, NH = c.n_head, Vp = c.padded_vocab();
  // encoded, lnf, scratch, dres, dln, datty: NC each; dqkv 3NC; dfch, dfch_gelu 4NC each
  const size_t top = N * C * 6 + N * 2 + N * Vp + N + N * 3 * C + N * 8 * C;
  // per layer: ln1, atty, res2, ln2, res3: NC; qkv 3NC; fch, fch_gelu 4NC; 4 stats of N; lse N*NH
  const size_t layer = N * C * 5 + N * 3 * C + N * 8 * C + N * 4 + N * NH;
  return (top + layer * c.n_layer) * sizeof(float) + N * sizeof(int32_t);
}

// One transformer block, pre-LayerNorm:
//   res2 = x + attn_proj(attention(qkv(ln_1(x))));  res3 = res2 + mlp_proj(gelu(fc(ln_2(res2))))
void GPT::BlockForward(const float* p, const float* x, LayerActs& a, int B, int T) {
  const BlockOffsets& o = layout_.block();
  const int C = config_.n_embd, N = B * T;
  layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p + o.ln1_w, p + o.ln1_b, N, C);
  matmul_forward(a.qkv.data(), a.ln1.data(), p + o.qkv_w, p + o.qkv_b, N, C, 3 * C);
  attention_forward(a.atty.data(), a.lse.data(), a.qkv.data(), B, T, C, config_.n_head);
  matmul_forward(scratch_.data(), a.atty.data(), p + o.attproj_w, p + o.attproj_b, N, C, C);
  residual_forward(a.res2.data(), x, scratch_.data(), static_cast<size_t>(N) * C);
  layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p + o.ln2_w, p + o.ln2_b, N, C);
  matmul_forward(a.fch.data(), a.ln2.data(), p + o.fc_w, p + o.fc_b, N, C, 4 * C);
  gelu_forward(a.fch_gelu.data(), a.fch.data(), static_cast<size_t>(N) * 4 * C);
  matmul_forward(scratch_.data(), a.fch_gelu.data(), p + o.fcproj_w, p + o.fcproj_b, N, 4 * C, C);
  residual_forward(a.res3.data(), a.res2.data(), scratch_.data(), static_cast<size_t>(N) * C);
}

// Reverse of BlockForward. On entry dres holds dL/dres3; on exit it holds dL/dx. It passes
// through dL/dres2 on the way: each residual add routes the gradient to both branches, so the
// LayerNorm backward simply accumulates its input gradient into dres.
void GPT::BlockBackward(const float* p, float* g, float* dres, const float* x, const LayerActs& a, int B, int T) {
  const BlockOffsets& o = layout_.block();
  const int C = config_.n_embd, N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  // res3 = res2 + fcproj(fch_gelu): the MLP branch
  Zero(dfch_gelu_, NC * 4);
  matmul_backward(dfch_gelu_.data(), g + o.fcproj_w, g + o.fcproj_b, dres, a.fch_gelu.data(), p + o.fcproj_w, N, 4 * C, C);
  Zero(dfch_, NC * 4);
  gelu_backward(dfch_.data(), a.fch.data(), dfch_gelu_.data(), NC * 4);
  Zero(dln_, NC);
  matmul_backward(dln_.data(), g + o.fc_w, g + o.fc_b, dfch_.data(), a.ln2.data(), p + o.fc_w, N, C, 4 * C);
  layernorm_backward(dres, g + o.ln2_w, g + o.ln2_b, dln_.data(), a.res2.data(), p + o.ln2_w, a.ln2_mean.data(),
                     a.ln2_rstd.data(), N, C);  // dres is now dL/dres2
  // res2 = x + attproj(attention(qkv(ln_1(x)))): the attention branch
  Zero(datty_, NC);
  matmul_backward(datty_.data(), g + o.attproj_w, g + o.attproj_b, dres, a.atty.data(), p + o.attproj_w, N, C, C);
  Zero(dqkv_, NC * 3);
  attention_backward(dqkv_.data(), datty_.data(), a.qkv.data(), a.atty.data(), a.lse.data(), B, T, C, config_.n_head);
  Zero(dln_, NC);
  matmul_backward(dln_.data(), g + o.qkv_w, g + o.qkv_b, dqkv_.data(), a.ln1.data(), p + o.qkv_w, N, C, 3 * C);
  layernorm_backward(dres, g + o.ln1_w, g + o.ln1_b, dln_.data(), x, p + o.ln1_w, a.ln1_mean.data(),
                     a.ln1_rstd.data(), N, C);  // dres is now dL/dx
}

float GPT::Forward(UnitHooks& hooks, const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale) {
  assert(B <= maxB_ && T <= maxT_);
  B_ = B, T_ = T;
  const int C = config_.n_embd, N = B * T, L = config_.n_layer;
  std::copy(inputs, inputs + N, inputs_.begin());

  const int E = ParamLayout::kEmbedUnit, F = layout_.final_unit();
  const float* pe = hooks.PreForward(E);
  encoder_forward(encoded_.data(), inputs, pe + layout_.wte_offset(), pe + layout_.wpe_offset(), B, T, C);
  const float* x = encoded_.data();
  for (int l = 0; l < L; l++) {
    const int u = layout_.block_unit(l);
    BlockForward(hooks.PreForward(u), x, layers_[l], B, T);
    hooks.PostForward(u);
    x = layers_[l].res3.data();
  }
  const float* pf = hooks.PreForward(F);
  layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, pf, pf + C, N, C);
  // LM head tied to wte: logits[N,Vp] = lnf @ wte^T
  matmul_forward(logits_.data(), lnf_.data(), pe + layout_.wte_offset(), nullptr, N, C, config_.padded_vocab());
  hooks.PostForward(F);
  hooks.PostForward(E);

  have_grad_ = targets != nullptr && grad_scale != 0.0f;
  if (targets == nullptr) return 0.0f;
  // mean loss over positions; its gradient is scaled by grad_scale / N
  const float dloss = have_grad_ ? grad_scale / static_cast<float>(N) : 0.0f;
  double sum = crossentropy_softmax(logits_.data(), losses_.data(), targets, N, config_.vocab_size,
                                    config_.padded_vocab(), dloss);
  return static_cast<float>(sum / N);
}

void GPT::Backward(UnitHooks& hooks) {
  assert(have_grad_);
  have_grad_ = false;
  const int B = B_, T = T_, C = config_.n_embd, N = B * T, L = config_.n_layer;
  const int E = ParamLayout::kEmbedUnit, F = layout_.final_unit();
  UnitBuffers e = hooks.PreBackward(E);
  UnitBuffers f = hooks.PreBackward(F);
  // LM head: logits = lnf @ wte^T  (logits_ now holds dlogits)
  Zero(dln_, static_cast<size_t>(N) * C);
  matmul_backward(dln_.data(), e.grads + layout_.wte_offset(), nullptr, logits_.data(), lnf_.data(),
                  e.params + layout_.wte_offset(), N, C, config_.padded_vocab());
  // lnf = layernorm(x_L)
  const float* xL = L > 0 ? layers_[L - 1].res3.data() : encoded_.data();
  Zero(dres_, static_cast<size_t>(N) * C);
  layernorm_backward(dres_.data(), f.grads, f.grads + C, dln_.data(), xL, f.params, lnf_mean_.data(),
                     lnf_rstd_.data(), N, C);
  hooks.PostBackward(F);
  for (int l = L - 1; l >= 0; l--) {
    const int u = layout_.block_unit(l);
    UnitBuffers b = hooks.PreBackward(u);
    const float* x = l > 0 ? layers_[l - 1].res3.data() : encoded_.data();
    BlockBackward(b.params, b.grads, dres_.data(), x, layers_[l], B, T);
    hooks.PostBackward(u);
  }
  encoder_backward(e.grads + layout_.wte_offset(), e.grads + layout_.wpe_offset(), dres_.data(), inputs_.data(), B,
                   T, C);
  hooks.PostBackward(E);
}

LocalParams::LocalParams(const ParamLayout& layout)
    : layout_(layout), params_(layout.total_numel()), grads_(layout.total_numel(), 0.0f) {}

void LocalParams::ZeroGrads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

}  // namespace shardgpt
