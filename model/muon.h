// Muon's maths (Jordan et al. 2024; Moonlight's scaling, Liu et al. 2025), for one matrix, in
// fp32 on the host. Muon orthogonalises the (Nesterov) momentum of each 2-D weight matrix, so
// unlike AdamW it needs the WHOLE matrix: parallel/sharded_muon.h brings each matrix to one
// owner rank for the Newton-Schulz part; the element-wise parts run on every rank's shard.
//
// Per matrix W [rows, cols] with gradient G (already averaged and clipped), t >= 1:
//   M <- mu*M + G                 (momentum, fp32, one per element: the whole Muon state)
//   U  = G + mu*M                 (Nesterov)
//   X  = U / (||U||_F + 1e-7);  X = X^T if rows > cols      (so X is r x c with r <= c)
//   repeat ns_steps:  A = X X^T;  X <- a X + (b A + c A A) X,  (a, b, c) = (3.4445, -4.7750, 2.0315)
//   X = X^T if it was transposed
//   W <- W*(1 - lr*wd) - lr * 0.2*sqrt(max(rows, cols)) * X
// The quintic drives every singular value of X towards ~1 (into [0.7, 1.2], not exactly 1:
// the coefficients trade accuracy for speed), i.e. X ~ U V^T of U's SVD.
//
// Thread contract: none (pure functions); NewtonSchulz uses OpenBLAS's threads.
#pragma once

#include <cstddef>

namespace shardgpt {

struct MuonConfig {
  float momentum = 0.95f;  // --muon-momentum
  int ns_steps = 5;        // --muon-ns-steps
};

constexpr float kMuonA = 3.4445f, kMuonB = -4.7750f, kMuonC = 2.0315f;
constexpr float kMuonNormEps = 1e-7f;

// Element-wise over n elements: g = grad*grad_scale; m = mu*m + g; u = g + mu*m.
void muon_momentum(float* m, float* u, const float* grad, size_t n, float mu, float grad_scale);

// In place on x [rows, cols] (row-major) holding U: normalise by the Frobenius norm (+1e-7),
// transpose if rows > cols, `steps` quintic iterations (matmuls through cblas_sgemm), transpose
// back. x then holds X (not yet scaled by MuonScale).
void NewtonSchulz(float* x, int rows, int cols, int steps);

// Moonlight's update scale 0.2*sqrt(max(rows, cols)): matches AdamW's update RMS, so AdamW's
// learning rate and weight decay carry over.
float MuonScale(int rows, int cols);

// Element-wise: w = w*(1 - lr*wd) - lr*o, where o = MuonScale * X.
void muon_apply(float* w, const float* o, size_t n, float lr, float weight_decay);

}  // namespace shardgpt
