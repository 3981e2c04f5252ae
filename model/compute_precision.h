// Which precision a run's matmuls compute in: --compute-dtype when given, else bf16 where the
// hardware makes bf16 products fast (GPU tensor cores; CPUs with AVX512-BF16 or AMX-BF16) and
// the run stores bf16 (--dtype bf16), else fp32. --dtype fp32 without --compute-dtype is always
// kExact, so its numbers do not change.
//
// Thread contract: pure functions of their arguments (DetectComputeFacts reads the CPU once).
#pragma once

#include <string>

#include "base/dtype.h"
#include "base/status.h"
#include "model/kernels.h"

namespace shardgpt {

// What the hardware offers, as inputs to the choice (so the choice can be tested anywhere).
struct ComputeFacts {
  bool is_cuda = false;
  bool cpu_bf16_dot = false;        // CpuHasBf16Dot()
  std::string cpu_bf16_dot_name;    // "AVX512-BF16", "AMX-BF16"
  bool onednn_bf16 = false;         // OnednnBf16Supported(): oneDNN runs bf16 matmuls on this CPU
};
ComputeFacts DetectComputeFacts(bool is_cuda);

struct ComputeChoice {
  MatmulPrecision precision = MatmulPrecision::kExact;
  // One start-up line ("compute: ..."), or "" for an fp32 run that asked nothing (it prints no
  // compute line).
  std::string line;
};

// storage: --dtype. requested: --compute-dtype ("fp32", "bf16", or "" for automatic).
// On a CPU, forcing bf16 where oneDNN cannot run it selects the emulated bf16 kernels (same
// numerics, slower); the line says which kernels run and why.
ComputeChoice ChooseComputePrecision(DType storage, const std::string& requested, const ComputeFacts& facts);

// The dtype of the model's activations (Kernels::set_activation_dtype, GPT's allocation).
// requested: --act-dtype ("fp32", "bf16", or "" / "auto" for automatic). Automatic: bf16 where
// the matmuls compute in bf16 (precision kBf16, from ChooseComputePrecision), else fp32, on
// both devices (on the CPU too, bf16 activations are no slower at the GPT-2 124M shape:
// bench_train --profile, docs/PERFORMANCE.md). The line says what was chosen when it is not
// fp32 by default.
struct ActivationChoice {
  DType dtype = DType::kF32;
  std::string line;
};
StatusOr<ActivationChoice> ChooseActivationDType(const std::string& requested, MatmulPrecision precision,
                                                 bool is_cuda);
// What `plan` counts without a device: bf16 activations with --dtype bf16 (a GPU's choice),
// else fp32; --act-dtype overrides.
StatusOr<DType> PlannedActivationDType(const std::string& requested, DType storage);

}  // namespace shardgpt
