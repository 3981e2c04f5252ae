// Muon's maths (model/muon.h) against double-precision computations written out here:
// Newton-Schulz's exact arithmetic on small matrices (both orientations), the orthogonality of
// its result (every singular value near 1), and several steps of the whole Muon update on a
// synthetic least-squares problem. Plus MuonPlan's table (parallel/muon_plan.h): which
// elements are Muon's and that owners are balanced.
#include "model/muon.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "parallel/muon_plan.h"

namespace shardgpt {
namespace {

using VecD = std::vector<double>;

std::vector<float> Gaussian(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// C[m,n] = A[m,k] B[k,n] (tb: B given as [n,k], i.e. A B^T), row-major, double.
VecD Mul(const VecD& A, const VecD& B, int m, int k, int n, bool tb) {
  VecD C(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int l = 0; l < k; l++) s += A[i * k + l] * (tb ? B[j * k + l] : B[l * n + j]);
      C[i * n + j] = s;
    }
  return C;
}

// Muon's Newton-Schulz in double: X = U/(|U|_F + 1e-7), transposed if rows > cols,
// X <- a X + (b A + c A A) X with A = X X^T, transposed back.
VecD NewtonSchulzDouble(const std::vector<float>& u, int rows, int cols, int steps) {
  double ss = 0;
  for (float x : u) ss += double(x) * x;
  const double inv = 1.0 / (std::sqrt(ss) + 1e-7);
  const bool tr = rows > cols;
  const int r = tr ? cols : rows, c = tr ? rows : cols;
  VecD X(u.size());
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) (tr ? X[j * c + i] : X[i * c + j]) = u[i * cols + j] * inv;
  for (int s = 0; s < steps; s++) {
    const VecD A = Mul(X, X, r, c, r, true);
    const VecD AA = Mul(A, A, r, r, r, false);
    VecD B(A.size());
    for (size_t i = 0; i < B.size(); i++) B[i] = -4.7750 * A[i] + 2.0315 * AA[i];
    const VecD BX = Mul(B, X, r, r, c, false);
    for (size_t i = 0; i < X.size(); i++) X[i] = 3.4445 * X[i] + BX[i];
  }
  VecD out(u.size());
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) out[i * cols + j] = tr ? X[j * c + i] : X[i * c + j];
  return out;
}

// Exact maths: the fp32 kernel equals the double computation to fp32 rounding (the quintic
// amplifies rounding a little: differences ~1e-7 on entries of size ~0.3).
TEST(NewtonSchulz, EqualsDoublePrecisionOnSmallMatrices) {
  for (auto [rows, cols] : {std::pair{3, 5}, std::pair{5, 3}, std::pair{4, 4}, std::pair{16, 40}}) {
    std::vector<float> x = Gaussian(static_cast<size_t>(rows) * cols, 7 + rows);
    const VecD ref = NewtonSchulzDouble(x, rows, cols, 5);
    NewtonSchulz(x.data(), rows, cols, 5);
    for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(x[i], ref[i], 2e-5) << rows << "x" << cols << " at " << i;
  }
}

// The largest and smallest eigenvalue of a symmetric positive semi-definite S [n,n] (power
// iteration on S and on lmax*I - S), double.
std::pair<double, double> EigenRange(const VecD& S, int n) {
  auto power = [&](double shift, int sign) {
    VecD v(n, 1.0), w(n);
    double lambda = 0;
    for (int it = 0; it < 3000; it++) {
      for (int i = 0; i < n; i++) {
        double s = shift * v[i];
        for (int j = 0; j < n; j++) s += sign * S[i * n + j] * v[j];
        w[i] = s;
      }
      double nrm = 0;
      for (double x : w) nrm += x * x;
      nrm = std::sqrt(nrm);
      lambda = nrm;
      for (int i = 0; i < n; i++) v[i] = w[i] / nrm;
    }
    return lambda;
  };
  const double lmax = power(0.0, 1);
  const double lmin = lmax - power(lmax, -1);
  return {lmin, lmax};
}

// Orthogonality: for a Gaussian 48x96 matrix (and its transpose) the 5-step quintic leaves every
// singular value of X in [0.6, 1.25] (here [0.682, 1.131]; the coefficients aim at ~[0.7, 1.2]),
// whereas U's own singular values span a factor ~6. Checked via the eigenvalues of X X^T in double.
TEST(NewtonSchulz, SingularValuesNearOne) {
  for (auto shape : {std::pair{48, 96}, std::pair{96, 48}}) {
    const int rows = shape.first, cols = shape.second;  // (a lambda may not capture structured bindings in C++17)
    std::vector<float> x = Gaussian(static_cast<size_t>(rows) * cols, 3);
    auto range_of = [&](const std::vector<float>& m) {
      const int r = std::min(rows, cols), c = std::max(rows, cols);
      VecD X(m.size());  // r x c orientation
      for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) (rows > cols ? X[j * c + i] : X[i * c + j]) = m[i * cols + j];
      return EigenRange(Mul(X, X, r, c, r, true), r);  // eigenvalues = singular values squared
    };
    const auto [u_lo, u_hi] = range_of(x);
    EXPECT_GT(std::sqrt(u_hi / u_lo), 4.0) << "the input is far from orthogonal";
    NewtonSchulz(x.data(), rows, cols, 5);
    const auto [lo, hi] = range_of(x);
    EXPECT_GE(std::sqrt(lo), 0.6) << rows << "x" << cols;
    EXPECT_LE(std::sqrt(hi), 1.25) << rows << "x" << cols;
  }
}

// The whole Muon update, several steps, fp32 functions against a double reference of the same
// algorithm on min 0.5|W - T|^2 (G = W - T): momentum, Nesterov, Newton-Schulz, Moonlight's
// scale, decoupled weight decay. Bound: 1e-5 per element after 6 steps with lr 0.02
// (one step moves an element by ~lr*0.2*sqrt(40)*|X| ~ 0.01; the largest difference is 3.7e-7).
TEST(Muon, StepsMatchDoublePrecisionReference) {
  const int rows = 24, cols = 40, steps = 6;
  const size_t n = static_cast<size_t>(rows) * cols;
  const float lr = 0.02f, wd = 0.1f, mu = 0.95f;
  std::vector<float> w = Gaussian(n, 11, 0.5f), target = Gaussian(n, 12, 0.5f), m(n, 0.0f), g(n), u(n);
  VecD wd_ref(w.begin(), w.end()), m_ref(n, 0.0);
  for (int s = 0; s < steps; s++) {
    for (size_t i = 0; i < n; i++) g[i] = w[i] - target[i];
    muon_momentum(m.data(), u.data(), g.data(), n, mu, 1.0f);
    NewtonSchulz(u.data(), rows, cols, 5);
    const float scale = MuonScale(rows, cols);
    for (float& x : u) x *= scale;
    muon_apply(w.data(), u.data(), n, lr, wd);

    std::vector<float> uref(n);  // U in double, handed to the double Newton-Schulz
    VecD ud(n);
    for (size_t i = 0; i < n; i++) {
      const double gi = wd_ref[i] - target[i];
      m_ref[i] = mu * m_ref[i] + gi;
      ud[i] = gi + mu * m_ref[i];
      uref[i] = static_cast<float>(ud[i]);
    }
    const VecD X = NewtonSchulzDouble(uref, rows, cols, 5);
    const double sc = 0.2 * std::sqrt(40.0);
    for (size_t i = 0; i < n; i++) wd_ref[i] = wd_ref[i] * (1.0 - lr * wd) - lr * sc * X[i];
  }
  double worst = 0, moved = 0;
  const std::vector<float> w0 = Gaussian(n, 11, 0.5f);
  for (size_t i = 0; i < n; i++) {
    worst = std::max(worst, std::fabs(w[i] - wd_ref[i]));
    moved = std::max(moved, std::fabs(wd_ref[i] - w0[i]));
  }
  EXPECT_GT(moved, 0.02);  // the steps did move the weights
  EXPECT_LE(worst, 1e-5);
}

// MuonPlan: exactly the blocks' 2-D weights are Muon's (c_attn as three C x C parts), every
// matrix has one owner, and the owners' Newton-Schulz FLOPs are balanced to within the
// largest matrix.
TEST(MuonPlan, MatricesAndBalancedOwners) {
  const GPTConfig cfg{4, 2, 32, 16, 256};  // L=4, C=32
  ParamLayout layout(cfg);
  const int C = 32;
  for (int N : {1, 2, 3, 4}) {
    ShardPlan plan(layout, N);
    MuonPlan mp(layout, plan, false, 5);
    ASSERT_EQ(mp.matrices().size(), 4u * 6);  // q, k, v, attn proj, fc, fc proj per block
    size_t expect = 0;
    for (int l = 0; l < 4; l++) expect += 3 * C * C + C * C + 4 * C * C + 4 * C * C;
    EXPECT_EQ(mp.muon_numel(), expect);
    double total = 0, worst = 0, biggest = 0;
    for (const MuonMatrix& m : mp.matrices()) biggest = std::max(biggest, m.NsFlops(5)), total += m.NsFlops(5);
    for (int r = 0; r < N; r++) worst = std::max(worst, mp.OwnerFlops(r));
    EXPECT_LE(worst, total / N + biggest) << "N=" << N;
    double sum = 0;
    for (int r = 0; r < N; r++) sum += mp.OwnerFlops(r);
    EXPECT_DOUBLE_EQ(sum, total);
    const int qkv = layout.Find("h.1.attn.c_attn.weight");
    EXPECT_EQ(mp.matrices()[6].name, "h.1.attn.c_attn.weight.q");
    EXPECT_EQ(mp.matrices()[7].begin, layout.tensors()[qkv].offset + C * C);
  }
}

}  // namespace
}  // namespace shardgpt
