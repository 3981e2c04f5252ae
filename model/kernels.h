// Kernels: the kernel set of one device, as one interface, so that the model's forward and
// backward (model/gpt.cc), the engine's gradient and optimizer arithmetic (parallel/) and the
// tests are written once for every device.
//
// Every pointer is a pointer into the device's memory (Device::Allocate); sizes and scalars are
// host values. Kernels run in order on the device's compute stream; a kernel returning a host
// value (crossentropy_softmax, sum_squares) waits for its result; their *_acc / *_to variants
// keep the result in device memory and do not wait. The maths and shapes of each
// kernel are documented once, at its CPU twin in model/kernels_cpu.h (same name, same argument
// order); the CUDA twins are in model/cuda/. Backward kernels ACCUMULATE (+=) into their
// gradients exactly as the CPU twins do.
//
// Thread contract: one caller thread per device (the training thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "base/dtype.h"
#include "model/optimizer.h"

namespace shardgpt {

// How matmuls round their inputs. kExact: fp32 products, fp32 accumulation (CUDA: TF32 off,
// so GPU and CPU agree to ~1e-6). kBf16: inputs rounded to bf16, fp32 accumulation (CUDA:
// tensor cores, CUBLAS_COMPUTE_32F_FAST_16BF; CPU: model/kernels_cpu_bf16.h, oneDNN, for the
// matmuls and attention's score/value products). ChooseComputePrecision
// (model/compute_precision.h) picks it from --dtype, --compute-dtype and the hardware.
enum class MatmulPrecision { kExact, kBf16 };

class Kernels {
 public:
  virtual ~Kernels() = default;

  // ---- model: forward next to backward, as in model/kernels_cpu.h ----
  // Activations and activation gradients (void*) are in activation_dtype(); weights, biases,
  // LayerNorm parameters and every parameter gradient, LayerNorm mean/rstd, attention's lse and
  // the losses are fp32 (float*), whatever the activation dtype. Inside every kernel the maths
  // is fp32: a bf16 activation is widened on load and rounded to nearest even on store (a
  // gradient accumulated into a bf16 buffer is read, added in fp32 and rounded once per call).
  virtual void encoder_forward(void* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                               int C) const = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                                int C) const = 0;
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* w,
                                 const float* b, int N, int C) const = 0;
  virtual void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp,
                                  const float* w, const float* mean, const float* rstd, int N, int C) const = 0;
  virtual void matmul_forward(void* out, const void* inp, const float* w, const float* bias, int N, int C,
                              int OC) const = 0;
  // dinp, dw and dbias may each be null (not computed): the tied LM head computes dinp at the
  // start of backward and dw at its end.
  virtual void matmul_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                               const float* w, int N, int C, int OC) const = 0;
  virtual void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH) const = 0;
  virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const float* lse, int B, int T, int C, int NH) const = 0;
  virtual void gelu_forward(void* out, const void* inp, size_t n) const = 0;
  virtual void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) const = 0;
  // The MLP's fc matmul with its GELU (--gelu fused; CUDA: cuBLASLt's GELU_AUX_BIAS and DGELU
  // epilogues, so the GELU costs no pass of its own). With x the matmul's fp32 result:
  //   forward:  pre[N,OC] = x = inp @ w^T + bias,  out[N,OC] = gelu(x)   (writes both)
  //   backward: dinp[N,C] = (dout @ w) * gelu'(pre)  (WRITES dinp: the epilogue has no beta),
  //             dw += dout^T @ inp, dbias += sum_n dout, as matmul_backward (here inp is the
  //             GELU's output, pre its input: the fc projection's backward with the GELU's)
  // At fp32 activations this is matmul_forward + gelu_forward (matmul_backward into a zeroed
  // buffer + gelu_backward). At bf16 the GELU reads x before it is rounded (and the backward
  // multiplies the unrounded product), where the separate kernels read the rounded pre:
  // results differ from theirs by about one bf16 rounding step.
  virtual void matmul_gelu_forward(void* out, void* pre, const void* inp, const float* w, const float* bias, int N,
                                   int C, int OC) const = 0;
  virtual void matmul_dgelu_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                                     const void* pre, const float* w, int N, int C, int OC) const = 0;
  virtual void residual_forward(void* out, const void* a, const void* b, size_t n) const = 0;
  // res_out = a + b, then ln_out = layernorm(res_out) (residual_forward then layernorm_forward,
  // one pass: the residual stream is read once). Bitwise the two separate kernels' results
  // (at bf16, the LayerNorm reads res_out as stored: rounded to bf16).
  virtual void residual_layernorm_forward(void* res_out, void* ln_out, float* mean, float* rstd, const void* a,
                                          const void* b, const float* w, const float* bias, int N,
                                          int C) const = 0;
  // logits (activation dtype; overwritten in place by dlogits) and fp32 losses. Returns
  // sum_n losses[n] (a host value: waits for the device).
  virtual double crossentropy_softmax(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                      float dloss_scale) const = 0;
  // The same fused pass, but the loss stays on the device: *loss_acc (one double in device
  // memory) += float(sum_n losses[n] / N), the mean loss as GPT::Forward returns it, so a step's
  // micro-batches add up there and the host reads the sum once (no wait here).
  virtual void crossentropy_softmax_acc(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                        float dloss_scale, double* loss_acc) const = 0;

  // ---- the Llama block (--arch llama): maths and shapes at the CPU twins, model/kernels_cpu_llama.h ----
  // A kernel set without them (a device that does not train llama yet) throws std::logic_error
  // naming the kernel; the CLI refuses that combination first.
  virtual void rmsnorm_forward(void* out, float* rstd, const void* inp, const float* w, int N, int C,
                               float eps) const {
    Missing("rmsnorm_forward"), (void)out, (void)rstd, (void)inp, (void)w, (void)N, (void)C, (void)eps;
  }
  virtual void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const float* w,
                                const float* rstd, int N, int C) const {
    Missing("rmsnorm_backward"), (void)dinp, (void)dw, (void)dout, (void)inp, (void)w, (void)rstd, (void)N, (void)C;
  }
  virtual void rope_forward(void* qkv, int B, int T, int NH, int KV, int hs, float theta) const {
    Missing("rope_forward"), (void)qkv, (void)B, (void)T, (void)NH, (void)KV, (void)hs, (void)theta;
  }
  virtual void rope_backward(void* dqkv, int B, int T, int NH, int KV, int hs, float theta) const {
    Missing("rope_backward"), (void)dqkv, (void)B, (void)T, (void)NH, (void)KV, (void)hs, (void)theta;
  }
  virtual void swiglu_forward(void* out, const void* gate_up, int N, int F) const {
    Missing("swiglu_forward"), (void)out, (void)gate_up, (void)N, (void)F;
  }
  virtual void swiglu_backward(void* dgate_up, const void* gate_up, const void* dout, int N, int F) const {
    Missing("swiglu_backward"), (void)dgate_up, (void)gate_up, (void)dout, (void)N, (void)F;
  }
  virtual void kv_repeat_forward(void* out, const void* qkv, int N, int NH, int KV, int hs) const {
    Missing("kv_repeat_forward"), (void)out, (void)qkv, (void)N, (void)NH, (void)KV, (void)hs;
  }
  virtual void kv_repeat_backward(void* dqkv, const void* dout, int N, int NH, int KV, int hs) const {
    Missing("kv_repeat_backward"), (void)dqkv, (void)dout, (void)N, (void)NH, (void)KV, (void)hs;
  }
  // Whether this kernel set has the Llama block's kernels above.
  virtual bool has_llama_kernels() const { return false; }

  // ---- engine: dtype conversion, gradient accumulation, norm, optimizer ----
  // dst (to) = src (from), n elements; bf16 narrowing rounds to nearest even. src != dst.
  virtual void convert(const void* src, DType from, void* dst, DType to, size_t n) const = 0;
  // dst (dtype) += src (src_dtype); a bf16 destination is rounded once per element (RNE).
  virtual void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) const = 0;
  // sum_i x[i]^2 in double precision accumulation (a host value: waits for the device).
  virtual double sum_squares(const void* x, DType dtype, size_t n) const = 0;

  // ---- device scalars: the step's loss, gradient norm and clip factor without host waits ----
  // Every pointer below is device memory; nothing here waits for the device.
  // *dst = sum_i x[i]^2 in double (what sum_squares returns).
  virtual void sum_squares_to(double* dst, const void* x, DType dtype, size_t n) const = 0;
  // *dst = (sum_i src[i]) / divisor, the sum in index order (dst may be one of src).
  virtual void sum_f64(double* dst, const double* src, size_t n, double divisor) const = 0;
  // From a sum of squares *ss: out[0] = norm = float(sqrt(*ss)), out[1] = the clip factor,
  // grad_clip / (norm + 1e-6) if grad_clip > 0 and norm > grad_clip, else 1 (Engine::Step's).
  virtual void clip_factor(float* out, const double* ss, float grad_clip) const = 0;

  // ---- weight reuse window ----
  // Between begin_weight_reuse() and end_weight_reuse() the caller guarantees that no matmul
  // weight (w of matmul_forward/backward) changes, at any address it was read from, while the
  // memory there stays allocated (a kernel set forgets what it derived from memory the device
  // frees: the CPU device's Free tells its kernels). A kernel set
  // may then keep what it derives from a weight for the rest of the window: the CPU device at
  // bf16 precision converts each weight to bf16 once per window, not once per call
  // (Bf16WeightCache, model/kernels_cpu_bf16.h). A begin while open starts a new window. The
  // default (CUDA, fp32) derives nothing to keep.
  virtual void begin_weight_reuse() {}
  virtual void end_weight_reuse() {}
  // Inside the window: the n floats at `widened` are exactly the bf16 values at `bf16` (device
  // memory), and neither changes until the window closes or either is freed (the fp32 compute
  // copy of bf16-stored parameters, parallel/param_store.cc). A kernel set may then read the
  // bf16 values for any weight inside `widened` instead of converting it (the CPU device: no
  // conversion at all at --dtype bf16). Default: nothing kept.
  virtual void note_bf16_source(const float* widened, const void* bf16, size_t n) {
    (void)widened, (void)bf16, (void)n;
  }
  // The optimizer's one pass: adamw_update (model/optimizer.h, per element the same expression)
  // on fp32 master, m, v with the gradient read in grad_dtype (bf16 widened in the loop), and
  // the stored parameters written from the new master in the same loop: stored (stored_dtype)
  // = master, bf16 rounded to nearest even; stored == master (fp32 storage) writes nothing more.
  // grad_scale_dev: where not null, the gradient scale is read from device memory there (the
  // clip factor, clip_factor's out + 1; no host wait) and grad_scale is ignored.
  virtual void adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype,
                           float* m, float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg,
                           int64_t t, const float* grad_scale_dev, float grad_scale) const = 0;

  void set_matmul_precision(MatmulPrecision p) { precision_ = p; }
  MatmulPrecision matmul_precision() const { return precision_; }
  // The dtype of every activation pointer of the model kernels above (kF32 or kBF16; kF32 by
  // default). Set before the activations are written (GPT's constructor reads it to size them)
  // and not changed while they live.
  void set_activation_dtype(DType d) { act_dtype_ = d; }
  DType activation_dtype() const { return act_dtype_; }
  // Whether the model runs its fc + GELU through matmul_gelu_forward / matmul_dgelu_backward
  // (--gelu fused) instead of the separate kernels (--gelu separate, the default).
  void set_gelu_fused(bool on) { gelu_fused_ = on; }
  bool gelu_fused() const { return gelu_fused_; }

 protected:
  [[noreturn]] static void Missing(const char* kernel) {
    throw std::logic_error(std::string("this device's kernel set has no ") + kernel + " (--arch llama)");
  }
  MatmulPrecision precision_ = MatmulPrecision::kExact;
  DType act_dtype_ = DType::kF32;
  bool gelu_fused_ = false;
};

}  // namespace shardgpt
