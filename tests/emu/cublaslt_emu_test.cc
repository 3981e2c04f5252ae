// The CUDA emulation's cuBLASLt (emu/cuda/cublaslt.cc) against a naive loop in double on small
// random column-major matrices: transposes with ld > rows (padding NaN, so that reading it
// shows), beta, the bias / GELU / aux / gradient epilogues, strided batches, bf16 inputs and
// what the FAST compute types make of fp32 inputs; and that it refuses or stops, naming the
// function and the matrix, on what cuBLASLt refuses or a GPU punishes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cublasLt.h"
#include "cuda_runtime.h"

namespace {

#define CHECK_CUDA(x) ASSERT_EQ((x), cudaSuccess) << #x
#define CHECK_LT(x) ASSERT_EQ((x), CUBLAS_STATUS_SUCCESS) << #x

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- number formats (the test's own bit tricks, independent of the emulation's) ----

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t Bf16Bits(float f) {  // round to nearest even (finite inputs)
  const uint32_t u = Bits(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float Bf16Value(uint16_t b) { return FromBits(uint32_t{b} << 16); }
float RoundBf16(float f) { return Bf16Value(Bf16Bits(f)); }
float RoundTf32(float f) {  // 10 mantissa bits, nearest even
  const uint32_t u = Bits(f);
  return FromBits((u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu);
}
double Exact(float f) { return f; }
double InBf16(float f) { return RoundBf16(f); }
double InTf32(float f) { return RoundTf32(f); }

double Gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double GeluGrad(double x) {
  const double c = std::sqrt(2 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
}

// ---- host matrices ----

// Column-major, batch after batch: element (b, i, j) at b * stride + i + j * ld. Values are
// floats (for bf16 matrices: bf16-representable ones); everything outside the elements is NaN.
struct Mat {
  int64_t rows = 0, cols = 0, ld = 0, stride = 0;
  int batch = 1;
  cudaDataType_t type = CUDA_R_32F;
  std::vector<float> v;
  size_t Index(int b, int64_t i, int64_t j) const { return size_t(b * stride + i + j * ld); }
  float At(int b, int64_t i, int64_t j) const { return v[Index(b, i, j)]; }
  size_t ElementSize() const { return type == CUDA_R_16BF ? 2 : 4; }
  size_t Bytes() const { return v.size() * ElementSize(); }
};

// A rows x cols matrix of uniform values in [lo, hi) with the given ld and batch stride
// (stride 0: batches `rows + ld * (cols - 1) + 5` elements apart).
Mat RandomMat(std::mt19937& rng, int64_t rows, int64_t cols, int64_t ld, int batch, cudaDataType_t type,
              int64_t stride = 0, float lo = -1, float hi = 1) {
  Mat m;
  m.rows = rows, m.cols = cols, m.ld = ld, m.batch = batch, m.type = type;
  m.stride = stride ? stride : (cols - 1) * ld + rows + 5;
  m.v.assign(size_t((batch - 1) * m.stride + (cols - 1) * ld + rows), kNaN);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int b = 0; b < batch; b++)
    for (int64_t j = 0; j < cols; j++)
      for (int64_t i = 0; i < rows; i++) {
        const float x = u(rng);
        m.v[m.Index(b, i, j)] = type == CUDA_R_16BF ? RoundBf16(x) : x;
      }
  return m;
}

std::vector<float> Map(const std::vector<float>& v, float (*f)(float)) {
  std::vector<float> out(v);
  for (float& x : out) x = std::isnan(x) ? x : f(x);
  return out;
}

// ---- the test fixture: a handle, a stream, device buffers freed at the end ----

class CublasLtEmulation : public testing::Test {
 protected:
  void SetUp() override {
    CHECK_LT(cublasLtCreate(&lt_));
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    cudaStreamSynchronize(stream_);
    for (void* p : buffers_) cudaFree(p);
    cudaStreamDestroy(stream_);
    cublasLtDestroy(lt_);
  }

  // A device buffer of exactly `bytes`.
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }
  // Floats as stored in `type` (fp32 or bf16) in a new device buffer of exactly their size.
  void* Upload(const std::vector<float>& v, cudaDataType_t type) {
    void* p = Alloc(v.size() * (type == CUDA_R_16BF ? 2 : 4));
    if (type == CUDA_R_16BF) {
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); i++) bits[i] = std::isnan(v[i]) ? 0x7fc0 : Bf16Bits(v[i]);
      EXPECT_EQ(cudaMemcpy(p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return p;
  }
  void* Upload(const Mat& m) { return Upload(m.v, m.type); }
  std::vector<float> Download(const void* p, size_t n, cudaDataType_t type) {
    cudaStreamSynchronize(stream_);
    std::vector<float> v(n);
    if (type == CUDA_R_16BF) {
      std::vector<uint16_t> bits(n);
      EXPECT_EQ(cudaMemcpy(bits.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; i++) v[i] = Bf16Value(bits[i]);
    } else {
      EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  }

  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
};

// ---- one matmul: its configuration, operands, the emulation's and the reference's answers ----

struct Spec {
  int64_t m = 5, n = 7, k = 6;
  bool ta = false, tb = false;
  int64_t pad = 3;  // ld = stored rows + pad, for A, B, C and D
  int batch = 1;
  cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  float alpha = 1, beta = 0;
  bool in_place = false;  // C is D
};

bool AddsBias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool WritesAux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool ReadsAux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool Gelus(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || WritesAux(e);
}
bool Relus(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS; }
// Length of the bias (input or gradient): D's rows, or its columns for BGRADB.
int64_t BiasLength(const Spec& s) { return s.epilogue == CUBLASLT_EPILOGUE_BGRADB ? s.n : s.m; }
bool WritesBiasGrad(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}

// Random operands of a spec. The bias has D's type; batches of the bias and aux lie apart.
struct Operands {
  Mat a, b, c, d, aux;
  std::vector<float> bias;  // batch after batch, BiasLength apart
};

Operands RandomOperands(const Spec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  Operands o;
  const int64_t ar = s.ta ? s.k : s.m, br = s.tb ? s.n : s.k;
  o.a = RandomMat(rng, ar, s.ta ? s.m : s.k, ar + s.pad, s.batch, s.ab);
  o.b = RandomMat(rng, br, s.tb ? s.k : s.n, br + s.pad, s.batch, s.ab);
  o.c = RandomMat(rng, s.m, s.n, s.m + s.pad, s.batch, s.cd);
  o.d = s.in_place ? o.c : RandomMat(rng, s.m, s.n, s.m + s.pad, s.batch, s.cd);  // garbage to be overwritten
  // The GELU input: ld and batch stride multiples of 8, as cuBLASLt wants.
  const int64_t aux_ld = (s.m + 7) / 8 * 8;
  o.aux = RandomMat(rng, s.m, s.n, aux_ld, s.batch, s.cd, aux_ld * s.n + 8, -2, 2);
  std::uniform_real_distribution<float> u(-2, 2);
  o.bias.resize(size_t(BiasLength(s) * s.batch));
  for (float& x : o.bias) x = s.cd == CUDA_R_16BF ? RoundBf16(u(rng)) : u(rng);
  return o;
}

// cuBLASLt's definition in double: x = alpha op(A) op(B) + beta C (+ bias), then the epilogue;
// `in` is what the compute type makes of an input. Indexed like o.d / o.aux / o.bias.
struct Reference {
  std::vector<double> d, aux, bias;
};

Reference Compute(const Spec& s, const Operands& o, double (*in)(float) = Exact) {
  Reference r;
  r.d.assign(o.d.v.size(), NAN);
  r.aux.assign(o.aux.v.size(), NAN);
  r.bias.assign(o.bias.size(), 0.0);
  const int64_t len = BiasLength(s);
  for (int b = 0; b < s.batch; b++) {
    for (int64_t j = 0; j < s.n; j++)
      for (int64_t i = 0; i < s.m; i++) {
        double acc = 0;
        for (int64_t p = 0; p < s.k; p++) {
          const double a = in(s.ta ? o.a.At(b, p, i) : o.a.At(b, i, p));
          const double bb = in(s.tb ? o.b.At(b, j, p) : o.b.At(b, p, j));
          acc += a * bb;
        }
        double x = s.alpha * acc;
        if (s.beta != 0) x += s.beta * double(o.c.At(b, i, j));
        if (AddsBias(s.epilogue)) x += o.bias[size_t(b * len + i)];
        if (WritesAux(s.epilogue)) r.aux[o.aux.Index(b, i, j)] = x;
        if (Gelus(s.epilogue)) x = Gelu(x);
        if (Relus(s.epilogue)) x = std::max(x, 0.0);
        if (ReadsAux(s.epilogue)) x *= GeluGrad(o.aux.At(b, i, j));
        r.d[o.d.Index(b, i, j)] = x;
        if (s.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) r.bias[size_t(b * len + i)] += x;
      }
    for (int64_t p = 0; p < s.k; p++) {
      if (s.epilogue == CUBLASLT_EPILOGUE_BGRADA)
        for (int64_t i = 0; i < s.m; i++) r.bias[size_t(b * len + i)] += s.ta ? o.a.At(b, p, i) : o.a.At(b, i, p);
      if (s.epilogue == CUBLASLT_EPILOGUE_BGRADB)
        for (int64_t j = 0; j < s.n; j++) r.bias[size_t(b * len + j)] += s.tb ? o.b.At(b, j, p) : o.b.At(b, p, j);
    }
  }
  return r;
}

// The emulation's results.
struct Result {
  cublasStatus_t heuristic = CUBLAS_STATUS_SUCCESS, matmul = CUBLAS_STATUS_SUCCESS;
  std::vector<float> d, aux, bias;
};

// Descriptors of a spec (destroyed with the object).
struct Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    cublasLtMatmulDescDestroy(desc);
    for (auto l : {a, b, c, d}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(pref);
  }
};

cublasLtMatrixLayout_t Layout(const Mat& m) {
  cublasLtMatrixLayout_t l = nullptr;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, m.type, m.rows, m.cols, m.ld), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &m.batch, sizeof(m.batch)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride, sizeof(m.stride)),
      CUBLAS_STATUS_SUCCESS);
  return l;
}

template <typename T>
void SetDesc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), CUBLAS_STATUS_SUCCESS) << attr;
}

void MakeDescriptors(const Spec& s, const Operands& o, const void* bias, const void* aux, Descriptors* x) {
  EXPECT_EQ(cublasLtMatmulDescCreate(&x->desc, s.compute, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  SetDesc(x->desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  SetDesc(x->desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  SetDesc(x->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, s.epilogue);
  if (bias) {
    SetDesc(x->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    SetDesc(x->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, BiasLength(s));
  }
  if (aux) {
    SetDesc(x->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    SetDesc(x->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, o.aux.ld);
    SetDesc(x->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, o.aux.stride);
  }
  x->a = Layout(o.a), x->b = Layout(o.b), x->c = Layout(o.c), x->d = Layout(o.d);
  EXPECT_EQ(cublasLtMatmulPreferenceCreate(&x->pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t ws = 1 << 20;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
            CUBLAS_STATUS_SUCCESS);
}

class CublasLtMatmul : public CublasLtEmulation {
 protected:
  // Heuristic, then cublasLtMatmul on the stream; returns what the device buffers hold after.
  Result Run(const Spec& s, const Operands& o) {
    Result r;
    const bool needs_bias = AddsBias(s.epilogue) || WritesBiasGrad(s.epilogue);
    const bool needs_aux = WritesAux(s.epilogue) || ReadsAux(s.epilogue);
    void* A = Upload(o.a);
    void* B = Upload(o.b);
    void* C = Upload(o.c);
    void* D = s.in_place ? C : Upload(o.d);
    void* bias = needs_bias ? Upload(o.bias, s.cd) : nullptr;
    void* aux = needs_aux ? Upload(o.aux) : nullptr;
    void* workspace = Alloc(1 << 20);
    Descriptors x;
    MakeDescriptors(s, o, bias, aux, &x);
    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    r.heuristic = cublasLtMatmulAlgoGetHeuristic(lt_, x.desc, x.a, x.b, x.c, x.d, x.pref, 1, &h, &found);
    if (r.heuristic != CUBLAS_STATUS_SUCCESS) return r;
    EXPECT_EQ(found, 1);
    EXPECT_EQ(h.state, CUBLAS_STATUS_SUCCESS);
    EXPECT_LE(h.workspaceSize, size_t{1} << 20);
    r.matmul = cublasLtMatmul(lt_, x.desc, &s.alpha, A, x.a, B, x.b, &s.beta, C, x.c, D, x.d, &h.algo, workspace,
                              1 << 20, stream_);
    if (r.matmul != CUBLAS_STATUS_SUCCESS) return r;
    r.d = Download(D, o.d.v.size(), s.cd);
    if (needs_bias) r.bias = Download(bias, o.bias.size(), s.cd);
    if (needs_aux) r.aux = Download(aux, o.aux.v.size(), s.cd);
    return r;
  }
};

bool SameBits(float a, float b) { return std::isnan(a) ? std::isnan(b) : Bits(a) == Bits(b); }

// Within half an ulp of `type` of the reference (one rounding to nearest; a hair more for the
// reference's own double arithmetic); where the reference is NaN (padding, not to be touched):
// still `before`.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, const std::vector<float>& before,
                 cudaDataType_t type, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double rel = std::ldexp(1.0 + 1e-9, type == CUDA_R_16BF ? -8 : -24);
  for (size_t i = 0; i < got.size(); i++) {
    if (std::isnan(want[i]))
      EXPECT_TRUE(SameBits(got[i], before[i])) << what << " element " << i << " (padding) was written";
    else
      EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i]) + 1e-30) << what << " element " << i;
  }
}

void ExpectCloseVector(const std::vector<float>& got, const std::vector<double>& want, cudaDataType_t type,
                       const char* what) {
  ExpectClose(got, want, std::vector<float>(got.size()), type, what);
}

// ---- results ----

TEST_F(CublasLtMatmul, EveryTransposeWithPaddedLeadingDimensions) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "ta " << ta << " tb " << tb);
      Spec s;
      s.ta = ta, s.tb = tb, s.alpha = 1.5f, s.beta = -0.75f;
      const Operands o = RandomOperands(s, 1 + 2 * ta + tb);
      const Result r = Run(s, o);
      ASSERT_EQ(r.heuristic, CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
      ExpectClose(r.d, Compute(s, o).d, o.d.v, s.cd, "D");
    }
}

TEST_F(CublasLtMatmul, InPlaceAccumulateAndBetaZeroIgnoresC) {
  Spec s;
  s.ta = true, s.beta = 1, s.in_place = true;  // matmul_backward's dw += ...
  Operands o = RandomOperands(s, 7);
  Result r = Run(s, o);
  ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
  ExpectClose(r.d, Compute(s, o).d, o.d.v, s.cd, "D");
  // beta == 0: C is not read, so NaNs in it do not reach D (as cuBLAS).
  s.beta = 0, s.in_place = false;
  o = RandomOperands(s, 8);
  for (float& x : o.c.v) x = kNaN;
  r = Run(s, o);
  ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
  ExpectClose(r.d, Compute(s, o).d, o.d.v, s.cd, "D");
}

TEST_F(CublasLtMatmul, BiasReluAndGeluEpilogues) {
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_BIAS,
                               CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS}) {
    SCOPED_TRACE(testing::Message() << "epilogue " << e);
    Spec s;
    s.ta = true, s.beta = 0.5f, s.epilogue = e;
    const Operands o = RandomOperands(s, 10 + e);
    const Result r = Run(s, o);
    ASSERT_EQ(r.heuristic, CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
    ExpectClose(r.d, Compute(s, o).d, o.d.v, s.cd, "D");
  }
}

TEST_F(CublasLtMatmul, GeluAuxWritesThePreActivation) {
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS})
    for (cudaDataType_t cd : {CUDA_R_32F, CUDA_R_16BF}) {
      SCOPED_TRACE(testing::Message() << "epilogue " << e << " D type " << cd);
      Spec s;
      s.epilogue = e, s.tb = true, s.batch = 2;
      if (cd == CUDA_R_16BF) s.ab = s.cd = CUDA_R_16BF;
      const Operands o = RandomOperands(s, 20 + e + cd);
      const Result r = Run(s, o);
      ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
      const Reference ref = Compute(s, o);
      ExpectClose(r.d, ref.d, o.d.v, s.cd, "D");
      ExpectClose(r.aux, ref.aux, o.aux.v, s.cd, "aux");
    }
}

TEST_F(CublasLtMatmul, DGeluBGradUsesTheAuxInput) {
  Spec s;
  s.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD, s.m = 9, s.ta = true, s.batch = 2;
  const Operands o = RandomOperands(s, 30);
  const Result r = Run(s, o);
  ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
  const Reference ref = Compute(s, o);
  ExpectClose(r.d, ref.d, o.d.v, s.cd, "D");
  ExpectCloseVector(r.bias, ref.bias, s.cd, "bias gradient");
  // The gradient epilogues leave beta C undefined: refused.
  s.beta = 1;
  EXPECT_EQ(Run(s, o).matmul, CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(CublasLtMatmul, BiasGradientsSumOverK) {
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB})
    for (bool t : {false, true}) {
      SCOPED_TRACE(testing::Message() << "epilogue " << e << " transposed " << t);
      Spec s;
      s.epilogue = e, s.ta = s.tb = t, s.beta = 0.25f, s.k = 11;
      const Operands o = RandomOperands(s, 40 + e + t);
      const Result r = Run(s, o);
      ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
      const Reference ref = Compute(s, o);
      ExpectClose(r.d, ref.d, o.d.v, s.cd, "D");
      ExpectCloseVector(r.bias, ref.bias, s.cd, "bias gradient");
    }
}

TEST_F(CublasLtMatmul, StridedBatchesWithBias) {
  for (bool ta : {false, true}) {
    Spec s;
    s.batch = 3, s.ta = ta, s.tb = !ta, s.beta = 2, s.epilogue = CUBLASLT_EPILOGUE_BIAS;
    const Operands o = RandomOperands(s, 50 + ta);
    const Result r = Run(s, o);
    ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
    ExpectClose(r.d, Compute(s, o).d, o.d.v, s.cd, "D");
  }
}

TEST_F(CublasLtMatmul, Bf16InputsWithFp32AndBf16Outputs) {
  for (cudaDataType_t cd : {CUDA_R_32F, CUDA_R_16BF}) {
    Spec s;
    s.ab = CUDA_R_16BF, s.cd = cd, s.beta = 0.5f, s.ta = true, s.epilogue = CUBLASLT_EPILOGUE_BIAS;
    const Operands o = RandomOperands(s, 60 + cd);
    const Result r = Run(s, o);
    ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
    ExpectClose(r.d, Compute(s, o).d, o.d.v, s.cd, "D");
  }
}

// D = A (1x3) B (3x3) with exact results 1 + 2^-8 (a tie), 1 + 3 * 2^-8 (a tie) and
// 1 + 2^-8 + 2^-30 (just above a tie, but a tie once rounded to fp32).
TEST_F(CublasLtMatmul, Bf16OutputIsRoundedOnceToNearestEven) {
  const std::vector<float> a = {1, std::ldexp(1.0f, -8), std::ldexp(1.0f, -15)};
  const std::vector<float> b = {1, 1, 0, 1, 3, 0, 1, 1, std::ldexp(1.0f, -15)};
  void* A = Upload(a, CUDA_R_16BF);
  void* B = Upload(b, CUDA_R_16BF);
  void* D = Alloc(3 * 2);
  Descriptors x;
  CHECK_LT(cublasLtMatmulDescCreate(&x.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CHECK_LT(cublasLtMatrixLayoutCreate(&x.a, CUDA_R_16BF, 1, 3, 1));
  CHECK_LT(cublasLtMatrixLayoutCreate(&x.b, CUDA_R_16BF, 3, 3, 3));
  CHECK_LT(cublasLtMatrixLayoutCreate(&x.d, CUDA_R_16BF, 1, 3, 1));
  const float one = 1, zero = 0;
  CHECK_LT(cublasLtMatmul(lt_, x.desc, &one, A, x.a, B, x.b, &zero, D, x.d, D, x.d, nullptr, nullptr, 0, stream_));
  std::vector<uint16_t> bits(3);
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  CHECK_CUDA(cudaMemcpy(bits.data(), D, 6, cudaMemcpyDeviceToHost));
  EXPECT_EQ(bits[0], 0x3f80);  // 1
  EXPECT_EQ(bits[1], 0x3f82);  // 1 + 2^-6
  EXPECT_EQ(bits[2], 0x3f81);  // 1 + 2^-7
}

// 1 + 2^-24 + 2^-24: fp32 sums would give 1 (two ties to even); double sums 1 + 2^-23.
TEST_F(CublasLtMatmul, SumsAreInDouble) {
  void* A = Upload({1, std::ldexp(1.0f, -24), std::ldexp(1.0f, -24)}, CUDA_R_32F);
  void* B = Upload({1, 1, 1}, CUDA_R_32F);
  void* D = Alloc(4);
  Descriptors x;
  CHECK_LT(cublasLtMatmulDescCreate(&x.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CHECK_LT(cublasLtMatrixLayoutCreate(&x.a, CUDA_R_32F, 1, 3, 1));
  CHECK_LT(cublasLtMatrixLayoutCreate(&x.b, CUDA_R_32F, 3, 1, 3));
  CHECK_LT(cublasLtMatrixLayoutCreate(&x.d, CUDA_R_32F, 1, 1, 1));
  const float one = 1, zero = 0;
  CHECK_LT(cublasLtMatmul(lt_, x.desc, &one, A, x.a, B, x.b, &zero, D, x.d, D, x.d, nullptr, nullptr, 0, stream_));
  EXPECT_EQ(Download(D, 1, CUDA_R_32F)[0], 1 + std::ldexp(1.0f, -23));
}

TEST_F(CublasLtMatmul, Fast16bfOnBf16RepresentableInputsEqualsBf16Inputs) {
  Spec s;  // alpha 1, beta 0: D is the rounded dot products, no other rounding
  Operands o = RandomOperands(s, 70);
  o.a.v = Map(o.a.v, RoundBf16);
  o.b.v = Map(o.b.v, RoundBf16);
  s.compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  const Result fast = Run(s, o);
  ASSERT_EQ(fast.matmul, CUBLAS_STATUS_SUCCESS);
  Spec sb = s;
  sb.ab = CUDA_R_16BF, sb.compute = CUBLAS_COMPUTE_32F;
  Operands ob = o;
  ob.a.type = ob.b.type = CUDA_R_16BF;
  const Result bf16 = Run(sb, ob);
  ASSERT_EQ(bf16.matmul, CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(fast.d.size(), bf16.d.size());
  for (size_t i = 0; i < fast.d.size(); i++) EXPECT_TRUE(SameBits(fast.d[i], bf16.d[i])) << i;
}

TEST_F(CublasLtMatmul, Fast16bfRoundsFp32InputsToBf16) {
  Spec s;
  s.k = 16;
  const Operands o = RandomOperands(s, 71);  // random floats: almost none bf16-representable
  s.compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  const Result fast = Run(s, o);
  ASSERT_EQ(fast.matmul, CUBLAS_STATUS_SUCCESS);
  const Reference exact = Compute(s, o), rounded = Compute(s, o, InBf16);
  int differ = 0;
  for (size_t i = 0; i < fast.d.size(); i++) {
    if (std::isnan(exact.d[i])) continue;
    EXPECT_EQ(fast.d[i], static_cast<float>(rounded.d[i])) << i;
    differ += fast.d[i] != static_cast<float>(exact.d[i]);
  }
  EXPECT_GT(differ, int(s.m * s.n / 2));
}

TEST_F(CublasLtMatmul, Tf32IsDistinguishableFromBf16) {
  Spec s;
  s.k = 16;
  Operands o = RandomOperands(s, 72);
  o.a.v = Map(o.a.v, RoundTf32);  // TF32-representable, mostly not bf16-representable
  o.b.v = Map(o.b.v, RoundTf32);
  const Reference exact = Compute(s, o), bf16 = Compute(s, o, InBf16);
  s.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  const Result tf32 = Run(s, o);
  s.compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  const Result fast16bf = Run(s, o);
  ASSERT_EQ(tf32.matmul, CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(fast16bf.matmul, CUBLAS_STATUS_SUCCESS);
  int differ = 0;
  for (size_t i = 0; i < tf32.d.size(); i++) {
    if (std::isnan(exact.d[i])) continue;
    EXPECT_EQ(tf32.d[i], static_cast<float>(exact.d[i])) << i;
    EXPECT_EQ(fast16bf.d[i], static_cast<float>(bf16.d[i])) << i;
    differ += tf32.d[i] != fast16bf.d[i];
  }
  EXPECT_GT(differ, int(s.m * s.n / 2));
}

TEST_F(CublasLtMatmul, Tf32RoundsFp32Inputs) {
  Spec s;
  s.k = 16, s.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  const Operands o = RandomOperands(s, 73);  // random floats: almost none TF32-representable
  const Result r = Run(s, o);
  ASSERT_EQ(r.matmul, CUBLAS_STATUS_SUCCESS);
  const Reference exact = Compute(s, o), tf32 = Compute(s, o, InTf32);
  int differ = 0;
  for (size_t i = 0; i < r.d.size(); i++) {
    if (std::isnan(exact.d[i])) continue;
    EXPECT_EQ(r.d[i], static_cast<float>(tf32.d[i])) << i;
    differ += r.d[i] != static_cast<float>(exact.d[i]);
  }
  EXPECT_GT(differ, int(s.m * s.n / 2));
}

TEST_F(CublasLtMatmul, CallTimeValuesAreUsedNotLaterOnes) {
  Spec s;
  s.alpha = 2;
  const Operands o = RandomOperands(s, 80);
  void* A = Upload(o.a);
  void* B = Upload(o.b);
  void* D = Upload(o.d);
  auto* x = new Descriptors;
  MakeDescriptors(s, o, nullptr, nullptr, x);
  cublasLtMatmulHeuristicResult_t h{};
  int found = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt_, x->desc, x->a, x->b, x->d, x->d, x->pref, 1, &h, &found));
  void* ws = Alloc(h.workspaceSize + 1);
  float alpha = s.alpha, beta = 0;
  CHECK_LT(cublasLtMatmul(lt_, x->desc, &alpha, A, x->a, B, x->b, &beta, D, x->d, D, x->d, &h.algo, ws,
                          h.workspaceSize + 1, stream_));
  // The stream has not run yet (deferred): later changes must not reach the queued matmul.
  alpha = 100;
  const cublasOperation_t t = CUBLAS_OP_T;
  SetDesc(x->desc, CUBLASLT_MATMUL_DESC_TRANSA, t);
  delete x;
  ExpectClose(Download(D, o.d.v.size(), s.cd), Compute(s, o).d, o.d.v, s.cd, "D");
}

// ---- refusals ----

TEST_F(CublasLtMatmul, HeuristicRefusesWhatIsNotEmulated) {
  Spec s;
  Operands o = RandomOperands(s, 90);
  {
    Descriptors x;
    MakeDescriptors(s, o, nullptr, nullptr, &x);
    cublasLtMatrixLayout_t bf16_b = nullptr;
    CHECK_LT(cublasLtMatrixLayoutCreate(&bf16_b, CUDA_R_16BF, o.b.rows, o.b.cols, o.b.ld));
    cublasLtMatmulHeuristicResult_t h{};
    int found = -1;
    // Mixed A / B types.
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, x.desc, x.a, bf16_b, x.c, x.d, x.pref, 1, &h, &found),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(found, 0);
    cublasLtMatrixLayoutDestroy(bf16_b);
    // Row order.
    const int32_t row = CUBLASLT_ORDER_ROW;
    CHECK_LT(cublasLtMatrixLayoutSetAttribute(x.a, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof(row)));
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, x.desc, x.a, x.b, x.c, x.d, x.pref, 1, &h, &found),
              CUBLAS_STATUS_NOT_SUPPORTED);
  }
  for (cublasComputeType_t c : {CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_16F}) {
    s.compute = c;
    EXPECT_EQ(Run(s, o).heuristic, CUBLAS_STATUS_NOT_SUPPORTED) << c;
  }
  s.compute = CUBLAS_COMPUTE_32F_FAST_16BF;  // bf16 inputs: compute 32F only
  s.ab = CUDA_R_16BF;
  o.a.type = o.b.type = CUDA_R_16BF;
  o.a.v = Map(o.a.v, RoundBf16), o.b.v = Map(o.b.v, RoundBf16);
  EXPECT_EQ(Run(s, o).heuristic, CUBLAS_STATUS_NOT_SUPPORTED);
  s = Spec{};
  s.epilogue = CUBLASLT_EPILOGUE_RELU_AUX;  // bit-mask layout undocumented
  EXPECT_EQ(Run(s, RandomOperands(s, 91)).heuristic, CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(CublasLtEmulation, InvalidArgumentsAreInvalidValue) {
  cublasLtMatrixLayout_t l = nullptr;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, uint64_t(-3), 4, 8), CUBLAS_STATUS_INVALID_VALUE);
  CHECK_LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 4, 3));  // ld < rows: refused where used
  int64_t ld = 0;
  size_t written = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(ld, 3);
  EXPECT_EQ(written, sizeof(int64_t));
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, nullptr, 0, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(uint64_t));
  const int32_t ld32 = 4;  // LD is int64_t
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld32, sizeof(ld32)),
            CUBLAS_STATUS_INVALID_VALUE);

  cublasLtMatmulDesc_t desc = nullptr;
  CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int64_t wide = CUBLAS_OP_T;  // TRANSA is int32_t
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreference_t pref = nullptr;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t h{};
  int found = 0;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, desc, l, l, l, l, pref, 1, &h, &found), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, desc, l, l, l, l, pref, 1, &h, &found),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, nullptr, l, l, l, l, pref, 1, &h, &found), CUBLAS_STATUS_INVALID_VALUE);
  // Shapes that do not chain: A 4x4, B 5x4.
  cublasLtMatrixLayout_t a = nullptr, b = nullptr;
  CHECK_LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 4, 4, 4));
  CHECK_LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 5, 4, 5));
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, desc, a, b, a, a, pref, 1, &h, &found), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, desc, a, a, a, a, pref, 1, &h, &found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, desc, a, a, a, a, pref, 0, &h, &found), CUBLAS_STATUS_INVALID_VALUE);
  for (auto x : {l, a, b}) cublasLtMatrixLayoutDestroy(x);
  cublasLtMatmulDescDestroy(desc);
  cublasLtMatmulPreferenceDestroy(pref);
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_EQ(cublasLtGetVersion(), size_t{CUBLAS_VERSION});
}

// ---- what a GPU punishes: the process stops, naming cublasLtMatmul and the matrix ----

class CublasLtEmulationDeathTest : public CublasLtEmulation {
 protected:
  // A 4x3 fp32 D = A (4x5, ld lda) B (5x3): descriptors and heuristic with the given alignment.
  void Prepare(int64_t lda, uint32_t align = 256, uint64_t workspace = 0) {
    CHECK_LT(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_LT(cublasLtMatrixLayoutCreate(&a_, CUDA_R_32F, 4, 5, lda));
    CHECK_LT(cublasLtMatrixLayoutCreate(&b_, CUDA_R_32F, 5, 3, 5));
    CHECK_LT(cublasLtMatrixLayoutCreate(&d_, CUDA_R_32F, 4, 3, 4));
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref_));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref_, attr, &align, sizeof(align)));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                  sizeof(workspace)));
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, d_, d_, pref_, 1, &result_, &found));
  }
  cublasStatus_t Matmul(const void* A, const void* B, void* D, void* ws = nullptr, size_t ws_bytes = 0) {
    return cublasLtMatmul(lt_, desc_, &one_, A, a_, B, b_, &zero_, D, d_, D, d_, &result_.algo, ws, ws_bytes, stream_);
  }
  void TearDown() override {
    cublasLtMatmulDescDestroy(desc_);
    for (auto l : {a_, b_, d_}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(pref_);
    CublasLtEmulation::TearDown();
  }
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t result_{};
  float one_ = 1, zero_ = 0;
};

TEST_F(CublasLtEmulationDeathTest, MatrixOneElementPastItsAllocation) {
  Prepare(/*lda=*/6);  // A spans 4 * 6 + 4 = 28 floats
  void* A = Alloc(27 * sizeof(float));
  void* B = Alloc(15 * sizeof(float));
  void* D = Alloc(12 * sizeof(float));
  EXPECT_DEATH(Matmul(A, B, D), "cublasLtMatmul: matrix A \\(4x5, ld 6, CUDA_R_32F.*runs past the end");
  void* A_ok = Alloc(28 * sizeof(float));
  EXPECT_EQ(Matmul(A_ok, B, D), CUBLAS_STATUS_SUCCESS);
}

TEST_F(CublasLtEmulationDeathTest, HostMatrix) {
  Prepare(4);
  std::vector<float> host(20);
  void* B = Alloc(15 * sizeof(float));
  void* D = Alloc(12 * sizeof(float));
  EXPECT_DEATH(Matmul(host.data(), B, D), "cublasLtMatmul: matrix A .*is not in device memory");
}

TEST_F(CublasLtEmulationDeathTest, PointerLessAlignedThanTheAlgorithmWasChosenFor) {
  Prepare(4, /*align=*/16);
  char* A = static_cast<char*>(Alloc(21 * sizeof(float)));
  void* B = Alloc(15 * sizeof(float));
  void* D = Alloc(12 * sizeof(float));
  EXPECT_EQ(Matmul(A, B, D), CUBLAS_STATUS_SUCCESS);
  EXPECT_DEATH(Matmul(A + 4, B, D), "cublasLtMatmul: A at .* is not 16-byte aligned");
}

TEST_F(CublasLtEmulationDeathTest, Workspace) {
  Prepare(4, 256, /*workspace=*/4096);
  ASSERT_GT(result_.workspaceSize, 0u);
  void* A = Alloc(20 * sizeof(float));
  void* B = Alloc(15 * sizeof(float));
  void* D = Alloc(12 * sizeof(float));
  void* ws = Alloc(result_.workspaceSize);
  // Smaller than the algorithm needs: cublasLt.h documents INVALID_VALUE.
  EXPECT_EQ(Matmul(A, B, D, ws, result_.workspaceSize - 1), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(Matmul(A, B, D, ws, result_.workspaceSize), CUBLAS_STATUS_SUCCESS);
  EXPECT_DEATH(Matmul(A, B, D, ws, result_.workspaceSize + 1), "cublasLtMatmul: the workspace .*runs past the end");
}

TEST_F(CublasLtEmulationDeathTest, DeviceScalarsInHostPointerMode) {
  Prepare(4);
  void* A = Alloc(20 * sizeof(float));
  void* B = Alloc(15 * sizeof(float));
  void* D = Alloc(12 * sizeof(float));
  void* alpha = Upload(std::vector<float>{1.0f}, CUDA_R_32F);
  EXPECT_DEATH(
      cublasLtMatmul(lt_, desc_, alpha, A, a_, B, b_, &zero_, D, d_, D, d_, &result_.algo, nullptr, 0, stream_),
      "cublasLtMatmul: alpha or beta is a device pointer");
}

}  // namespace
