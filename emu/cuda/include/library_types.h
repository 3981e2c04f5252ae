// The CUDA emulation's library_types.h: the data-type enums that cuBLASLt (emu/cuda/include/
// cublasLt.h) takes. The emulation's subset of CUDA 13's library_types.h: same names, same
// values, own declarations (the real header is never included).
#pragma once

typedef enum cudaDataType_t {
  CUDA_R_16F = 2,  // half
  CUDA_C_16F = 6,
  CUDA_R_16BF = 14,  // nv_bfloat16
  CUDA_C_16BF = 15,
  CUDA_R_32F = 0,  // float
  CUDA_C_32F = 4,
  CUDA_R_64F = 1,  // double
  CUDA_C_64F = 5,
  CUDA_R_8I = 3,
  CUDA_C_8I = 7,
  CUDA_R_8U = 8,
  CUDA_C_8U = 9,
  CUDA_R_16I = 20,
  CUDA_R_16U = 22,
  CUDA_R_32I = 10,
  CUDA_C_32I = 11,
  CUDA_R_32U = 12,
  CUDA_C_32U = 13,
  CUDA_R_64I = 24,
  CUDA_R_64U = 26,
  CUDA_R_8F_E4M3 = 28,
  CUDA_R_8F_E5M2 = 29,
} cudaDataType;

typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL } libraryPropertyType;
