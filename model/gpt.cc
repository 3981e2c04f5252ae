// GPT-2 forward and backward on one device's kernel set (model/kernels.h). The backward is the forward in reverse;
// review the two side by side (an op added to one is added, reversed, to the other).
#include "model/gpt.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/bf16.h"

namespace shardgpt {

StatusOr<Recompute> ParseRecompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "gelu") return Recompute::kGelu;
  if (name == "block") return Recompute::kBlock;
  return Status::InvalidArgument("--recompute " + name + ": expected none, gelu or block");
}

const char* RecomputeName(Recompute r) {
  return r == Recompute::kGelu ? "gelu" : r == Recompute::kBlock ? "block" : "none";
}

namespace {
// The activation region's bytes, padded to 16 so the fp32 slots after it (and a bf16 region's
// 128-bit accesses from the 256-byte-aligned base) stay aligned.
size_t ActRegionBytes(size_t act_elems, size_t act_size) { return (act_elems * act_size + 15) / 16 * 16; }
}  // namespace

GPT::GPT(const GPTConfig& config, int B, int T, Device& device, MemoryLedger* ledger, Recompute recompute)
    : config_(config), layout_(config), device_(device), k_(device.kernels()), maxB_(B), maxT_(T),
      recompute_(recompute), act_dtype_(k_.activation_dtype()), act_size_(DTypeSize(act_dtype_)) {
  assert(T <= config.max_seq_len);
  const size_t N = static_cast<size_t>(B) * T, C = config.n_embd, NH = config.n_head;
  const size_t Vp = config.padded_vocab();
  const bool llama = config.llama();
  // The MLP's widths: its first matmul's output (gpt2 fc 4C, llama gate|up 2F) and its
  // activation's (gpt2 GELU 4C, llama SwiGLU F).
  const size_t FC = llama ? 2 * static_cast<size_t>(config.ffn()) : 4 * C;
  const size_t FA = llama ? static_cast<size_t>(config.ffn()) : 4 * C;
  // Every activation is carved out of one allocation: list the slots, then assign them, the
  // activation-dtype slots first, then the fp32 ones (statistics, lse, losses), then the ids.
  std::vector<void**> slots;
  std::vector<float**> fslots;
  std::vector<size_t> sizes, fsizes;
  auto take = [&](void** p, size_t n) { slots.push_back(p), sizes.push_back(n); };
  auto takef = [&](float** p, size_t n) { fslots.push_back(p), fsizes.push_back(n); };
  take(&encoded_, N * C), take(&lnf_, N * C);
  if (!llama) takef(&lnf_mean_, N);  // RMSNorm keeps no mean
  takef(&lnf_rstd_, N), take(&logits_, N * Vp);
  takef(&losses_, N), take(&scratch_, N * C);
  // A layer's activations; `output` and `gelu`: whether this set holds its own res3, fch_gelu.
  auto take_layer = [&](LayerActs& a, bool output, bool gelu) {
    take(&a.ln1, N * C);
    if (!llama) takef(&a.ln1_mean, N);
    takef(&a.ln1_rstd, N), take(&a.qkv, N * 3 * C);
    take(&a.atty, N * C), takef(&a.lse, N * NH), take(&a.res2, N * C), take(&a.ln2, N * C);
    if (!llama) takef(&a.ln2_mean, N);
    takef(&a.ln2_rstd, N), take(&a.fch, N * FC);
    if (gelu) take(&a.fch_gelu, N * FA);
    if (output) take(&a.res3, N * C);
  };
  layers_.resize(config.n_layer);
  LayerActs shared{};  // kBlock: the working set; kGelu: its fch_gelu is the shared scratch
  if (recompute_ == Recompute::kBlock) take_layer(shared, false, true);
  if (recompute_ == Recompute::kGelu) take(&shared.fch_gelu, N * FA);
  for (LayerActs& a : layers_) {
    if (recompute_ == Recompute::kBlock) take(&a.res3, N * C);
    else take_layer(a, true, recompute_ == Recompute::kNone);
  }
  take(&dres_, N * C), take(&dln_, N * C), take(&dqkv_, N * 3 * C), take(&datty_, N * C);
  take(&dfch_, N * FC), take(&dfch_gelu_, N * FA);
  if (llama) {
    take(&qkv_packed_, N * config.qkv_width());
    takef(&zero_pos_, static_cast<size_t>(T) * C), takef(&dpos_discard_, static_cast<size_t>(T) * C);
  }
  size_t act_elems = 0, f32_elems = 0;
  for (size_t n : sizes) act_elems += n;
  for (size_t n : fsizes) f32_elems += n;
  const size_t act_bytes = ActRegionBytes(act_elems, act_size_);
  // token ids and targets (int32) after the fp32 slots
  acts_ = DeviceBuffer(&device_, ledger, MemKind::kActivations, act_bytes + (f32_elems + 2 * N) * sizeof(float),
                       "activations");
  char* base = acts_.as<char>();
  for (size_t i = 0, off = 0; i < slots.size(); off += sizes[i], i++) *slots[i] = base + off * act_size_;
  float* fbase = reinterpret_cast<float*>(base + act_bytes);
  for (size_t i = 0, off = 0; i < fslots.size(); off += fsizes[i], i++) *fslots[i] = fbase + off;
  inputs_ = reinterpret_cast<int32_t*>(fbase + f32_elems);
  targets_ = inputs_ + N;
  for (LayerActs& a : layers_) {  // the shared slots, now that they have addresses
    if (recompute_ == Recompute::kBlock) {
      void* res3 = a.res3;
      a = shared, a.res3 = res3;
    }
    if (recompute_ == Recompute::kGelu) a.fch_gelu = shared.fch_gelu;
  }
  if (llama) device_.Zero(zero_pos_, static_cast<size_t>(T) * C * sizeof(float));
}

size_t GPT::activation_bytes() const { return acts_.bytes(); }

std::vector<float> GPT::LogitsRow(int n) const {
  const size_t Vp = config_.padded_vocab();
  std::vector<float> row(Vp);
  const char* src = static_cast<const char*>(logits_) + n * Vp * act_size_;
  if (act_dtype_ == DType::kF32) {
    device_.CopyToHost(row.data(), src, Vp * sizeof(float));
  } else {  // bf16 logits, widened for the sampler
    std::vector<uint16_t> bits(Vp);
    device_.CopyToHost(bits.data(), src, Vp * sizeof(uint16_t));
    Bf16ToFloat(bits.data(), row.data(), Vp);
  }
  return row;
}

// Activation elements for N = B*T tokens (C channels, NH heads, L layers, Vp padded vocabulary),
// in the activation dtype (A: 4 bytes fp32, 2 bf16) unless marked fp32:
//   always:  encoded, lnf, scratch, dres, dln, datty NC each; dqkv 3NC; dfch, dfch_gelu 4NC each;
//            logits N*Vp: 17NC + N*Vp;  fp32: lnf stats, losses 3N
//   a layer: ln1, atty, res2, ln2, res3 NC each; qkv 3NC; fch, fch_gelu 4NC each: 16NC;
//            fp32: 4 stats of N, lse N*NH: 4N + N*NH
//   none:  L layers
//   gelu:  L layers without fch_gelu (12NC each) + one shared fch_gelu (4NC)
//   block: L outputs res3 (NC each) + one working layer without res3 (15NC + fp32 4N + N*NH)
// Bytes: the activation elements x A, padded to 16, + the fp32 elements x 4 + the int32 inputs
// and targets (2N x 4). GPT-2 124M (C 768, L 12, Vp 50304), one sequence of T 1024, fp32:
// none 824.3 MiB, gelu 692.3 MiB (-16%), block 328.6 MiB (-60%); bf16 roughly halves each
// (only the fp32 statistics, lse, losses and ids stay). The logits (N*Vp, 196.5 MiB at fp32)
// are in every mode: without them block keeps 21% of none's (-79%), and they are then 60% of
// what is left (only a chunked LM head and loss would cut them).
//
// bf16 activations (--dtype bf16 / --compute-dtype bf16; model/compute_precision.h) store every
// slot above but the fp32 ones in bf16, activation gradients included, as llm.c does. Each
// gradient buffer is zeroed and then accumulated into once per block (dfch_gelu, dfch, dln,
// datty, dqkv: one rounding each), except dres, the residual stream's gradient: the two
// LayerNorm backwards of every block and the encoder read it, so it takes 2L roundings through
// the backward. It is still bf16 (llm.c's choice too): each rounding is one relative 2^-8 of
// the running sum, not of a small increment lost against a large total, and the end-to-end test
// (tests/unit/gpt_bf16_act_test.cc) bounds the loss against the fp32-activation run.
//
// llama (F the SwiGLU width, W = (NH + 2 KV) hs the packed q|k|v width, norms keep rstd only):
//   always:  encoded, lnf, scratch, dres, dln, datty NC each; dqkv 3NC; dfch 2NF; dfch_gelu NF;
//            the packed qkv NW; logits N*Vp;  fp32: lnf rstd, losses 2N, the zero position table
//            and its discarded gradient 2TC
//   a layer: ln1, atty, res2, ln2, res3 NC each; qkv 3NC; fch 2NF; fch_gelu NF: 8NC + 3NF;
//            fp32: 2 rstd of N, lse N*NH
//   the modes as above, with fch_gelu NF instead of 4NC.
size_t GPT::ActivationBytes(const GPTConfig& c, int B, int T, Recompute recompute, DType act_dtype) {
  const size_t N = static_cast<size_t>(B) * T, C = c.n_embd, NH = c.n_head, Vp = c.padded_vocab(), L = c.n_layer;
  const size_t F = c.ffn(), W = c.qkv_width();
  const size_t top = c.llama() ? N * C * 9 + 3 * N * F + N * W + N * Vp : N * C * 17 + N * Vp;
  const size_t top_f32 = c.llama() ? N * 2 + 2 * static_cast<size_t>(T) * C : N * 3;
  const size_t layer = c.llama() ? N * C * 8 + 3 * N * F : N * C * 16;
  const size_t layer_f32 = (c.llama() ? N * 2 : N * 4) + N * NH;
  const size_t gelu = c.llama() ? N * F : 4 * N * C;  // the MLP activation's elements
  size_t layers = layer * L, layers_f32 = layer_f32 * L;
  if (recompute == Recompute::kGelu) layers = (layer - gelu) * L + gelu;
  if (recompute == Recompute::kBlock) layers = N * C * L + (layer - N * C), layers_f32 = layer_f32;
  return ActRegionBytes(top + layers, DTypeSize(act_dtype)) + (top_f32 + layers_f32) * sizeof(float) +
         2 * N * sizeof(int32_t);  // + inputs, targets
}

// Per token: qkv 3C^2, attention projection C^2, fc 4C^2, fc projection 4C^2 multiply-adds per
// layer; the causal attention's scores and weighted sum T/2 x C each on average (bench_train's
// 6LCT per token for a whole step); the LM head C x Vp. Two FLOPs per multiply-add.
// llama: q|k|v C x W, o_proj C^2, gate|up 2CF, down FC multiply-adds per token and layer, the
// attention as above (every query head attends over T/2 keys whatever the kv heads).
double GPT::ForwardFlops(const GPTConfig& c, int B, int T) {
  const double N = static_cast<double>(B) * T, C = c.n_embd, F = c.ffn(), W = c.qkv_width();
  const double block = c.llama() ? 2 * (C * W + C * C + 3 * C * F + 1.0 * T * C) : 2 * (12 * C * C + 1.0 * T * C);
  return N * (c.n_layer * block + 2 * C * c.padded_vocab());
}

double GPT::RecomputeFlops(const GPTConfig& c, int B, int T, Recompute recompute) {
  const double N = static_cast<double>(B) * T, C = c.n_embd, F = c.ffn(), W = c.qkv_width();
  if (recompute == Recompute::kGelu) return N * (c.llama() ? F : 4 * C) * c.n_layer;
  if (recompute != Recompute::kBlock || c.n_layer < 1) return 0;
  // the last block's working set is still the forward's; no block re-runs its last projection
  const double block = c.llama() ? C * W + C * C + 2 * C * F + 1.0 * T * C : 8 * C * C + 1.0 * T * C;
  return N * (c.n_layer - 1) * 2 * block;
}

// One transformer block, pre-LayerNorm:
//   res2 = x + attn_proj(attention(qkv(ln_1(x))));  res3 = res2 + mlp_proj(gelu(fc(ln_2(res2))))
// Each residual add is fused with the LayerNorm that reads its result (residual_layernorm_forward,
// bitwise the two kernels): res2 with ln_2 here; res3 with the next block's ln_1, or with ln_f
// after the last block. That LayerNorm's parameters belong to the next unit, so the caller makes
// the fused call once it holds them (ForwardToLogits): on return with `output`, scratch_ holds
// mlp_proj(...) and a.res3 is not yet written. ln1_ready: the caller's fused call already wrote
// a.ln1 and its statistics from x (else, block 0 and kBlock's re-forward, ln_1 runs here).
void GPT::BlockForward(const float* p, const void* x, LayerActs& a, int B, int T, bool output, bool ln1_ready) {
  const BlockOffsets& o = layout_.block();
  const int C = config_.n_embd, N = B * T;
  if (!ln1_ready) k_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p + o.ln1_w, p + o.ln1_b, N, C);
  k_.matmul_forward(a.qkv, a.ln1, p + o.qkv_w, p + o.qkv_b, N, C, 3 * C);
  k_.attention_forward(a.atty, a.lse, a.qkv, B, T, C, config_.n_head);
  k_.matmul_forward(scratch_, a.atty, p + o.attproj_w, p + o.attproj_b, N, C, C);
  k_.residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, scratch_, p + o.ln2_w, p + o.ln2_b, N, C);
  if (k_.gelu_fused()) {  // --gelu fused: the GELU in the fc matmul's epilogue
    k_.matmul_gelu_forward(a.fch_gelu, a.fch, a.ln2, p + o.fc_w, p + o.fc_b, N, C, 4 * C);
  } else {
    k_.matmul_forward(a.fch, a.ln2, p + o.fc_w, p + o.fc_b, N, C, 4 * C);
    k_.gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C);
  }
  if (!output) return;  // a re-forward (kBlock): the backward needs nothing past the GELU
  k_.matmul_forward(scratch_, a.fch_gelu, p + o.fcproj_w, p + o.fcproj_b, N, 4 * C, C);
  // a.res3 = a.res2 + scratch_: the caller's residual_layernorm_forward
}

// Reverse of BlockForward. On entry dres holds dL/dres3; on exit it holds dL/dx. It passes
// through dL/dres2 on the way: each residual add routes the gradient to both branches, so the
// LayerNorm backward simply accumulates its input gradient into dres.
void GPT::BlockBackward(const float* p, float* g, void* dres, const void* x, const LayerActs& a, int B, int T) {
  const BlockOffsets& o = layout_.block();
  const int C = config_.n_embd, N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  // res3 = res2 + fcproj(fch_gelu): the MLP branch
  if (k_.gelu_fused()) {  // dfch = (dres @ fcproj_w) * gelu'(fch) in the matmul's epilogue (writes dfch)
    k_.matmul_dgelu_backward(dfch_, g + o.fcproj_w, g + o.fcproj_b, dres, a.fch_gelu, a.fch, p + o.fcproj_w, N,
                             4 * C, C);
  } else {
    if (recompute_ == Recompute::kGelu) k_.gelu_forward(a.fch_gelu, a.fch, NC * 4);  // into the shared scratch
    Zero(dfch_gelu_, NC * 4);
    k_.matmul_backward(dfch_gelu_, g + o.fcproj_w, g + o.fcproj_b, dres, a.fch_gelu, p + o.fcproj_w, N, 4 * C, C);
    Zero(dfch_, NC * 4);
    k_.gelu_backward(dfch_, a.fch, dfch_gelu_, NC * 4);
  }
  Zero(dln_, NC);
  k_.matmul_backward(dln_, g + o.fc_w, g + o.fc_b, dfch_, a.ln2, p + o.fc_w, N, C, 4 * C);
  k_.layernorm_backward(dres, g + o.ln2_w, g + o.ln2_b, dln_, a.res2, p + o.ln2_w, a.ln2_mean,
                     a.ln2_rstd, N, C);  // dres is now dL/dres2
  // res2 = x + attproj(attention(qkv(ln_1(x)))): the attention branch
  Zero(datty_, NC);
  k_.matmul_backward(datty_, g + o.attproj_w, g + o.attproj_b, dres, a.atty, p + o.attproj_w, N, C, C);
  Zero(dqkv_, NC * 3);
  k_.attention_backward(dqkv_, datty_, a.qkv, a.atty, a.lse, B, T, C, config_.n_head);
  Zero(dln_, NC);
  k_.matmul_backward(dln_, g + o.qkv_w, g + o.qkv_b, dqkv_, a.ln1, p + o.qkv_w, N, C, 3 * C);
  k_.layernorm_backward(dres, g + o.ln1_w, g + o.ln1_b, dln_, x, p + o.ln1_w, a.ln1_mean,
                     a.ln1_rstd, N, C);  // dres is now dL/dx
}

// One Llama block, pre-RMSNorm (F = the SwiGLU width, W = the packed q|k|v width):
//   q|k|v = rmsnorm_1(x) @ [Wq; Wk; Wv]^T  (one matmul, [N, W]), rotary on q and k, each kv head
//   repeated for its group of query heads ([N, 3C], what attention reads), then
//   res2 = x + o_proj(attention(...));  res3 = res2 + down(silu(gate) * up), gate|up = rmsnorm_2(res2) @ [Wg; Wu]^T
// output = false: stop after the SwiGLU (kBlock's re-forward); else a.res3 is written here.
void GPT::LlamaBlockForward(const float* p, const void* x, LayerActs& a, int B, int T, bool output) {
  const LlamaBlockOffsets& o = layout_.llama_block();
  const int C = config_.n_embd, N = B * T, NH = config_.n_head, KV = config_.kv_heads(), hs = config_.head_size();
  const int F = config_.ffn(), W = config_.qkv_width();
  const size_t NC = static_cast<size_t>(N) * C;
  k_.rmsnorm_forward(a.ln1, a.ln1_rstd, x, p + o.attn_norm_w, N, C, config_.norm_eps);
  k_.matmul_forward(qkv_packed_, a.ln1, p + o.qkv_w, nullptr, N, C, W);
  k_.rope_forward(qkv_packed_, B, T, NH, KV, hs, config_.rope_theta);
  k_.kv_repeat_forward(a.qkv, qkv_packed_, N, NH, KV, hs);
  k_.attention_forward(a.atty, a.lse, a.qkv, B, T, C, NH);
  k_.matmul_forward(scratch_, a.atty, p + o.o_w, nullptr, N, C, C);
  k_.residual_forward(a.res2, x, scratch_, NC);
  k_.rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, p + o.mlp_norm_w, N, C, config_.norm_eps);
  k_.matmul_forward(a.fch, a.ln2, p + o.gate_up_w, nullptr, N, C, 2 * F);
  k_.swiglu_forward(a.fch_gelu, a.fch, N, F);
  if (!output) return;
  k_.matmul_forward(scratch_, a.fch_gelu, p + o.down_w, nullptr, N, F, C);
  k_.residual_forward(a.res3, a.res2, scratch_, NC);
}

// Reverse of LlamaBlockForward; dres holds dL/dres3 on entry and dL/dx on exit.
void GPT::LlamaBlockBackward(const float* p, float* g, void* dres, const void* x, const LayerActs& a, int B,
                             int T) {
  const LlamaBlockOffsets& o = layout_.llama_block();
  const int C = config_.n_embd, N = B * T, NH = config_.n_head, KV = config_.kv_heads(), hs = config_.head_size();
  const int F = config_.ffn(), W = config_.qkv_width();
  const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
  // res3 = res2 + down(swiglu(gate_up)): the MLP branch
  if (recompute_ == Recompute::kGelu) k_.swiglu_forward(a.fch_gelu, a.fch, N, F);  // into the shared scratch
  Zero(dfch_gelu_, NF);
  k_.matmul_backward(dfch_gelu_, g + o.down_w, nullptr, dres, a.fch_gelu, p + o.down_w, N, F, C);
  Zero(dfch_, 2 * NF);
  k_.swiglu_backward(dfch_, a.fch, dfch_gelu_, N, F);
  Zero(dln_, NC);
  k_.matmul_backward(dln_, g + o.gate_up_w, nullptr, dfch_, a.ln2, p + o.gate_up_w, N, C, 2 * F);
  k_.rmsnorm_backward(dres, g + o.mlp_norm_w, dln_, a.res2, p + o.mlp_norm_w, a.ln2_rstd, N, C);  // dL/dres2
  // res2 = x + o_proj(attention(...)): the attention branch
  Zero(datty_, NC);
  k_.matmul_backward(datty_, g + o.o_w, nullptr, dres, a.atty, p + o.o_w, N, C, C);
  Zero(dqkv_, NC * 3);
  k_.attention_backward(dqkv_, datty_, a.qkv, a.atty, a.lse, B, T, C, NH);
  Zero(qkv_packed_, static_cast<size_t>(N) * W);  // now the packed q|k|v's gradient
  k_.kv_repeat_backward(qkv_packed_, dqkv_, N, NH, KV, hs);
  k_.rope_backward(qkv_packed_, B, T, NH, KV, hs, config_.rope_theta);
  Zero(dln_, NC);
  k_.matmul_backward(dln_, g + o.qkv_w, nullptr, qkv_packed_, a.ln1, p + o.qkv_w, N, C, W);
  k_.rmsnorm_backward(dres, g + o.attn_norm_w, dln_, x, p + o.attn_norm_w, a.ln1_rstd, N, C);  // dL/dx
}

namespace {
// Defence in depth at the device boundary (see Forward in gpt.h): one pass over the ids.
void CheckTokenIds(const int32_t* ids, int n, int vocab, const char* what) {
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw std::out_of_range(std::string(what) + " token id " + std::to_string(ids[i]) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}
}  // namespace

// Everything of Forward up to the logits; the targets (if any) are on the device after it.
void GPT::ForwardToLogits(UnitHooks& hooks, const int32_t* inputs, const int32_t* targets, int B, int T) {
  assert(B <= maxB_ && T <= maxT_);
  if (k_.activation_dtype() != act_dtype_)
    throw std::logic_error(std::string("GPT: activations were allocated in ") + DTypeName(act_dtype_) +
                           " but the kernel set's activation dtype is now " + DTypeName(k_.activation_dtype()));
  if (k_.gelu_fused() && recompute_ == Recompute::kGelu)  // the CLI refuses it first (CheckGeluChoice)
    throw std::logic_error("GPT: --gelu fused with --recompute gelu: a GELU recomputed by the separate kernel "
                           "would not be the fused one's (use --recompute none or block)");
  if (k_.gelu_fused() && config_.llama())  // the CLI refuses it first
    throw std::logic_error("GPT: --gelu fused is a gpt2 option (llama's MLP is SwiGLU)");
  if (config_.llama() && !k_.has_llama_kernels())  // the CLI refuses it first
    throw std::logic_error("GPT: --arch llama needs the Llama kernels, which this device's kernel set lacks");
  B_ = B, T_ = T;
  const int C = config_.n_embd, N = B * T, L = config_.n_layer;
  CheckTokenIds(inputs, N, config_.vocab_size, "input");
  if (targets) CheckTokenIds(targets, N, config_.vocab_size, "target");
  // Asynchronous (pinned staging on CUDA): the host does not wait for the upload.
  device_.CopyToDeviceAsync(inputs_, inputs, static_cast<size_t>(N) * sizeof(int32_t));
  if (targets) device_.CopyToDeviceAsync(targets_, targets, static_cast<size_t>(N) * sizeof(int32_t));

  const int E = ParamLayout::kEmbedUnit, F = layout_.final_unit();
  const float* pe = hooks.PreForward(E);
  if (config_.llama()) {
    LlamaForwardToLogits(hooks, pe, B, T);
    return;
  }
  k_.encoder_forward(encoded_, inputs_, pe + layout_.wte_offset(), pe + layout_.wpe_offset(), B, T, C);
  const void* x = encoded_;
  // The block whose res3 = res2 + scratch_ is still to be written, with the LayerNorm after it.
  const LayerActs* open = nullptr;
  const BlockOffsets& o = layout_.block();
  for (int l = 0; l < L; l++) {
    const int u = layout_.block_unit(l);
    const float* p = hooks.PreForward(u);
    LayerActs& a = layers_[l];
    if (open)  // kBlock: open->res2 is the working set's res2, a.ln1 its ln1 (distinct slots)
      k_.residual_layernorm_forward(open->res3, a.ln1, a.ln1_mean, a.ln1_rstd, open->res2, scratch_, p + o.ln1_w,
                                    p + o.ln1_b, N, C);
    BlockForward(p, x, a, B, T, /*output=*/true, /*ln1_ready=*/open != nullptr);
    hooks.PostForward(u);
    x = a.res3;
    open = &a;
  }
  const float* pf = hooks.PreForward(F);
  if (open)
    k_.residual_layernorm_forward(open->res3, lnf_, lnf_mean_, lnf_rstd_, open->res2, scratch_, pf, pf + C, N, C);
  else
    k_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, pf, pf + C, N, C);
  // LM head tied to wte: logits[N,Vp] = lnf @ wte^T
  k_.matmul_forward(logits_, lnf_, pe + layout_.wte_offset(), nullptr, N, C, config_.padded_vocab());
  head_w_ = pe + layout_.wte_offset();  // the hooks keep E's parameters until PostBackward(E)
  hooks.PostForward(F);
  hooks.PostForward(E);
}

// ForwardToLogits' llama part, from the embedding on (E's parameters at pe): the blocks, the
// final RMSNorm and the LM head (embed_tokens when tied, else the final unit's lm_head).
void GPT::LlamaForwardToLogits(UnitHooks& hooks, const float* pe, int B, int T) {
  const int C = config_.n_embd, N = B * T, L = config_.n_layer;
  const int E = ParamLayout::kEmbedUnit, F = layout_.final_unit();
  k_.encoder_forward(encoded_, inputs_, pe + layout_.wte_offset(), zero_pos_, B, T, C);
  const void* x = encoded_;
  for (int l = 0; l < L; l++) {
    const int u = layout_.block_unit(l);
    LlamaBlockForward(hooks.PreForward(u), x, layers_[l], B, T, /*output=*/true);
    hooks.PostForward(u);
    x = layers_[l].res3;
  }
  const float* pf = hooks.PreForward(F);
  k_.rmsnorm_forward(lnf_, lnf_rstd_, x, pf, N, C, config_.norm_eps);
  // tied: the hooks keep E's parameters until PostBackward(E); untied: Backward reads the
  // head from PreBackward(F)'s parameters
  const float* head = config_.tie_embeddings ? pe + layout_.wte_offset() : pf + layout_.head_offset();
  k_.matmul_forward(logits_, lnf_, head, nullptr, N, C, config_.padded_vocab());
  head_w_ = config_.tie_embeddings ? head : nullptr;
  hooks.PostForward(F);
  hooks.PostForward(E);
}

// Backward's llama part (same hook order as the gpt2 part in Backward).
void GPT::LlamaBackward(UnitHooks& hooks) {
  const int B = B_, T = T_, C = config_.n_embd, N = B * T, L = config_.n_layer, Vp = config_.padded_vocab();
  const int E = ParamLayout::kEmbedUnit, F = layout_.final_unit();
  const bool tied = config_.tie_embeddings;
  UnitBuffers f = hooks.PreBackward(F);
  // logits = lnf @ head^T (logits_ holds dlogits): dlnf now; an untied head's gradient too,
  // a tied one's with the embedding's at the end (as gpt2's)
  Zero(dln_, static_cast<size_t>(N) * C);
  k_.matmul_backward(dln_, tied ? nullptr : f.grads + layout_.head_offset(), nullptr, logits_, lnf_,
                     tied ? head_w_ : f.params + layout_.head_offset(), N, C, Vp);
  const void* xL = L > 0 ? layers_[L - 1].res3 : encoded_;
  Zero(dres_, static_cast<size_t>(N) * C);
  k_.rmsnorm_backward(dres_, f.grads, dln_, xL, f.params, lnf_rstd_, N, C);
  hooks.PostBackward(F);
  for (int l = L - 1; l >= 0; l--) {
    const int u = layout_.block_unit(l);
    UnitBuffers b = hooks.PreBackward(u);
    const void* x = l > 0 ? layers_[l - 1].res3 : encoded_;
    if (recompute_ == Recompute::kBlock && l < L - 1) LlamaBlockForward(b.params, x, layers_[l], B, T, false);
    LlamaBlockBackward(b.params, b.grads, dres_, x, layers_[l], B, T);
    hooks.PostBackward(u);
  }
  UnitBuffers e = hooks.PreBackward(E);
  if (tied)
    k_.matmul_backward(nullptr, e.grads + layout_.wte_offset(), nullptr, logits_, lnf_,
                       e.params + layout_.wte_offset(), N, C, Vp);
  device_.Zero(dpos_discard_, static_cast<size_t>(T) * C * sizeof(float));
  k_.encoder_backward(e.grads + layout_.wte_offset(), dpos_discard_, dres_, inputs_, B, T, C);
  hooks.PostBackward(E);
}

float GPT::Forward(UnitHooks& hooks, const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale) {
  ForwardToLogits(hooks, inputs, targets, B, T);
  const int N = B * T;
  have_grad_ = targets != nullptr && grad_scale != 0.0f;
  if (targets == nullptr) return 0.0f;
  // mean loss over positions; its gradient is scaled by grad_scale / N
  const float dloss = have_grad_ ? grad_scale / static_cast<float>(N) : 0.0f;
  double sum = k_.crossentropy_softmax(logits_, losses_, targets_, N, config_.vocab_size,
                                    config_.padded_vocab(), dloss);
  return static_cast<float>(sum / N);
}

void GPT::ForwardAcc(UnitHooks& hooks, const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale,
                     double* loss_acc) {
  assert(targets != nullptr);
  ForwardToLogits(hooks, inputs, targets, B, T);
  const int N = B * T;
  have_grad_ = grad_scale != 0.0f;
  const float dloss = have_grad_ ? grad_scale / static_cast<float>(N) : 0.0f;
  k_.crossentropy_softmax_acc(logits_, losses_, targets_, N, config_.vocab_size, config_.padded_vocab(), dloss,
                              loss_acc);
}

void GPT::Backward(UnitHooks& hooks) {
  assert(have_grad_);
  have_grad_ = false;
  if (config_.llama()) return LlamaBackward(hooks);
  const int B = B_, T = T_, C = config_.n_embd, N = B * T, L = config_.n_layer;
  const int E = ParamLayout::kEmbedUnit, F = layout_.final_unit();
  UnitBuffers f = hooks.PreBackward(F);
  // LM head: logits = lnf @ wte^T  (logits_ now holds dlogits). Only dlnf now; the head's wte
  // gradient is computed at the end, next to the encoder's, from the same saved dlogits and
  // lnf (same result, same order of accumulation), so the embed unit's full-size gradient
  // buffer is not held through every block's backward.
  Zero(dln_, static_cast<size_t>(N) * C);
  k_.matmul_backward(dln_, nullptr, nullptr, logits_, lnf_, head_w_, N, C, config_.padded_vocab());
  // lnf = layernorm(x_L)
  const void* xL = L > 0 ? layers_[L - 1].res3 : encoded_;
  Zero(dres_, static_cast<size_t>(N) * C);
  k_.layernorm_backward(dres_, f.grads, f.grads + C, dln_, xL, f.params, lnf_mean_,
                     lnf_rstd_, N, C);
  hooks.PostBackward(F);
  for (int l = L - 1; l >= 0; l--) {
    const int u = layout_.block_unit(l);
    UnitBuffers b = hooks.PreBackward(u);
    const void* x = l > 0 ? layers_[l - 1].res3 : encoded_;
    // kBlock: re-run the block's forward into the working set (the last block's is still there)
    if (recompute_ == Recompute::kBlock && l < L - 1)
      BlockForward(b.params, x, layers_[l], B, T, /*output=*/false, /*ln1_ready=*/false);
    BlockBackward(b.params, b.grads, dres_, x, layers_[l], B, T);
    hooks.PostBackward(u);
  }
  UnitBuffers e = hooks.PreBackward(E);
  k_.matmul_backward(nullptr, e.grads + layout_.wte_offset(), nullptr, logits_, lnf_, e.params + layout_.wte_offset(),
                     N, C, config_.padded_vocab());
  k_.encoder_backward(e.grads + layout_.wte_offset(), e.grads + layout_.wpe_offset(), dres_, inputs_, B,
                   T, C);
  hooks.PostBackward(E);
}

LocalParams::LocalParams(const ParamLayout& layout)
    : layout_(layout), params_(layout.total_numel()), grads_(layout.total_numel(), 0.0f) {}

void LocalParams::ZeroGrads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

}  // namespace shardgpt
