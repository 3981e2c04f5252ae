#include "model/muon.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace shardgpt {

void muon_momentum(float* m, float* u, const float* grad, size_t n, float mu, float grad_scale) {
  for (size_t i = 0; i < n; i++) {
    const float g = grad[i] * grad_scale;
    const float mi = mu * m[i] + g;
    m[i] = mi;
    u[i] = g + mu * mi;
  }
}

void NewtonSchulz(float* x, int rows, int cols, int steps) {
  const size_t n = static_cast<size_t>(rows) * cols;
  double ss = 0;  // the norm accumulates in double: one rounding, whatever n
  for (size_t i = 0; i < n; i++) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / (static_cast<float>(std::sqrt(ss)) + kMuonNormEps);
  const bool tr = rows > cols;
  const int r = tr ? cols : rows, c = tr ? rows : cols;  // X is r x c, r <= c: A = X X^T is the small side
  std::vector<float> X(n), Y(n), A(static_cast<size_t>(r) * r), B(A.size());
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) {
      const float v = x[static_cast<size_t>(i) * cols + j] * inv;
      if (tr) X[static_cast<size_t>(j) * c + i] = v; else X[static_cast<size_t>(i) * c + j] = v;
    }
  for (int s = 0; s < steps; s++) {
    // A = X X^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, c, 1.0f, X.data(), c, X.data(), c, 0.0f, A.data(), r);
    // B = b A + c A A
    B = A;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, r, r, kMuonC, A.data(), r, A.data(), r, kMuonB,
                B.data(), r);
    // Y = a X + B X
    Y = X;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, c, r, 1.0f, B.data(), r, X.data(), c, kMuonA,
                Y.data(), c);
    std::swap(X, Y);
  }
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++)
      x[static_cast<size_t>(i) * cols + j] = tr ? X[static_cast<size_t>(j) * c + i] : X[static_cast<size_t>(i) * c + j];
}

float MuonScale(int rows, int cols) { return 0.2f * std::sqrt(static_cast<float>(std::max(rows, cols))); }

void muon_apply(float* w, const float* o, size_t n, float lr, float weight_decay) {
  const float keep = 1.0f - lr * weight_decay;
  for (size_t i = 0; i < n; i++) w[i] = w[i] * keep - lr * o[i];
}

}  // namespace shardgpt
