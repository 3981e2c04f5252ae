// The CUDA emulation's cuBLASLt (emu/cuda/include/cublasLt.h): matmuls on the CPU for tests, in
// the cuBLASLt API and with its documented semantics, so that model/cuda/matmul_cuda.cu runs
// unchanged. What it is for: a wrong leading dimension, transpose, batch stride, type or
// alignment must show in a test as a clear abort or a wrong number, not pass silently.
//
//   D[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b] (+ bias[b]))   b = 0 .. batch-1
//
// column-major, matrix X[b] at X + b * STRIDED_BATCH_OFFSET, element (i, j) at i + j * ld.
// Products and sums in double, in increasing k, rounded once to D's type (float: the C++
// conversion; bf16: round to nearest even, NaN -> 0x7fff as emu's cuda_bf16.h). beta == 0 reads
// no C (as cuBLAS: NaNs in C do not propagate). The inputs are what the compute type makes of
// them: CUBLAS_COMPUTE_32F takes fp32 and bf16 inputs exactly; *_FAST_16BF / *_FAST_TF32 /
// *_FAST_16F round fp32 inputs to bf16 / TF32 (10-bit mantissa) / fp16, nearest even, first.
// (Real tensor cores choose among allowed formats and accumulate in fp32 in their own order:
// the GPU's results differ in the last bits; the emulation's are one fixed reference.)
//
// Epilogues (cuBLASLt's definitions; x = alpha op(A) op(B) + beta C, per element (i, j)):
//   DEFAULT x;  RELU max(x, 0);  BIAS x + bias[i];  RELU_BIAS max(x + bias[i], 0)
//   GELU gelu(x);  GELU_BIAS gelu(x + bias[i])  (tanh approximation, as cuBLASLt)
//   GELU_AUX / GELU_AUX_BIAS: as GELU / GELU_BIAS, and aux(i, j) = the GELU's input
//   DGELU: D = x * gelu'(aux(i, j));  DGELU_BGRAD: also bias[i] = sum_j D(i, j)  (beta must be 0)
//   BGRADA: D = x, bias[i] = sum_p op(A)(i, p);  BGRADB: D = x, bias[j] = sum_p op(B)(p, j)
// The bias (input or gradient output) is packed, has D's type and, for batches, its own stride
// (BIAS_BATCH_STRIDE, default 0: one bias for all). aux has D's type (AUX_DATA_TYPE may only
// repeat it), ld EPILOGUE_AUX_LD and stride EPILOGUE_AUX_BATCH_STRIDE.
//
// Refused with CUBLAS_STATUS_NOT_SUPPORTED (heuristic and matmul), because cuBLASLt's documents
// do not define them exactly enough to emulate or the project does not need them: the ReLU
// bit-mask epilogues (RELU_AUX, RELU_AUX_BIAS, DRELU, DRELU_BGRAD: bit layout and the meaning of
// a 0 input undocumented); DGELU / DGELU_BGRAD with beta != 0 (whether beta C enters the
// gradient); BGRADA / BGRADB with alpha != 1 (whether the sums are scaled) or with a FAST compute
// type on fp32 inputs (whether the sums see the rounded inputs); *_PEDANTIC, 16F, 64F and integer
// compute types (pedantic means fp32 accumulation, which the double sums are not); orders other
// than CUBLASLT_ORDER_COL; CUBLAS_OP_C / CONJG; pointer modes other than HOST; a bias type other
// than D's. Supported types: A = B = 32F with C = D = 32F, compute 32F or one of the FAST ones;
// A = B = 16BF with C = D = 16BF or 32F, compute 32F.
#include "cublasLt.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu.h"

struct cublasLtContext {
  int unused = 0;
};

// Descriptor contents, each attribute stored with the type cuBLASLt gives it (the size that
// Set/GetAttribute check).
struct cublasLtMatrixLayoutOpaque_t {
  uint32_t type;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch_count = 1;
  int64_t batch_stride = 0;  // elements
};

struct cublasLtMatmulDescOpaque_t {
  int32_t compute, scale;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // input, or the gradient output of the BGRAD epilogues
  int64_t bias_batch_stride = 0;
  void* aux = nullptr;
  int64_t aux_ld = 0, aux_batch_stride = 0;
  int32_t aux_type = -1, bias_type = -1;  // -1: D's type
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};

namespace cuda_emu {
namespace {

// ----------------------------------------------------------------------------------------------
// descriptor attributes

// Where an attribute lives in a descriptor and how many bytes it has; p == nullptr: unknown.
struct Field {
  void* p;
  size_t size;
};
template <typename T>
Field FieldOf(T& v) {
  return {&v, sizeof(T)};
}

Field LayoutField(cublasLtMatrixLayoutOpaque_t* l, cublasLtMatrixLayoutAttribute_t attr) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return FieldOf(l->type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return FieldOf(l->order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return FieldOf(l->rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return FieldOf(l->cols);
    case CUBLASLT_MATRIX_LAYOUT_LD: return FieldOf(l->ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return FieldOf(l->batch_count);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return FieldOf(l->batch_stride);
  }
  return {nullptr, 0};
}

Field DescField(cublasLtMatmulDescOpaque_t* d, cublasLtMatmulDescAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return FieldOf(d->compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return FieldOf(d->scale);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return FieldOf(d->pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA: return FieldOf(d->transa);
    case CUBLASLT_MATMUL_DESC_TRANSB: return FieldOf(d->transb);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return FieldOf(d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return FieldOf(d->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return FieldOf(d->bias_batch_stride);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return FieldOf(d->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return FieldOf(d->aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return FieldOf(d->aux_batch_stride);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return FieldOf(d->aux_type);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return FieldOf(d->bias_type);
  }
  return {nullptr, 0};
}

Field PreferenceField(cublasLtMatmulPreferenceOpaque_t* p, cublasLtMatmulPreferenceAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return FieldOf(p->max_workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return FieldOf(p->align[0]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return FieldOf(p->align[1]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return FieldOf(p->align[2]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return FieldOf(p->align[3]);
  }
  return {nullptr, 0};
}

// cuBLASLt's SetAttribute contract: INVALID_VALUE for an unknown attribute (here: one the
// emulation does not declare), a null buffer or a size other than the attribute's.
cublasStatus_t SetField(Field f, const void* buf, size_t size) {
  if (f.p == nullptr || buf == nullptr || size != f.size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(f.p, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

// GetAttribute's: size 0 asks for the size (needs sizeWritten); otherwise the sizes must match.
cublasStatus_t GetField(Field f, void* buf, size_t size, size_t* written) {
  if (f.p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (size == 0) {
    if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *written = f.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != f.size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, f.p, size);
  if (written) *written = f.size;
  return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------------------------
// the problem a descriptor set describes

// One matrix as cublasLtMatmul reads or writes it (copied out of its layout at call time).
struct Matrix {
  cudaDataType_t type;
  int64_t rows, cols, ld, stride;  // stride: elements between batches
};

enum class Epi { kNone, kRelu, kGelu, kDGelu, kBGradA, kBGradB };

// A validated configuration: everything the heuristic and the closure need, by value.
struct Problem {
  int64_t m, n, k;
  int batch;
  bool ta, tb;
  cublasComputeType_t compute;
  cublasLtEpilogue_t epilogue;
  Epi epi;
  bool bias_in;   // the epilogue adds bias[i]
  bool bias_out;  // the epilogue writes a bias gradient (DGELU_BGRAD, BGRADA, BGRADB)
  bool aux_out;   // GELU_AUX*: writes the GELU's input
  bool aux_in;    // DGELU*: reads it
  Matrix a, b, c, d;
  cudaDataType_t bias_type, aux_type;
  int64_t bias_stride, aux_ld, aux_stride;
};

size_t ElementSize(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }  // only 32F and 16BF get here

const char* TypeName(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_64F: return "CUDA_R_64F";
    default: return "an unsupported type";
  }
}

// The structural checks cuBLASLt answers with INVALID_VALUE, and the layouts the emulation
// does not implement (NOT_SUPPORTED).
cublasStatus_t CheckLayout(const cublasLtMatrixLayoutOpaque_t& l) {
  if (l.order != CUBLASLT_ORDER_COL) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (l.rows > INT32_MAX || l.cols > INT32_MAX) return CUBLAS_STATUS_INVALID_VALUE;
  if (l.ld < 0 || l.ld < static_cast<int64_t>(l.rows)) return CUBLAS_STATUS_INVALID_VALUE;
  if (l.batch_count < 1 || l.batch_stride < 0) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

Matrix MatrixOf(const cublasLtMatrixLayoutOpaque_t& l) {
  return {static_cast<cudaDataType_t>(l.type), static_cast<int64_t>(l.rows), static_cast<int64_t>(l.cols), l.ld,
          l.batch_stride};
}

// The shapes must chain: op(A) m x k, op(B) k x n, C and D m x n, one batch count for all.
cublasStatus_t ResolveShapes(const cublasLtMatrixLayoutOpaque_t* l[4], Problem* p) {
  for (int i = 0; i < 4; i++) {
    const cublasStatus_t s = CheckLayout(*l[i]);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  p->a = MatrixOf(*l[0]);
  p->b = MatrixOf(*l[1]);
  p->c = MatrixOf(*l[2]);
  p->d = MatrixOf(*l[3]);
  p->m = p->d.rows;
  p->n = p->d.cols;
  p->k = p->ta ? p->a.rows : p->a.cols;
  const int64_t a_m = p->ta ? p->a.cols : p->a.rows;
  const int64_t b_k = p->tb ? p->b.cols : p->b.rows, b_n = p->tb ? p->b.rows : p->b.cols;
  if (a_m != p->m || b_k != p->k || b_n != p->n || p->c.rows != p->m || p->c.cols != p->n)
    return CUBLAS_STATUS_INVALID_VALUE;
  p->batch = l[3]->batch_count;
  for (int i = 0; i < 3; i++)
    if (l[i]->batch_count != p->batch) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// The supported type / compute type combinations (see the top of the file).
cublasStatus_t ResolveTypes(const cublasLtMatmulDescOpaque_t& desc, Problem* p) {
  if (desc.scale != CUDA_R_32F || desc.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (p->a.type != p->b.type || p->c.type != p->d.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  p->compute = static_cast<cublasComputeType_t>(desc.compute);
  if (p->a.type == CUDA_R_32F && p->d.type == CUDA_R_32F) {
    switch (p->compute) {
      case CUBLAS_COMPUTE_32F:
      case CUBLAS_COMPUTE_32F_FAST_16BF:
      case CUBLAS_COMPUTE_32F_FAST_TF32:
      case CUBLAS_COMPUTE_32F_FAST_16F: return CUBLAS_STATUS_SUCCESS;
      default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  if (p->a.type == CUDA_R_16BF && (p->d.type == CUDA_R_16BF || p->d.type == CUDA_R_32F) &&
      p->compute == CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_SUCCESS;
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

// What each epilogue computes, reads and writes.
struct EpilogueInfo {
  cublasLtEpilogue_t epilogue;
  Epi epi;
  bool bias_in, bias_out, aux_in, aux_out;
};
constexpr EpilogueInfo kEpilogues[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, Epi::kNone, false, false, false, false},
    {CUBLASLT_EPILOGUE_RELU, Epi::kRelu, false, false, false, false},
    {CUBLASLT_EPILOGUE_BIAS, Epi::kNone, true, false, false, false},
    {CUBLASLT_EPILOGUE_RELU_BIAS, Epi::kRelu, true, false, false, false},
    {CUBLASLT_EPILOGUE_GELU, Epi::kGelu, false, false, false, false},
    {CUBLASLT_EPILOGUE_GELU_BIAS, Epi::kGelu, true, false, false, false},
    {CUBLASLT_EPILOGUE_GELU_AUX, Epi::kGelu, false, false, false, true},
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, Epi::kGelu, true, false, false, true},
    {CUBLASLT_EPILOGUE_DGELU, Epi::kDGelu, false, false, true, false},
    {CUBLASLT_EPILOGUE_DGELU_BGRAD, Epi::kDGelu, false, true, true, false},
    {CUBLASLT_EPILOGUE_BGRADA, Epi::kBGradA, false, true, false, false},
    {CUBLASLT_EPILOGUE_BGRADB, Epi::kBGradB, false, true, false, false},
};

// The epilogue's operands and their types; the refused epilogues are explained at the top of
// the file.
cublasStatus_t ResolveEpilogue(const cublasLtMatmulDescOpaque_t& desc, Problem* p) {
  p->epilogue = static_cast<cublasLtEpilogue_t>(desc.epilogue);
  const EpilogueInfo* info = nullptr;
  for (const EpilogueInfo& e : kEpilogues)
    if (e.epilogue == p->epilogue) info = &e;
  if (info == nullptr) {
    const bool relu_mask = p->epilogue == CUBLASLT_EPILOGUE_RELU_AUX ||
                           p->epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS || p->epilogue == CUBLASLT_EPILOGUE_DRELU ||
                           p->epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD;
    return relu_mask ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE;
  }
  p->epi = info->epi;
  p->bias_in = info->bias_in, p->bias_out = info->bias_out;
  p->aux_in = info->aux_in, p->aux_out = info->aux_out;
  const bool fast = p->compute != CUBLAS_COMPUTE_32F;
  if ((p->epi == Epi::kBGradA || p->epi == Epi::kBGradB) && fast) return CUBLAS_STATUS_NOT_SUPPORTED;
  p->bias_type = desc.bias_type == -1 ? p->d.type : static_cast<cudaDataType_t>(desc.bias_type);
  if ((p->bias_in || p->bias_out) && p->bias_type != p->d.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  // cublasLt.h: an AUX_DATA_TYPE unsupported for the types makes cublasLtMatmul INVALID_VALUE;
  // outside fp8 it is D's type.
  p->aux_type = desc.aux_type == -1 ? p->d.type : static_cast<cudaDataType_t>(desc.aux_type);
  if ((p->aux_in || p->aux_out) && p->aux_type != p->d.type) return CUBLAS_STATUS_INVALID_VALUE;
  p->bias_stride = desc.bias_batch_stride;
  p->aux_ld = desc.aux_ld;
  p->aux_stride = desc.aux_batch_stride;
  return CUBLAS_STATUS_SUCCESS;
}

// Everything the heuristic can decide from the descriptors (no pointer values, no scalars).
cublasStatus_t Resolve(const cublasLtMatmulDescOpaque_t* desc, const cublasLtMatrixLayoutOpaque_t* a,
                       const cublasLtMatrixLayoutOpaque_t* b, const cublasLtMatrixLayoutOpaque_t* c,
                       const cublasLtMatrixLayoutOpaque_t* d, Problem* p) {
  if (!desc || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
  for (int32_t t : {desc->transa, desc->transb}) {
    if (t == CUBLAS_OP_C || t == CUBLAS_OP_CONJG) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
  }
  p->ta = desc->transa == CUBLAS_OP_T;
  p->tb = desc->transb == CUBLAS_OP_T;
  const cublasLtMatrixLayoutOpaque_t* layouts[4] = {a, b, c, d};
  cublasStatus_t s = ResolveShapes(layouts, p);
  if (s == CUBLAS_STATUS_SUCCESS) s = ResolveTypes(*desc, p);
  if (s == CUBLAS_STATUS_SUCCESS) s = ResolveEpilogue(*desc, p);
  return s;
}

// ----------------------------------------------------------------------------------------------
// algorithms: what the heuristic promises, and what cublasLtMatmul holds the caller to

constexpr uint64_t kAlgoMagic = 0x314f474c41554d45ull;       // "EMUALGO1"
constexpr uint64_t kAlgoWorkspaceBytes = uint64_t{1} << 20;  // asked for when the preference allows it
// data[0] magic, data[1..4] min alignment of A, B, C, D (the preference's), data[5] alignment of
// the bias (low half) and aux (high half) pointers the descriptor held (at most kVectorBytes),
// data[6] workspace bytes,
// data[7] the configuration (types, compute type, epilogue) it was chosen for.
enum AlgoWord { kMagic = 0, kAlignA = 1, kAlignBiasAux = 5, kWorkspace = 6, kConfig = 7 };
// In data[kWorkspace]: an algorithm made to fail at its cublasLtMatmul (failure injection).
constexpr uint64_t kInjectedFailure = uint64_t{1} << 63;

// Failure injection (tests of the callers' fallbacks): SHARDGPT_CUBLASLT_EMU_FAIL=
//   heuristic   cublasLtMatmulAlgoGetHeuristic returns CUBLAS_STATUS_INTERNAL_ERROR where A is
//               bf16 (a status other than "not supported");
//   bf16        it returns CUBLAS_STATUS_NOT_SUPPORTED where A is bf16 (no bf16 algorithm);
//   first-algo  where two or more are asked for, it returns two, and cublasLtMatmul refuses the
//               first with CUBLAS_STATUS_EXECUTION_FAILED (queueing nothing).
// Read at each call, so that a test can set and clear it.
std::string InjectedFailure() {
  const char* v = std::getenv("SHARDGPT_CUBLASLT_EMU_FAIL");
  return v ? v : "";
}

uint64_t ConfigWord(const Problem& p) {
  return uint64_t(p.a.type) | uint64_t(p.d.type) << 8 | uint64_t(p.compute) << 16 | uint64_t(p.epilogue) << 32;
}

// Largest power of two (<= cap) dividing the address; a null pointer counts as cap.
uint32_t Alignment(const void* p, uint32_t cap) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return cap;
  const uintptr_t low = a & (~a + 1);
  return low >= cap ? cap : static_cast<uint32_t>(low);
}

// The bias and aux pointers have no alignment preference: the heuristic reads their values
// (cublasLt.h). What a kernel can have assumed from them is at most a 16-byte vector access, so
// that is the most the emulation holds a later pointer to (more would flag pointers that are
// fine on a GPU).
constexpr uint32_t kVectorBytes = 16;

cublasLtMatmulAlgo_t MakeAlgo(const Problem& p, const cublasLtMatmulDescOpaque_t& desc,
                              const cublasLtMatmulPreferenceOpaque_t& pref, uint64_t workspace) {
  cublasLtMatmulAlgo_t algo{};
  algo.data[kMagic] = kAlgoMagic;
  for (int i = 0; i < 4; i++) algo.data[kAlignA + i] = pref.align[i];
  const uint64_t bias_align = (p.bias_in || p.bias_out) ? Alignment(desc.bias, kVectorBytes) : 1;
  const uint64_t aux_align = (p.aux_in || p.aux_out) ? Alignment(desc.aux, kVectorBytes) : 1;
  algo.data[kAlignBiasAux] = bias_align | aux_align << 32;
  algo.data[kWorkspace] = workspace;
  algo.data[kConfig] = ConfigWord(p);
  return algo;
}

// ----------------------------------------------------------------------------------------------
// cublasLtMatmul's checks of the call (pointers, scalars): the ones a GPU punishes abort

// Bytes from the matrix start to the end of its last element: (cols-1)*ld + rows elements per
// batch, batch-1 strides before the last; 0 for an empty matrix (it touches nothing).
uint64_t SpanBytes(int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride, cudaDataType_t t) {
  if (rows == 0 || cols == 0) return 0;
  const uint64_t last = uint64_t(cols - 1) * ld + uint64_t(rows - 1) + uint64_t(batch - 1) * stride;
  return (last + 1) * ElementSize(t);
}

std::string Describe(const char* name, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride,
                     cudaDataType_t t) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (%lldx%lld, ld %lld, %s, batch %d, stride %lld)", name, (long long)rows,
                (long long)cols, (long long)ld, TypeName(t), batch, (long long)stride);
  return buf;
}

std::string PointerText(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// [p, p + bytes) must lie inside one cudaMalloc allocation of the stream's device: a wrong ld or
// stride, or a host pointer, would fault or corrupt on a GPU.
void CheckRegion(const std::string& what, const void* p, uint64_t bytes, int device) {
  if (bytes == 0) return;
  const int d = DeviceOf(p, bytes);
  if (d == device) return;
  const std::string head =
      "cublasLtMatmul: " + what + " at " + PointerText(p) + ", spanning " + std::to_string(bytes) + " bytes, ";
  if (d >= 0)
    Fail(head + "is on device " + std::to_string(d) + " but the stream is on device " + std::to_string(device));
  if (DeviceOf(p, 1) >= 0) Fail(head + "runs past the end of its device allocation");
  Fail(head + "is not in device memory");
}

// Overlapping batches of an output race on a GPU (many blocks write the same elements).
void CheckBatchesApart(const std::string& what, int batch, int64_t stride, uint64_t elements_per_batch) {
  if (batch > 1 && elements_per_batch > 0 && uint64_t(stride) < elements_per_batch)
    Fail("cublasLtMatmul: the " + std::to_string(batch) + " batches of " + what + " overlap (stride " +
         std::to_string(stride) + " < " + std::to_string(elements_per_batch) + " elements)");
}

// An algorithm chosen for an alignment may use vector loads that need it.
void CheckAligned(const std::string& what, const void* p, uint64_t align, const char* chosen_for) {
  if (align > 1 && reinterpret_cast<uintptr_t>(p) % align != 0)
    Fail("cublasLtMatmul: " + what + " at " + PointerText(p) + " is not " + std::to_string(align) +
         "-byte aligned, the alignment its algorithm was chosen for (" + chosen_for + ")");
}

// The pointers and scalars of one call, after the checks.
struct Job {
  Problem p;
  const void *A, *B, *C;  // C == nullptr when beta == 0 (not read)
  void* D;
  void* bias;  // input (bias_in) or output (bias_out)
  void* aux;   // output (aux_out) or input (aux_in)
  double alpha, beta;
};

// The aux matrix's requirements (cublasLt.h: ld >= rows and divisible by 8, stride by 8).
cublasStatus_t CheckAuxLayout(const Problem& p) {
  if (p.aux_ld < p.m || p.aux_ld % 8 != 0 || p.aux_stride < 0 || p.aux_stride % 8 != 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// Checks that return a status (as cuBLASLt does): scalars, epilogue operands, algorithm.
cublasStatus_t CheckCall(const Job& j, const void* C, const cublasLtMatmulAlgo_t* algo, size_t workspace_bytes) {
  const Problem& p = j.p;
  if (p.epi == Epi::kDGelu && j.beta != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((p.epi == Epi::kBGradA || p.epi == Epi::kBGradB) && j.alpha != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((p.bias_in || p.bias_out) && (j.bias == nullptr || p.bias_stride < 0)) return CUBLAS_STATUS_INVALID_VALUE;
  if (p.aux_in || p.aux_out) {
    if (j.aux == nullptr || CheckAuxLayout(p) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
  }
  // In place (C == D) needs C's layout to be D's (cuBLASLt's rule).
  if (C != nullptr && C == j.D && j.beta != 0 && (p.c.ld != p.d.ld || p.c.stride != p.d.stride || p.c.type != p.d.type))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (algo != nullptr) {
    if (algo->data[kMagic] != kAlgoMagic || algo->data[kConfig] != ConfigWord(p)) return CUBLAS_STATUS_INVALID_VALUE;
    if (algo->data[kWorkspace] & kInjectedFailure) return CUBLAS_STATUS_EXECUTION_FAILED;
    // cublasLt.h: INVALID_VALUE "when workspaceSizeInBytes is less than workspace required by
    // configured algo".
    if (workspace_bytes < algo->data[kWorkspace]) return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// Every region the closure will touch, on the stream's device; outputs' batches apart.
void CheckRegions(const Job& j, const void* workspace, size_t workspace_bytes, int device) {
  const Problem& p = j.p;
  const auto check_matrix = [&](const char* name, const void* ptr, const Matrix& x) {
    CheckRegion("matrix " + Describe(name, x.rows, x.cols, x.ld, p.batch, x.stride, x.type), ptr,
                SpanBytes(x.rows, x.cols, x.ld, p.batch, x.stride, x.type), device);
  };
  check_matrix("A", j.A, p.a);
  check_matrix("B", j.B, p.b);
  if (j.beta != 0) check_matrix("C", j.C, p.c);  // beta == 0: C is not read
  check_matrix("D", j.D, p.d);
  CheckBatchesApart("D", p.batch, p.d.stride, SpanBytes(p.m, p.n, p.d.ld, 1, 0, p.d.type) / ElementSize(p.d.type));
  if (p.bias_in || p.bias_out) {
    const int64_t len = p.epi == Epi::kBGradB ? p.n : p.m;
    const std::string what =
        Describe(p.bias_out ? "bias gradient" : "bias", len, 1, len, p.batch, p.bias_stride, p.bias_type);
    CheckRegion(what, j.bias, SpanBytes(len, 1, len, p.batch, p.bias_stride, p.bias_type), device);
    if (p.bias_out) CheckBatchesApart("the bias gradient", p.batch, p.bias_stride, uint64_t(len));
  }
  if (p.aux_in || p.aux_out) {
    CheckRegion("epilogue aux " + Describe("matrix", p.m, p.n, p.aux_ld, p.batch, p.aux_stride, p.aux_type), j.aux,
                SpanBytes(p.m, p.n, p.aux_ld, p.batch, p.aux_stride, p.aux_type), device);
    if (p.aux_out)
      CheckBatchesApart("the aux matrix", p.batch, p.aux_stride,
                        SpanBytes(p.m, p.n, p.aux_ld, 1, 0, p.aux_type) / ElementSize(p.aux_type));
  }
  CheckRegion("the workspace", workspace, workspace_bytes, device);
}

// The alignments the algorithm was chosen for (only for what the call touches).
void CheckAlignments(const Job& j, const cublasLtMatmulAlgo_t& algo) {
  const Problem& p = j.p;
  const bool empty = p.m == 0 || p.n == 0;
  if (p.m > 0 && p.k > 0) CheckAligned("A", j.A, algo.data[kAlignA], "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES");
  if (p.n > 0 && p.k > 0) CheckAligned("B", j.B, algo.data[kAlignA + 1], "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES");
  if (!empty && j.C) CheckAligned("C", j.C, algo.data[kAlignA + 2], "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES");
  if (!empty) CheckAligned("D", j.D, algo.data[kAlignA + 3], "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES");
  if (p.bias_in || p.bias_out)
    CheckAligned("the bias", j.bias, algo.data[kAlignBiasAux] & 0xffffffffu,
                 "the BIAS_POINTER the descriptor held at cublasLtMatmulAlgoGetHeuristic");
  if (p.aux_in || p.aux_out)
    CheckAligned("the aux matrix", j.aux, algo.data[kAlignBiasAux] >> 32,
                 "the EPILOGUE_AUX_POINTER the descriptor held at cublasLtMatmulAlgoGetHeuristic");
}

// ----------------------------------------------------------------------------------------------
// arithmetic (runs in the queued closure)

// A binary floating-point format: significand bits (with the implicit one), exponent range.
struct Format {
  int precision, emin, emax;
};
constexpr Format kBf16{8, -126, 127};
constexpr Format kTf32{11, -126, 127};
constexpr Format kFp16{11, -14, 15};

// v rounded to the format, to nearest, ties to even, with the format's subnormals and overflow
// to infinity; computed exactly in double (scaling by powers of two is exact).
double RoundTo(double v, Format f) {
  if (!std::isfinite(v) || v == 0) return v;
  const int e = std::max(std::ilogb(v), f.emin);
  const double quantum = std::ldexp(1.0, e - (f.precision - 1));
  const double r = std::nearbyint(v / quantum) * quantum;  // default rounding mode: nearest even
  if (std::fabs(r) >= std::ldexp(1.0, f.emax + 1)) return std::copysign(INFINITY, v);
  return r;
}

double ReadElement(const void* base, cudaDataType_t t, int64_t index) {
  if (t == CUDA_R_16BF) {
    const uint32_t u = uint32_t{static_cast<const uint16_t*>(base)[index]} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  return static_cast<const float*>(base)[index];
}

// The one rounding of a result to its storage type.
void WriteElement(void* base, cudaDataType_t t, int64_t index, double v) {
  if (t == CUDA_R_16BF) {
    uint16_t bits = 0x7fff;  // NaN, as cvt.rn.bf16.f32
    if (!std::isnan(v)) {
      const float f = static_cast<float>(RoundTo(v, kBf16));  // exact: representable
      uint32_t u;
      std::memcpy(&u, &f, 4);
      bits = static_cast<uint16_t>(u >> 16);
    }
    static_cast<uint16_t*>(base)[index] = bits;
    return;
  }
  static_cast<float*>(base)[index] = static_cast<float>(v);
}

// What the compute type does to an fp32 input before the multiply (bf16 inputs are exact).
double ComputeInput(double v, cublasComputeType_t compute, cudaDataType_t t) {
  if (t != CUDA_R_32F) return v;
  switch (compute) {
    case CUBLAS_COMPUTE_32F_FAST_16BF: return RoundTo(v, kBf16);
    case CUBLAS_COMPUTE_32F_FAST_TF32: return RoundTo(v, kTf32);
    case CUBLAS_COMPUTE_32F_FAST_16F: return RoundTo(v, kFp16);
    default: return v;
  }
}

// out[r * inner + q] = X(r, q) of batch `batch`, where X is the stored matrix (transposed: its
// transpose), as the compute type sees it: op(A) row by row, op(B) column by column, so that
// every dot product reads two contiguous rows.
std::vector<double> Gather(const void* base, const Matrix& x, int batch, bool transposed, int64_t outer, int64_t inner,
                           cublasComputeType_t compute) {
  std::vector<double> out(size_t(outer * inner));
  const int64_t offset = int64_t(batch) * x.stride;
  for (int64_t r = 0; r < outer; r++)
    for (int64_t q = 0; q < inner; q++) {
      const int64_t index = transposed ? q + r * x.ld : r + q * x.ld;
      out[size_t(r * inner + q)] = ComputeInput(ReadElement(base, x.type, offset + index), compute, x.type);
    }
  return out;
}

// Sums in increasing p, four independent rows at a time (instruction-level parallelism; each
// sum keeps its order).
void Dot4(const double* a, int64_t k, const double* b, double out[4]) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t p = 0; p < k; p++) {
    s0 += a[p] * b[p];
    s1 += a[k + p] * b[p];
    s2 += a[2 * k + p] * b[p];
    s3 += a[3 * k + p] * b[p];
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

double Dot(const double* a, int64_t k, const double* b) {
  double s = 0;
  for (int64_t p = 0; p < k; p++) s += a[p] * b[p];
  return s;
}

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCubic = 0.044715;

// GELU, tanh approximation (cuBLASLt's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
double Gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x))); }

// Its derivative: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
double GeluGrad(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
}

// Column j of D for batch `batch`, given the dot products acc[i]; grad[i] collects D(i, j) for
// DGELU_BGRAD.
void EpilogueColumn(const Job& job, int batch, int64_t j, const double* acc, std::vector<double>* grad) {
  const Problem& p = job.p;
  const int64_t d0 = batch * p.d.stride + j * p.d.ld, c0 = batch * p.c.stride + j * p.c.ld;
  const int64_t aux0 = batch * p.aux_stride + j * p.aux_ld, bias0 = batch * p.bias_stride;
  for (int64_t i = 0; i < p.m; i++) {
    double x = job.alpha * acc[i];
    if (job.beta != 0) x = std::fma(job.beta, ReadElement(job.C, p.c.type, c0 + i), x);
    if (p.bias_in) x += ReadElement(job.bias, p.bias_type, bias0 + i);
    switch (p.epi) {
      case Epi::kRelu: x = std::fmax(x, 0.0); break;  // fmaxf's NaN rule: max(NaN, 0) = 0
      case Epi::kGelu:
        if (p.aux_out) WriteElement(job.aux, p.aux_type, aux0 + i, x);
        x = Gelu(x);
        break;
      case Epi::kDGelu: x *= GeluGrad(ReadElement(job.aux, p.aux_type, aux0 + i)); break;
      default: break;
    }
    WriteElement(job.D, p.d.type, d0 + i, x);
    if (grad) (*grad)[size_t(i)] += x;
  }
}

// The bias gradient out[r] = sum_q X[r * inner + q] (X row-major outer x inner), in increasing
// q, rounded once.
void WriteRowSums(const Job& job, int batch, const std::vector<double>& x, int64_t outer, int64_t inner) {
  for (int64_t r = 0; r < outer; r++) {
    double s = 0;
    for (int64_t q = 0; q < inner; q++) s += x[size_t(r * inner + q)];
    WriteElement(job.bias, job.p.bias_type, batch * job.p.bias_stride + r, s);
  }
}

void RunBatch(const Job& job, int batch) {
  const Problem& p = job.p;
  const std::vector<double> a = Gather(job.A, p.a, batch, p.ta, p.m, p.k, p.compute);   // op(A), by row
  const std::vector<double> b = Gather(job.B, p.b, batch, !p.tb, p.n, p.k, p.compute);  // op(B), by column
  std::vector<double> acc(size_t(p.m)), grad;
  if (p.epi == Epi::kDGelu && p.bias_out) grad.assign(size_t(p.m), 0.0);
  for (int64_t j = 0; j < p.n; j++) {
    const double* bj = b.data() + j * p.k;
    int64_t i = 0;
    for (; i + 4 <= p.m; i += 4) Dot4(a.data() + i * p.k, p.k, bj, &acc[size_t(i)]);
    for (; i < p.m; i++) acc[size_t(i)] = Dot(a.data() + i * p.k, p.k, bj);
    EpilogueColumn(job, batch, j, acc.data(), grad.empty() ? nullptr : &grad);
  }
  if (!grad.empty())
    for (int64_t i = 0; i < p.m; i++) WriteElement(job.bias, p.bias_type, batch * p.bias_stride + i, grad[size_t(i)]);
  if (p.epi == Epi::kBGradA) WriteRowSums(job, batch, a, p.m, p.k);
  if (p.epi == Epi::kBGradB) WriteRowSums(job, batch, b, p.n, p.k);
}

// ----------------------------------------------------------------------------------------------
// the API

template <typename T>
cublasStatus_t Create(T** out) {
  if (out == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *out = new T();
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace cuda_emu

using namespace cuda_emu;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) { return Create(lightHandle); }

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "the device lacks a required architectural feature";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the functionality requested requires a license";
  }
  return "unknown cuBLAS status";
}

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

// Shapes are checked when used (heuristic, matmul): ORDER may still change ld's meaning. Sizes
// beyond int32 are refused here (cuBLASLt supports "usually only" those; a negative int passed
// as uint64_t lands here).
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (matLayout == nullptr || rows > INT32_MAX || cols > INT32_MAX || ld < 0) return CUBLAS_STATUS_INVALID_VALUE;
  *matLayout = new cublasLtMatrixLayoutOpaque_t{static_cast<uint32_t>(type), CUBLASLT_ORDER_COL, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return SetField(LayoutField(matLayout, attr), buf, sizeInBytes);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t sizeInBytes, size_t* sizeWritten) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return GetField(LayoutField(matLayout, attr), buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  const cublasStatus_t s = Create(matmulDesc);
  if (s == CUBLAS_STATUS_SUCCESS) {
    (*matmulDesc)->compute = computeType;
    (*matmulDesc)->scale = scaleType;
  }
  return s;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return SetField(DescField(matmulDesc, attr), buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t sizeInBytes, size_t* sizeWritten) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return GetField(DescField(matmulDesc, attr), buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) { return Create(pref); }

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return SetField(PreferenceField(pref, attr), buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return GetField(PreferenceField(pref, attr), buf, sizeInBytes, sizeWritten);
}

// One algorithm for every supported configuration; it records what it was chosen for (see
// MakeAlgo) so that cublasLtMatmul can hold the caller to it.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (preference == nullptr || requestedAlgoCount <= 0 || heuristicResultsArray == nullptr ||
      returnAlgoCount == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returnAlgoCount = 0;
  Problem p;
  const cublasStatus_t s = Resolve(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const std::string inject = InjectedFailure();
  if (inject == "heuristic" && p.a.type == CUDA_R_16BF) return CUBLAS_STATUS_INTERNAL_ERROR;
  if (inject == "bf16" && p.a.type == CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  const int count = inject == "first-algo" && requestedAlgoCount >= 2 ? 2 : 1;
  for (int i = 0; i < count; i++) {
    cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[i];
    r = cublasLtMatmulHeuristicResult_t{};
    r.workspaceSize = std::min<uint64_t>(preference->max_workspace, kAlgoWorkspaceBytes);
    r.algo = MakeAlgo(p, *operationDesc, *preference, r.workspaceSize);
    if (i + 1 < count) r.algo.data[kWorkspace] |= kInjectedFailure;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
  }
  *returnAlgoCount = count;
  return CUBLAS_STATUS_SUCCESS;
}

// Checks everything at call time (descriptors, scalars and pointers are read now, as cuBLASLt
// reads host scalars now), then queues one closure with copies of what it needs.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Job job;
  cublasStatus_t s = Resolve(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &job.p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (DeviceOf(alpha, sizeof(float)) >= 0 || DeviceOf(beta, sizeof(float)) >= 0)
    Fail("cublasLtMatmul: alpha or beta is a device pointer, but the pointer mode is CUBLASLT_POINTER_MODE_HOST");
  job.alpha = *static_cast<const float*>(alpha);
  job.beta = *static_cast<const float*>(beta);
  job.A = A;
  job.B = B;
  job.C = job.beta != 0 ? C : nullptr;
  job.D = D;
  job.bias = const_cast<void*>(computeDesc->bias);
  job.aux = computeDesc->aux;
  s = CheckCall(job, C, algo, workspaceSizeInBytes);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  CheckRegions(job, workspace, workspaceSizeInBytes, StreamDevice(stream));
  if (algo != nullptr) CheckAlignments(job, *algo);
  Enqueue(
      stream, [job] {
        for (int b = 0; b < job.p.batch; b++) RunBatch(job, b);
      },
      TraceKind::kLibrary, "cublasLtMatmul");
  return CUBLAS_STATUS_SUCCESS;
}
