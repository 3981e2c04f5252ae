// The emulated mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 and ldmatrix.m8n8.x4(.trans)
// (model/cuda/mma.cuh under SHARDGPT_CUDA_EMULATION), and the kernel's fragment loaders built on
// them, held against a table of element positions written here from the PTX ISA, independently
// of mma.cuh's layout comment and helpers.
//
// The table answers, for each element of a matrix, which lane holds it, in which .b32 register of
// the operand and in which half (0: bits 0..15, the lower-numbered element; 1: bits 16..31). It is
// written per element (row, column -> lane, register, half), the inverse of the direction the
// kernel and the emulation are written in (lane -> elements), from:
//   - "Matrix Fragments for mma.m16n8k16 with floating point type" (Figures "MMA .m16n8k16
//     fragment layout for matrix A / B with .f16 / .bf16 type" and "... for accumulator matrix
//     C/D"): A and B pack their elements a0..a7, b0..b3 two per register, low to high; C and D
//     hold one fp32 element per register;
//   - "Warp-level matrix load instruction: ldmatrix" (Figure "ldmatrix fragment layout for one
//     8x8 Matrix with 16-bit elements"): threads 8i..8i+7 give the row addresses of matrix i;
//     a group of four consecutive threads receives one row, two elements each, in destination
//     register i for matrix i; .trans loads the matrix column-major.
// TableMatchesTheIsaFormulas checks the per-element table against a second transcription, the
// ISA's own per-lane formulas for row and column, so that a slip in either is found.
//
// Every test uses operands whose elements are all distinct, placed into (and read back from)
// registers by the table: a layout misread consistently in the emulation and the loaders (two
// registers swapped everywhere) passes the other emulated tests, and fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "cuda_runtime.h"
#include "model/cuda/launch.cuh"
#include "model/cuda/mma.cuh"

namespace shardgpt {
namespace {

// ---------------------------------------------------------------------------------------------
// The table

// Where one matrix element lives in the warp.
struct Slot {
  int lane, reg, half;
  bool operator==(const Slot& o) const { return lane == o.lane && reg == o.reg && half == o.half; }
};
std::ostream& operator<<(std::ostream& os, const Slot& s) {
  return os << "{lane " << s.lane << ", reg " << s.reg << ", half " << s.half << "}";
}

// A (16x16, row-major operand .row): the figure's four 8x8 quadrants. Rows 0..7 are held by
// elements a0, a1 (columns 0..7) and a4, a5 (columns 8..15), rows 8..15 by a2, a3 and a6, a7;
// within a quadrant row r sits in lanes 4(r mod 8) .. 4(r mod 8) + 3, two adjacent columns each,
// the even column first. Element a_e is register e/2, half e%2.
Slot SlotA(int row, int col) {
  const int e = (col < 8 ? 0 : 4) + (row < 8 ? 0 : 2) + col % 2;
  return {4 * (row % 8) + (col % 8) / 2, e / 2, e % 2};
}
// B (16x8, column-major operand .col): column n sits in lanes 4n .. 4n + 3; rows 0..7 are b0, b1
// (two adjacent rows per lane, the even row first), rows 8..15 are b2, b3.
Slot SlotB(int row, int col) {
  const int e = (row < 8 ? 0 : 2) + row % 2;
  return {4 * col + (row % 8) / 2, e / 2, e % 2};
}
// C, D (16x8 fp32): row r in lanes 4(r mod 8) .. +3, two adjacent columns each; rows 0..7 are
// c0, c1, rows 8..15 c2, c3; one element per register.
Slot SlotC(int row, int col) { return {4 * (row % 8) + col / 2, (row < 8 ? 0 : 2) + col % 2, 0}; }
// ldmatrix .x4: element (row, col) of 8x8 matrix m (as stored, rows at the supplied addresses).
// Plain: row r goes to the four lanes 4r .. 4r + 3, two adjacent columns each, register m.
// .trans: the matrix is read column-major, so stored column c plays the part of row c.
Slot SlotLdm(int m, int row, int col, bool trans) {
  if (trans) return {4 * col + row / 2, m, row % 2};
  return {4 * row + col / 2, m, col % 2};
}

TEST(MmaLayoutTable, MatchesTheIsaFormulas) {
  // The ISA's per-lane formulas (groupID = laneid >> 2, threadID_in_group = laneid % 4), as
  // printed under each figure, for element i of each lane.
  for (int lane = 0; lane < 32; lane++) {
    const int groupID = lane >> 2, threadID_in_group = lane % 4;
    for (int i = 0; i < 8; i++) {
      const int row = (i < 2 || (4 <= i && i < 6)) ? groupID : groupID + 8;
      const int col = i < 4 ? threadID_in_group * 2 + (i & 0x1) : threadID_in_group * 2 + (i & 0x1) + 8;
      EXPECT_EQ(SlotA(row, col), (Slot{lane, i / 2, i % 2})) << "a" << i << " of lane " << lane;
    }
    for (int i = 0; i < 4; i++) {
      const int row = i < 2 ? threadID_in_group * 2 + (i & 0x1) : threadID_in_group * 2 + (i & 0x1) + 8;
      const int col = groupID;
      EXPECT_EQ(SlotB(row, col), (Slot{lane, i / 2, i % 2})) << "b" << i << " of lane " << lane;
    }
    for (int i = 0; i < 4; i++) {
      const int row = i < 2 ? groupID : groupID + 8;
      const int col = threadID_in_group * 2 + (i & 0x1);
      EXPECT_EQ(SlotC(row, col), (Slot{lane, i, 0})) << "c" << i << " of lane " << lane;
    }
  }
  // Each table is a bijection onto the warp's registers: no two elements share a slot.
  auto bijective = [](int rows, int cols, int regs, int halves, auto slot) {
    std::vector<int> seen(32 * regs * halves, 0);
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) {
        const Slot s = slot(r, c);
        seen.at((s.lane * regs + s.reg) * halves + s.half)++;
      }
    return std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; });
  };
  EXPECT_TRUE(bijective(16, 16, 4, 2, SlotA));
  EXPECT_TRUE(bijective(16, 8, 2, 2, SlotB));
  EXPECT_TRUE(bijective(16, 8, 4, 1, SlotC));
  for (bool trans : {false, true})
    EXPECT_TRUE(bijective(32, 8, 4, 2, [&](int r, int c) { return SlotLdm(r / 8, r % 8, c, trans); }));
}

// ---------------------------------------------------------------------------------------------
// Kernels: one warp; registers in and out as [lane][reg].

__global__ void mma_kernel(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  const int lane = threadIdx.x;
  float dr[4];
  cuda::mma_bf16_16816(dr, a + 4 * lane, b + 2 * lane, c + 4 * lane);
  for (int i = 0; i < 4; i++) d[4 * lane + i] = dr[i];
}

// Shared tile of kTileRows x kTileLd bf16 bits, copied from `tile`.
constexpr int kTileRows = 32, kTileLd = 40;

enum Op { kLdm, kLdmTrans, kLoadA, kLoadBnk, kLoadBkn, kAccToA };

// kLdm / kLdmTrans: lane l gives the address of tile row rows[l] (column 0). kLoadA, kLoadBnk,
// kLoadBkn: the loader at (p, q) = (r0, c0), (n0, k0), (k0, n0). kAccToA: lo, hi from acc.
__global__ void load_kernel(uint32_t* out, const uint16_t* tile, const int* rows, const float* acc, int op, int p,
                            int q) {
  SHARDGPT_SHARED(__align__(16) uint16_t, s, [kTileRows * kTileLd]);
  const int lane = threadIdx.x;
  for (int i = lane; i < kTileRows * kTileLd; i += 32) s[i] = tile[i];
  __syncthreads();
  uint32_t r[4];
  uint32_t b[2][2];
  switch (op) {
    case kLdm: cuda::ldmatrix_x4<false>(r, s + rows[lane] * kTileLd); break;
    case kLdmTrans: cuda::ldmatrix_x4<true>(r, s + rows[lane] * kTileLd); break;
    case kLoadA: cuda::load_a(r, s, kTileLd, p, q); break;
    case kLoadBnk:
    case kLoadBkn:
      if (op == kLoadBnk) cuda::load_b_nk_x2(b, s, kTileLd, p, q);
      else cuda::load_b_kn_x2(b, s, kTileLd, p, q);
      r[0] = b[0][0], r[1] = b[0][1], r[2] = b[1][0], r[3] = b[1][1];
      break;
    default: cuda::acc_to_a(r, acc + 8 * lane, acc + 8 * lane + 4); break;
  }
  for (int i = 0; i < 4; i++) out[4 * lane + i] = r[i];
}

template <typename T>
T* Upload(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <typename T>
std::vector<T> Download(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// The 16-bit half `s` of registers laid out [lane][regs].
uint16_t HalfAt(const std::vector<uint32_t>& regs, int nregs, const Slot& s) {
  const uint32_t r = regs.at(s.lane * nregs + s.reg);
  return static_cast<uint16_t>(s.half ? r >> 16 : r & 0xffffu);
}
void SetHalf(std::vector<uint32_t>* regs, int nregs, const Slot& s, uint16_t v) {
  uint32_t& r = regs->at(s.lane * nregs + s.reg);
  r = s.half ? (r & 0xffffu) | (uint32_t{v} << 16) : (r & 0xffff0000u) | v;
}

std::vector<int> Shuffled(int n, int first, uint32_t seed) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), first);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

// ---------------------------------------------------------------------------------------------
// mma.sync: D[r][n] = C[r][n] + sum_k A[r][k] B[k][n] for every element, with A, B, C placed by
// the table and D read by it. A is a permutation of 1..256, B of -64..-1, 1..64, C of
// 0.5 + 0..127 (all exact in bf16 / fp32, and every sum exact in fp32 in any order), so any
// element read from the wrong place changes the result.
TEST(MmaLayoutEmulation, MmaComputesTheProductOfTheTablesOperands) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<int> A = Shuffled(256, 1, seed), B = Shuffled(128, -64, seed + 10);
    for (int& b : B) b += b >= 0;  // -64..63 -> -64..-1, 1..64
    const std::vector<int> Cp = Shuffled(128, 0, seed + 20);
    std::vector<uint32_t> ra(32 * 4, 0), rb(32 * 2, 0);
    std::vector<float> rc(32 * 4, 0.0f);
    for (int r = 0; r < 16; r++)
      for (int k = 0; k < 16; k++) SetHalf(&ra, 4, SlotA(r, k), FloatToBf16((float)A[r * 16 + k]));
    for (int k = 0; k < 16; k++)
      for (int n = 0; n < 8; n++) SetHalf(&rb, 2, SlotB(k, n), FloatToBf16((float)B[k * 8 + n]));
    for (int r = 0; r < 16; r++)
      for (int n = 0; n < 8; n++) {
        const Slot s = SlotC(r, n);
        rc.at(s.lane * 4 + s.reg) = 0.5f + Cp[r * 8 + n];
      }
    uint32_t *da = Upload(ra), *db = Upload(rb);
    float *dc = Upload(rc), *dd = nullptr;
    ASSERT_EQ(cudaMalloc(&dd, 32 * 4 * sizeof(float)), cudaSuccess);
    SHARDGPT_LAUNCH(mma_kernel, 1, 32, 0, nullptr)(dd, da, db, dc);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<float> rd = Download(dd, 32 * 4);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
    for (int r = 0; r < 16; r++)
      for (int n = 0; n < 8; n++) {
        double want = 0.5 + Cp[r * 8 + n];
        for (int k = 0; k < 16; k++) want += (double)A[r * 16 + k] * B[k * 8 + n];
        const Slot s = SlotC(r, n);
        EXPECT_EQ((double)rd.at(s.lane * 4 + s.reg), want)
            << "seed " << seed << ": D[" << r << "][" << n << "] at " << s;
      }
  }
}

// A shared tile whose every element is distinct (its index + 1, as raw 16-bit bits).
std::vector<uint16_t> DistinctTile() {
  std::vector<uint16_t> t(kTileRows * kTileLd);
  for (size_t i = 0; i < t.size(); i++) t[i] = static_cast<uint16_t>(i + 1);
  return t;
}

std::vector<uint32_t> RunLoad(Op op, const std::vector<uint16_t>& tile, const std::vector<int>& rows,
                              const std::vector<float>& acc, int p, int q) {
  uint16_t* dt = Upload(tile);
  int* dr = Upload(rows);
  float* da = Upload(acc);
  uint32_t* dout = nullptr;
  EXPECT_EQ(cudaMalloc(&dout, 32 * 4 * sizeof(uint32_t)), cudaSuccess);
  SHARDGPT_LAUNCH(load_kernel, 1, 32, 0, nullptr)(dout, dt, dr, da, static_cast<int>(op), p, q);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<uint32_t> out = Download(dout, 32 * 4);
  cudaFree(dt), cudaFree(dr), cudaFree(da), cudaFree(dout);
  return out;
}

// ldmatrix .x4 with and without .trans: lane 8m + j gives the address of row j of matrix m,
// the 32 rows taken from the tile in a shuffled order (so the result depends on each lane's own
// address); every element of the four matrices must land where the table says.
TEST(MmaLayoutEmulation, LdmatrixX4PlacesEveryElementAsTheTableSays) {
  const std::vector<uint16_t> tile = DistinctTile();
  const std::vector<int> rows = Shuffled(32, 0, 7);
  for (bool trans : {false, true}) {
    const auto out = RunLoad(trans ? kLdmTrans : kLdm, tile, rows, std::vector<float>(1), 0, 0);
    for (int m = 0; m < 4; m++)
      for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) {
          const Slot s = SlotLdm(m, r, c, trans);
          EXPECT_EQ(HalfAt(out, 4, s), tile[rows[8 * m + r] * kTileLd + c])
              << (trans ? ".trans" : "plain") << ": matrix " << m << " (" << r << ", " << c << ") at " << s;
        }
  }
}

// The kernel's loaders (mma.cuh: load_a, load_b_nk_x2, load_b_kn_x2, acc_to_a), at offsets
// inside a larger tile: every element of the operands they promise must sit where the table
// puts that operand element.
TEST(MmaLayoutEmulation, KernelLoadersPlaceEveryElementAsTheTableSays) {
  const std::vector<uint16_t> tile = DistinctTile();
  const std::vector<int> rows(32, 0);
  const std::vector<float> none(1);
  {  // A[r][c] = s[(r0 + r) * ld + c0 + c]
    const int r0 = 8, c0 = 16;
    const auto out = RunLoad(kLoadA, tile, rows, none, r0, c0);
    for (int r = 0; r < 16; r++)
      for (int c = 0; c < 16; c++)
        EXPECT_EQ(HalfAt(out, 4, SlotA(r, c)), tile[(r0 + r) * kTileLd + c0 + c])
            << "load_a: A[" << r << "][" << c << "]";
  }
  {  // n-tile j: B_j[k][n] = s[(n0 + 8 j + n) * ld + k0 + k]; b[j][reg] is out register 2 j + reg
    const int n0 = 16, k0 = 8;
    const auto out = RunLoad(kLoadBnk, tile, rows, none, n0, k0);
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) {
          Slot s = SlotB(k, n);
          s.reg += 2 * j;
          EXPECT_EQ(HalfAt(out, 4, s), tile[(n0 + 8 * j + n) * kTileLd + k0 + k])
              << "load_b_nk_x2: tile " << j << " B[" << k << "][" << n << "]";
        }
  }
  {  // n-tile j: B_j[k][n] = s[(k0 + k) * ld + n0 + 8 j + n]
    const int k0 = 8, n0 = 24;
    const auto out = RunLoad(kLoadBkn, tile, rows, none, k0, n0);
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) {
          Slot s = SlotB(k, n);
          s.reg += 2 * j;
          EXPECT_EQ(HalfAt(out, 4, s), tile[(k0 + k) * kTileLd + n0 + 8 * j + n])
              << "load_b_kn_x2: tile " << j << " B[" << k << "][" << n << "]";
        }
  }
  {  // acc_to_a: the C tiles of columns 0..7 (lo) and 8..15 (hi) as one A: A[r][c] = C_{c/8}[r][c%8]
    std::vector<float> acc(32 * 8);  // [lane][lo 0..3, hi 0..3]
    auto value = [](int j, int r, int n) { return (float)(1 + 128 * j + 8 * r + n); };  // exact in bf16
    for (int j = 0; j < 2; j++)
      for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
          const Slot s = SlotC(r, n);
          acc[s.lane * 8 + 4 * j + s.reg] = value(j, r, n);
        }
    const auto out = RunLoad(kAccToA, tile, rows, acc, 0, 0);
    for (int r = 0; r < 16; r++)
      for (int c = 0; c < 16; c++)
        EXPECT_EQ(Bf16ToFloat(HalfAt(out, 4, SlotA(r, c))), value(c / 8, r, c % 8))
            << "acc_to_a: A[" << r << "][" << c << "]";
  }
}

}  // namespace
}  // namespace shardgpt
