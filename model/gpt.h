// GPT: the forward and backward pass of a GPT-2 or Llama model (GPTConfig::arch) over one
// micro-batch.
//
// The model owns only activations. Parameters and gradient buffers are handed to it unit by
// unit through UnitHooks, which the parallel engine implements (gathering, freeing and
// reducing there, like FSDP's pre/post forward/backward hooks); a single process uses
// LocalParams. The model knows nothing of ranks, MPI or files. Activations live on a Device and
// every kernel runs through its kernel set, so the same code trains on the CPU and on a GPU;
// the unit pointers the hooks hand out must be memory of that same device.
//
// Hook order for one micro-batch (E = embed unit, F = final unit, blocks 1..L):
//   forward:  PreForward(E)  encoder  [PreForward(l) block l PostForward(l)]  PreForward(F) ln_f
//             LM head (uses E's wte)  PostForward(F)  PostForward(E)
//   backward: PreBackward(F)  LM head (dlnf)  ln_f  PostBackward(F)
//             [PreBackward(l) block l PostBackward(l)] for l = L..1
//             PreBackward(E)  LM head (dwte)  encoder  PostBackward(E)
// (llama: the final unit's RMSNorm, and its lm_head when the head is untied; the hooks' order is
// the same.) E stays in use through the whole forward because the LM head is tied to wte, and E's
// parameters as PreForward(E) returned them must stay valid until PostBackward(E): the head's
// input gradient needs wte at the start of backward, but E's gradient buffer is asked for only
// at the end, so it is not held through every block's backward (a V x C buffer: 88% of the
// model for V 50257, C 128).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/device.h"
#include "model/param_layout.h"

namespace shardgpt {

// The model's view of one unit during backward.
struct UnitBuffers {
  const float* params = nullptr;  // the unit's full flat parameters (layout order)
  float* grads = nullptr;         // where the model ACCUMULATES the unit's gradient (+=)
};

// Supplies each unit's parameters and gradient buffer; told when each unit starts and ends.
// Thread contract: called from the training thread only, in the order documented above.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Returns unit u's full parameters, valid until PostForward(u).
  virtual const float* PreForward(int unit) = 0;
  virtual void PostForward(int unit) = 0;
  // Returns unit u's parameters and gradient buffer, valid until PostBackward(u).
  virtual UnitBuffers PreBackward(int unit) = 0;
  // Unit u's gradient contribution of this micro-batch is complete.
  virtual void PostBackward(int unit) = 0;
};

// --recompute: which activations the forward keeps for backward, and which the backward
// recomputes (same kernels, same inputs, so the losses and gradients are bitwise those of kNone).
//   kNone:  every layer keeps all its activations.
//   kGelu:  the MLP's GELU output is not kept per layer: the forward writes it into one shared
//           scratch, the backward recomputes it from the kept pre-activation (llm.c's -r 1).
//   kBlock: each layer keeps only its output (the next block's input); the backward re-runs a
//           block's forward into ONE working set just before that block's backward, with the
//           parameters PreBackward returned (full activation checkpointing, one block at a time).
enum class Recompute { kNone, kGelu, kBlock };
StatusOr<Recompute> ParseRecompute(const std::string& name);  // "none", "gelu", "block"
const char* RecomputeName(Recompute r);

class GPT {
 public:
  // Allocates activations on `device` for micro-batches of up to B sequences of up to T
  // tokens, counted in `ledger` (the engine's, for the peak `plan` predicts) when given, kept
  // for backward as `recompute` says, in the device kernel set's activation_dtype() (read here:
  // it must not change while the model lives; Forward checks). The device and the ledger must
  // outlive the model. Throws DeviceOutOfMemory.
  GPT(const GPTConfig& config, int B, int T, Device& device = CpuDevice(), MemoryLedger* ledger = nullptr,
      Recompute recompute = Recompute::kNone);
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }

  // Token ids: every id of inputs and targets must be in [0, vocab_size). This is the one
  // place where ids reach the device (the kernels index wte with them unchecked); the callers
  // check first (the data loader every file it maps, `sample` its prompt, the sampler its
  // draws), and Forward checks again: an id outside throws std::out_of_range naming it.
  // Runs the forward pass on inputs[B,T] (host memory). With targets (host memory), returns the mean cross-entropy over
  // the B*T positions (else 0). If grad_scale != 0 the logits are replaced by the gradient of
  // grad_scale * mean loss, ready for Backward() (fused softmax + cross-entropy backward).
  float Forward(UnitHooks& hooks, const int32_t* inputs, const int32_t* targets, int B, int T,
                float grad_scale);
  // Forward with targets for a training step on a GPU: the mean loss (as Forward returns it) is
  // ADDED to *loss_acc, one double in device memory, and the host does not wait for the
  // device anywhere in it (token ids go up through pinned staging, the loss stays there). The
  // caller reads the step's sum once. Same logits / gradient seed as Forward.
  void ForwardAcc(UnitHooks& hooks, const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale,
                  double* loss_acc);
  // Backward of the last Forward (which must have had targets and grad_scale != 0).
  void Backward(UnitHooks& hooks);

  // Row n = b*T + t of the logits [B,T,Vp] of the last Forward without grad_scale, copied to
  // the host and widened to fp32 (Vp values; the padded columns are garbage).
  std::vector<float> LogitsRow(int n) const;
  Recompute recompute() const { return recompute_; }
  DType activation_dtype() const { return act_dtype_; }
  // Bytes of activation memory allocated for (B, T).
  size_t activation_bytes() const;
  // The same figure without allocating (for `shardgpt plan`); the sizes per mode are listed
  // beside its definition (gpt.cc).
  static size_t ActivationBytes(const GPTConfig& config, int B, int T, Recompute recompute = Recompute::kNone,
                                DType act_dtype = DType::kF32);
  // FLOPs of one micro-batch of B x T: the forward (matmuls and attention, 2 per multiply-add),
  // and what `recompute` adds to the backward (kBlock: the re-forward of every block but the
  // last, without its output projection; kGelu: one GELU per MLP element, counted as 1 FLOP).
  // The step is forward + backward = 3 x the forward, plus the recomputation.
  static double ForwardFlops(const GPTConfig& config, int B, int T);
  static double RecomputeFlops(const GPTConfig& config, int B, int T, Recompute recompute);

 private:
  struct LayerActs {  // saved for backward, per layer (pointers into acts_): activations in
                     // the activation dtype (void*), LayerNorm statistics and lse fp32
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
  };
  void ForwardToLogits(UnitHooks& hooks, const int32_t* inputs, const int32_t* targets, int B, int T);
  // output = false: stop after the GELU (a re-forward for backward, which needs no res3).
  // ln1_ready: a.ln1 and its statistics are already written (fused with the previous block's
  // last residual add). With output, the block's res3 is left to the caller (see gpt.cc).
  void BlockForward(const float* p, const void* x, LayerActs& a, int B, int T, bool output, bool ln1_ready);
  void BlockBackward(const float* p, float* g, void* dres, const void* x, const LayerActs& a, int B, int T);
  void LlamaForwardToLogits(UnitHooks& hooks, const float* pe, int B, int T);
  void LlamaBackward(UnitHooks& hooks);
  // The llama block (no fusion with the next unit's norm: output writes a.res3).
  void LlamaBlockForward(const float* p, const void* x, LayerActs& a, int B, int T, bool output);
  void LlamaBlockBackward(const float* p, float* g, void* dres, const void* x, const LayerActs& a, int B, int T);
  void Zero(void* p, size_t n) { device_.Zero(p, n * act_size_); }  // n activation elements

  GPTConfig config_;
  ParamLayout layout_;
  Device& device_;
  Kernels& k_;
  int maxB_, maxT_;
  Recompute recompute_;
  DType act_dtype_;
  size_t act_size_;  // DTypeSize(act_dtype_)
  int B_ = 0, T_ = 0;
  bool have_grad_ = false;
  const float* head_w_ = nullptr;  // wte as PreForward(E) returned it (the LM head's weight)
  DeviceBuffer acts_;  // every activation below, one allocation
  int32_t *inputs_ = nullptr, *targets_ = nullptr;
  void *encoded_, *lnf_, *logits_, *scratch_;
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *losses_ = nullptr;
  // Per layer; with kBlock every layer's pointers but res3 name the one working set, with
  // kGelu every layer's fch_gelu names one shared scratch.
  std::vector<LayerActs> layers_;
  // backward scratch
  void *dres_, *dln_, *dqkv_, *datty_, *dfch_, *dfch_gelu_;
  // llama only: the packed q|k|v projection [N, (NH + 2 KV) hs] before its kv heads are repeated
  // (its gradient in backward), and the encoder's position table: all zeros (llama has no learned
  // positions, so the shared encoder kernels add 0) and a discarded gradient for it, fp32 [T, C].
  void* qkv_packed_ = nullptr;
  float *zero_pos_ = nullptr, *dpos_discard_ = nullptr;
};

// LocalParams: all parameters and gradients of a model in two flat buffers (one process).
// Implements UnitHooks trivially: every unit is always materialised.
class LocalParams : public UnitHooks {
 public:
  explicit LocalParams(const ParamLayout& layout);
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  void ZeroGrads();
  const float* PreForward(int unit) override { return params_.data() + layout_.units()[unit].offset; }
  void PostForward(int) override {}
  UnitBuffers PreBackward(int unit) override {
    size_t o = layout_.units()[unit].offset;
    return UnitBuffers{params_.data() + o, grads_.data() + o};
  }
  void PostBackward(int) override {}

 private:
  const ParamLayout& layout_;
  std::vector<float> params_, grads_;
};

}  // namespace shardgpt
