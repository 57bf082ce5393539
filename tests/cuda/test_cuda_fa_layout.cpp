// The index arithmetic of the tensor-core prefill attention (backend/cuda/attention_prefill.cuh, used by
// attention_prefill.cu), on the host, no GPU: runs in CI. It emulates one warp of the kernel with the
// PTX ISA's definitions of ldmatrix (.x4, plain and .trans) and of the mma.m16n8k16 fragments — written
// out here from the ISA tables, independently of the header — and checks that the kernel's choices
// (ldmatrix row addresses for K and V, Q fragment loading, P packing from the score registers, output
// columns) compose into exactly S = Q·Kᵀ and O = P·V, that the ldmatrix row starts are bank-conflict-
// free with the padded pitch, that the block tiling covers every (batch row, head) pair once for every
// GQA ratio, and that the split-K plan covers the key range. What it cannot check: the hardware itself
// (the device tests in test_cuda_attention_prefill.cpp do).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/attention_prefill.cuh"

namespace pg {
namespace {

namespace fa = cuda::fa;

// ---- the PTX definitions (ISA: "Matrix Fragments for mma.m16n8k16 with floating point type", ldmatrix) ----
// A (16×16 .f16, row): lane l = 4·groupID + tid; a_i for i = 0..7 (register i/2, half i%2):
//   row = groupID for a0,a1,a4,a5, groupID + 8 for a2,a3,a6,a7; col = 2·tid + (i & 1) for i < 4, + 8 for i ≥ 4.
int ptx_a_row(int lane, int i) { return (lane >> 2) + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0); }
int ptx_a_col(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 4 ? 8 : 0); }
// B (16×8 .f16, col): b_i, i = 0..3: row (k) = 2·tid + (i & 1) for i < 2, + 8 for i ≥ 2; col (n) = groupID.
int ptx_b_k(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 2 ? 8 : 0); }
int ptx_b_n(int lane) { return lane >> 2; }
// C/D (16×8 .f32): c_i, i = 0..3: row = groupID for c0,c1, groupID + 8 for c2,c3; col = 2·tid + (i & 1).
int ptx_c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
int ptx_c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// A warp register: two 16-bit values (stored as float here: the test is about indices, not rounding).
struct Reg {
  float h[2] = {0, 0};
};

// ldmatrix.x4 (.trans when trans): lane 8i + j supplies the address of row j of matrix i. Lane l gets in
// register i: plain — row l/4, elements 2(l%4), 2(l%4)+1 of matrix i; .trans — element l/4 of rows
// 2(l%4) and 2(l%4)+1. smem: 16-bit elements; addr[lane] = element offset of that lane's row start.
void ldmatrix_x4(const std::vector<float>& smem, const int (&addr)[32], bool trans, Reg (&out)[32][4]) {
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) {
        const int row = trans ? 2 * (l & 3) + h : l >> 2;
        const int col = trans ? l >> 2 : 2 * (l & 3) + h;
        out[l][i].h[h] = smem[static_cast<size_t>(addr[8 * i + row] + col)];
      }
}

// D (16×8) += A (16×16) · B (16×8) from per-lane fragments, as the hardware assembles them.
void mma(float (&c)[32][4], const Reg (&a)[32][4], const Reg (&b)[32][2]) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 8; ++i) A[ptx_a_row(l, i)][ptx_a_col(l, i)] = a[l][i / 2].h[i % 2];
    for (int i = 0; i < 4; ++i) B[ptx_b_k(l, i)][ptx_b_n(l)] = b[l][i / 2].h[i % 2];
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      float s = 0;
      for (int k = 0; k < 16; ++k) s += A[ptx_c_row(l, i)][k] * B[k][ptx_c_col(l, i)];
      c[l][i] += s;
    }
}

TEST(CudaFaLayout, HelpersAgreeWithThePtxFragmentTables) {
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        EXPECT_EQ(fa::a_row(l, r), ptx_a_row(l, 2 * r + h));
        EXPECT_EQ(fa::a_col(l, r, h), ptx_a_col(l, 2 * r + h));
      }
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h) EXPECT_EQ(fa::b_k(l, r, h), ptx_b_k(l, 2 * r + h));
    EXPECT_EQ(fa::b_n(l), ptx_b_n(l));
    for (int e = 0; e < 4; ++e) {
      EXPECT_EQ(fa::c_row(l, e), ptx_c_row(l, e));
      EXPECT_EQ(fa::c_col(l, e), ptx_c_col(l, e));
    }
  }
}

// One warp's tile as the kernel computes it: S = Q·Kᵀ over a BN-key tile, then O = P·V with P taken from
// the score registers (here P = S itself, so that the check is exact and index errors cannot hide).
template <int D, int BN>
void check_warp_tile() {
  SCOPED_TRACE("D=" + std::to_string(D) + " BN=" + std::to_string(BN));
  constexpr int LD = fa::tile_pitch(D), KS = D / 16, NT = BN / 8, DT = D / 8;
  std::mt19937 rng(D + BN);
  std::uniform_int_distribution<int> u(-4, 4);  // small integers: every product and sum exact in float
  std::vector<float> q(16 * D), k(BN * D), v(BN * D);
  for (auto& x : q) x = static_cast<float>(u(rng));
  for (auto& x : k) x = static_cast<float>(u(rng));
  for (auto& x : v) x = static_cast<float>(u(rng));
  std::vector<float> ks(static_cast<size_t>(BN * LD), NAN), vs(static_cast<size_t>(BN * LD), NAN);  // padding must never be read
  for (int key = 0; key < BN; ++key)
    for (int d = 0; d < D; ++d) ks[static_cast<size_t>(key * LD + d)] = k[key * D + d], vs[static_cast<size_t>(key * LD + d)] = v[key * D + d];

  // Q fragments as the kernel loads them: register r of k-step ks holds row a_row(lane, r) (the lane's C
  // row g or g+8 by r & 1), columns 16ks + a_col(lane, r, h).
  Reg qf[KS][32][4];
  for (int s = 0; s < KS; ++s)
    for (int l = 0; l < 32; ++l)
      for (int r = 0; r < 4; ++r) {
        const int row = fa::c_row(l, 2 * (r & 1));  // the kernel's choice of row for register r
        ASSERT_EQ(row, fa::a_row(l, r));
        for (int h = 0; h < 2; ++h) qf[s][l][r].h[h] = q[row * D + s * 16 + fa::a_col(l, r, h)];
      }
  // S tiles.
  float sc[NT][32][4] = {};
  for (int s = 0; s < KS; ++s)
    for (int nj = 0; nj < NT / 2; ++nj) {
      int addr[32];
      for (int l = 0; l < 32; ++l) addr[l] = (nj * 16 + fa::k_ld_key(l)) * LD + s * 16 + fa::k_ld_dim(l);
      Reg b4[32][4];
      ldmatrix_x4(ks, addr, false, b4);
      Reg b01[32][2], b23[32][2];
      for (int l = 0; l < 32; ++l) b01[l][0] = b4[l][0], b01[l][1] = b4[l][1], b23[l][0] = b4[l][2], b23[l][1] = b4[l][3];
      mma(sc[2 * nj], qf[s], b01);
      mma(sc[2 * nj + 1], qf[s], b23);
    }
  for (int j = 0; j < NT; ++j)
    for (int l = 0; l < 32; ++l)
      for (int e = 0; e < 4; ++e) {
        const int row = fa::c_row(l, e), key = 8 * j + fa::c_col(l, e);
        float ref = 0;
        for (int d = 0; d < D; ++d) ref += q[row * D + d] * k[key * D + d];
        ASSERT_EQ(sc[j][l][e], ref) << "S[" << row << "][" << key << "]";
      }
  // O = P·V with P = S (the kernel's P registers come from the score registers by p_tile / p_elem).
  float o[DT][32][4] = {};
  for (int kk = 0; kk < BN / 16; ++kk) {
    Reg pa[32][4];
    for (int l = 0; l < 32; ++l)
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) pa[l][r].h[h] = sc[fa::p_tile(kk, r)][l][fa::p_elem(r, h)];
    for (int dj = 0; dj < D / 16; ++dj) {
      int addr[32];
      for (int l = 0; l < 32; ++l) addr[l] = (kk * 16 + fa::v_ld_key(l)) * LD + dj * 16 + fa::v_ld_dim(l);
      Reg b4[32][4];
      ldmatrix_x4(vs, addr, true, b4);
      Reg b01[32][2], b23[32][2];
      for (int l = 0; l < 32; ++l) b01[l][0] = b4[l][0], b01[l][1] = b4[l][1], b23[l][0] = b4[l][2], b23[l][1] = b4[l][3];
      mma(o[2 * dj], pa, b01);
      mma(o[2 * dj + 1], pa, b23);
    }
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 2; ++i)
      for (int d = 0; d < DT; ++d)
        for (int h = 0; h < 2; ++h) {
          // The kernel writes o[d][2i + h] to row c_row(lane, 2i), column 8d + c_col(lane, h).
          const int row = fa::c_row(l, 2 * i), col = 8 * d + fa::c_col(l, h);
          double ref = 0;
          for (int key = 0; key < BN; ++key) {
            double s = 0;
            for (int dd = 0; dd < D; ++dd) s += static_cast<double>(q[row * D + dd]) * k[key * D + dd];
            ref += s * v[key * D + col];
          }
          ASSERT_EQ(static_cast<double>(o[d][l][2 * i + h]), ref) << "O[" << row << "][" << col << "]";
        }
  // The l sum of the kernel adds P register r's two halves to row r & 1 (g or g+8): must be a_row's row.
  for (int l = 0; l < 32; ++l)
    for (int r = 0; r < 4; ++r) EXPECT_EQ(fa::a_row(l, r), fa::c_row(l, 2 * (r & 1)));
}

TEST(CudaFaLayout, WarpTileComputesQKtAndPV) {
  check_warp_tile<64, fa::keys_per_tile(64)>();
  check_warp_tile<128, fa::keys_per_tile(128)>();
  check_warp_tile<256, fa::keys_per_tile(256)>();
}

// ldmatrix reads its 8 row starts of a phase (lanes 8i..8i+7) in one shared-memory wavefront only when
// the 16-byte rows fall in distinct groups of 4 banks.
TEST(CudaFaLayout, LdmatrixRowsAreConflictFree) {
  for (int D : {64, 128, 256}) {
    const int LD = fa::tile_pitch(D);
    EXPECT_EQ(LD * 2 % 16, 0) << "cp.async / ldmatrix need 16-byte aligned rows";
    for (int which = 0; which < 2; ++which)
      for (int i = 0; i < 4; ++i) {
        std::set<int> groups;
        for (int j = 0; j < 8; ++j) {
          const int l = 8 * i + j;
          const int key = which ? fa::v_ld_key(l) : fa::k_ld_key(l), dim = which ? fa::v_ld_dim(l) : fa::k_ld_dim(l);
          groups.insert(((key * LD + dim) * 2 / 16) % 8);  // 16-byte unit within a 128-byte bank line
        }
        EXPECT_EQ(groups.size(), 8u) << "D=" << D << (which ? " V" : " K") << " matrix " << i;
      }
    EXPECT_EQ(fa::smem_bytes(D), 2 * 2 * fa::keys_per_tile(D) * LD * 2);
    EXPECT_LE(fa::smem_bytes(D) + 3 * fa::kTileM * 4, 99 * 1024) << "must fit sm_86/89/120's 99 KB per block";
  }
}

// Every (batch row, head) pair of a batch is one query row of exactly one block, for every GQA ratio.
TEST(CudaFaLayout, BlockTilingCoversEveryPairOnce) {
  for (int group = 1; group <= fa::kMaxGroup; ++group)
    for (int n : {1, 2, 7, 63, 64, 65, 300}) {
      const int br = fa::rows_per_block(group);
      ASSERT_GE(br, 1);
      ASSERT_LE(br * group, fa::kTileM);
      std::vector<int> seen(static_cast<size_t>(n * group), 0);
      const int tiles = (n + br - 1) / br;
      for (int t = 0; t < tiles; ++t) {
        const int r0 = t * br, nr = std::min(br, n - r0);
        for (int w = 0; w < fa::kWarps; ++w)
          for (int l = 0; l < 32; ++l)
            for (int i = 0; i < 2; ++i) {
              const int m = w * fa::kRowsPerWarp + fa::c_row(l, 2 * i);
              int rl = 0, g = 0;
              fa::pair_of(m, group, rl, g);
              if (!(m < br * group && rl < nr)) continue;  // the kernel's q_ok
              ASSERT_LT(g, group);
              if ((l & 3) == 0) ++seen[static_cast<size_t>((r0 + rl) * group + g)];  // a quad shares a row
            }
      }
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "group " << group << " n " << n << " pair " << i;
    }
}

TEST(CudaFaLayout, RowBoundsAndSplitPlan) {
  int b = 0, e = 0;
  fa::row_bounds(99, 0, b, e);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 100);
  fa::row_bounds(99, 37, b, e);  // the CPU's begin = max(0, pos + 1 − window)
  EXPECT_EQ(b, 63);
  EXPECT_EQ(e, 100);
  fa::row_bounds(5, 37, b, e);
  EXPECT_EQ(b, 0);
  // Chunk floors: the default 64 keys and a decode floor of 256 (CudaOptions::fa_decode_min_split_keys);
  // 100 rounds up to 128.
  for (int mk : {64, 256, 100})
  for (int base : {1, 7, 100, 1000})
    for (int cap : {64, 4096, 65536}) {
      const fa::SplitPlan s = fa::split_plan(base, cap, 132, 2, mk);
      ASSERT_EQ(s.min_keys, mk == 100 ? 128 : mk);
      ASSERT_GE(s.n_splits, 1);
      ASSERT_GE(s.target, 1);
      if (base >= 264) {
        ASSERT_EQ(s.n_splits, 1);
      }
      // The target depends on the grid only: an eager launch of any length shares it with the bucket's.
      ASSERT_EQ(fa::split_plan(base, 1, 132, 2, mk).target, s.target);
      ASSERT_LE(s.n_splits, (cap + s.min_keys - 1) / s.min_keys) << "no more splits than floors in the bucket";
      // Every actual range inside the bucket: the splits cover it once, in order, each chunk a multiple
      // of 64 keys (whole tiles of 32 or 64), and the grid's splits are enough.
      for (int lo : {0, 5, 100})
        for (int len : {1, 63, 64, 65, 300, 3300, 40000}) {
          if (lo + len > cap) continue;
          int next = lo;
          for (int z = 0; z < s.n_splits; ++z) {
            int l = lo, h = lo + len;
            fa::split_range(l, h, z, s.n_splits, s.target, s.min_keys);
            if (l >= h) continue;
            ASSERT_EQ(l, next) << "splits in order, no gap or overlap";
            if (s.n_splits > 1 && h < lo + len) {
              ASSERT_EQ((h - l) % s.min_keys, 0);
            }
            next = h;
          }
          ASSERT_EQ(next, lo + len) << "base " << base << " cap " << cap << " len " << len << " floor " << mk << ": splits must cover the keys";
        }
    }
  // Tree masks: one past the highest set bit; visibility of draft positions end + j.
  const uint32_t m[4] = {0x5u, 0u, 0x80000000u, 0u};
  EXPECT_EQ(fa::tree_hi(100, m, 4), 100 + 95 + 1);
  const uint32_t none[4] = {0u, 0u, 0u, 0u};
  EXPECT_EQ(fa::tree_hi(100, none, 4), 100);
  EXPECT_TRUE(fa::tree_visible(100, 100, m, 4));
  EXPECT_FALSE(fa::tree_visible(101, 100, m, 4));
  EXPECT_TRUE(fa::tree_visible(102, 100, m, 4));
  EXPECT_TRUE(fa::tree_visible(195, 100, m, 4));
  EXPECT_FALSE(fa::tree_visible(196, 100, m, 4));
  EXPECT_FALSE(fa::tree_visible(99, 100, m, 4));
}

}  // namespace
}  // namespace pg
