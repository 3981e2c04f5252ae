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
    c.line = "compute: bf16 matmuls and attention products through oneDNN (" + f.cpu_bf16_dot_name +
             "), fp32 accumulation" + fp32_rest + " (" + why + ")";
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

}  // namespace shardgpt
