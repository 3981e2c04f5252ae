// DType: the element types of parameters, gradients and collectives. bf16 travels and is
// stored as raw uint16_t bits (base/bf16.h); it is not a numeric C++ type.
#pragma once

#include <cstddef>

namespace shardgpt {

enum class DType { kF32, kBF16 };  // stored in checkpoints by name, not by number
inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) { return t == DType::kF32 ? "f32" : "bf16"; }

}  // namespace shardgpt
