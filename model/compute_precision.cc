#include "model/compute_precision.h"

#include "model/kernels_cpu_bf16.h"

namespace shardgpt {

ComputeFacts DetectComputeFacts(bool is_cuda) {
  ComputeFacts f;
  f.is_cuda = is_cuda;
  f.cpu_bf16_dot = CpuHasBf16Dot();
  f.cpu_bf16_dot_name = CpuBf16DotName();
  f.onednn_bf16 = OnednnBf16Supported();
  return f;
}

ComputeChoice ChooseComputePrecision(DType storage, const std::string& requested, const ComputeFacts& f) {
  ComputeChoice c;
  const bool forced = !requested.empty();
  const bool want_bf16 = forced ? requested == "bf16" : storage == DType::kBF16;
  if (!want_bf16) {
    if (forced) c.line = "compute: fp32 (--compute-dtype fp32)";
    return c;
  }
  const std::string why = forced ? "--compute-dtype bf16" : "--dtype bf16";
  if (f.is_cuda) {
    c.precision = MatmulPrecision::kBf16;
    c.line = "compute: bf16 matmuls on tensor cores, fp32 accumulation (" + why + ")";
    return c;
  }
  const std::string fp32_rest = "; LayerNorm statistics, softmax, loss and AdamW in fp32";
  if (f.cpu_bf16_dot && f.onednn_bf16) {
    c.precision = MatmulPrecision::kBf16;
    c.line = "compute: bf16 matmuls through oneDNN (" + f.cpu_bf16_dot_name +
             "), fp32 accumulation, attention's products too" + fp32_rest + " (" + why + ")";
    return c;
  }
  if (!forced) {
    c.line = std::string("compute: fp32 (this CPU has no ") +
             (f.cpu_bf16_dot ? "oneDNN support for its bf16 instructions" : "AVX512-BF16 or AMX-BF16 instructions") +
             ", so bf16 matmuls would be slower; --compute-dtype bf16 forces them)";
    return c;
  }
  c.precision = MatmulPrecision::kBf16;
  if (f.onednn_bf16)
    c.line = "compute: bf16 matmuls through oneDNN, emulated by oneDNN on this CPU without AVX512-BF16/AMX-BF16 "
             "(slower than fp32), fp32 accumulation" + fp32_rest + " (" + why + ")";
  else
    c.line = "compute: bf16 matmuls emulated (inputs rounded to bf16, fp32 OpenBLAS: bf16 numerics, slower than "
             "fp32; oneDNN's bf16 needs AVX-512, which this CPU lacks)" + fp32_rest + " (" + why + ")";
  return c;
}

namespace {
StatusOr<std::string> CheckActDType(const std::string& requested) {
  if (requested.empty() || requested == "auto" || requested == "fp32" || requested == "bf16")
    return requested == "auto" ? std::string() : requested;
  return Status::InvalidArgument("--act-dtype " + requested + ": expected auto, fp32 or bf16");
}
}  // namespace

StatusOr<ActivationChoice> ChooseActivationDType(const std::string& requested, MatmulPrecision precision,
                                                 bool is_cuda) {
  auto r = CheckActDType(requested);
  if (!r.ok()) return r.status();
  ActivationChoice c;
  if (r.value() == "fp32") {
    c.line = "activations: fp32 (--act-dtype fp32)";
    return c;
  }
  if (r.value() == "bf16") {
    c.dtype = DType::kBF16;
    c.line = "activations: bf16, fp32 maths inside the kernels (--act-dtype bf16)";
    return c;
  }
  (void)is_cuda;  // both devices: the same rule (bf16 activations are no slower on the CPU either)
  if (precision == MatmulPrecision::kBf16) {
    c.dtype = DType::kBF16;
    c.line = "activations: bf16, fp32 maths inside the kernels (bf16 matmuls; --act-dtype fp32 keeps them fp32)";
  }
  return c;
}

StatusOr<DType> PlannedActivationDType(const std::string& requested, DType storage) {
  auto r = CheckActDType(requested);
  if (!r.ok()) return r.status();
  if (r.value() == "fp32") return DType::kF32;
  if (r.value() == "bf16") return DType::kBF16;
  return storage;
}

}  // namespace shardgpt
