// The CPU reference of the speculative-verification ops (backend.h): topk_rows, kv_copy and tree-masked
// attention. Each is checked against a naive computation written from the contract's words, not from
// the kernel: attention against a dense double-precision softmax over an explicit ancestor set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "core/fp16.h"
#include "core/kv_quant.h"

namespace pg {
namespace {

const float kNan = std::numeric_limits<float>::quiet_NaN();

// Reference top-k: stable sort of the non-NaN columns by value, descending (ties keep the lower column).
void naive_topk(const std::vector<float>& row, int k, std::vector<int32_t>& ids, std::vector<double>& lp) {
  std::vector<int32_t> cols;
  for (size_t i = 0; i < row.size(); ++i)
    if (!std::isnan(row[i])) cols.push_back(static_cast<int32_t>(i));
  std::stable_sort(cols.begin(), cols.end(), [&](int32_t a, int32_t b) { return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)]; });
  double mx = -INFINITY;
  for (int32_t c : cols) mx = std::max(mx, static_cast<double>(row[static_cast<size_t>(c)]));
  double sum = 0;
  for (int32_t c : cols) sum += std::exp(static_cast<double>(row[static_cast<size_t>(c)]) - mx);
  ids.assign(cols.begin(), cols.begin() + k);
  lp.clear();
  for (int32_t c : ids) lp.push_back(static_cast<double>(row[static_cast<size_t>(c)]) - mx - std::log(sum));
}

void check_topk(CpuBackend& be, const std::vector<std::vector<float>>& rows, int k) {
  const int64_t d = static_cast<int64_t>(rows[0].size()), n = static_cast<int64_t>(rows.size());
  Tensor x = be.alloc(DType::F32, d, n);
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), x.as<float>() + d * static_cast<int64_t>(r));
  Tensor ids = be.alloc(DType::I32, k, n), lp = be.alloc(DType::F32, k, n);  // (n, k) each
  be.topk_rows(x, k, ids, lp);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int32_t> want;
    std::vector<double> want_lp;
    naive_topk(rows[r], k, want, want_lp);
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(ids.as<int32_t>()[static_cast<int64_t>(r) * k + j], want[static_cast<size_t>(j)]) << "row " << r << " rank " << j;
      EXPECT_NEAR(lp.as<float>()[static_cast<int64_t>(r) * k + j], want_lp[static_cast<size_t>(j)], 2e-6 * std::max(1.0, std::fabs(want_lp[static_cast<size_t>(j)])))
          << "row " << r << " rank " << j;
    }
  }
  be.free(x);
  be.free(ids);
  be.free(lp);
}

TEST(TopkRows, OrderTiesNanAndLogprobs) {
  CpuBackend be(CpuOptions{});
  const std::vector<std::vector<float>> rows = {
      {1, 3, 3, 2, -1, 3},       // three-way tie at the top → columns 1, 2, 5 in that order
      {kNan, 5, 7, 1, 0, kNan},  // NaNs are never chosen, not even in column 0
      {0, kNan, -2, 4, 4, -9},
      {-1, -2, -3, -4, -5, 9},
  };
  for (int k : {1, 2, 3, 4}) check_topk(be, rows, k);
  // The log-probabilities are a log-softmax over the whole row: k = cols gives probabilities summing to 1.
  check_topk(be, {{0.5f, -1.0f, 2.0f, 0.0f}}, 4);
}

TEST(TopkRows, KOneAndSixtyFourOnAVocabularyRow) {
  CpuBackend be(CpuOptions{});
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<std::vector<float>> rows(5, std::vector<float>(1000));
  for (auto& r : rows)
    for (auto& v : r) v = nd(rng);
  // Many exact ties (quantised values) in one row, and a NaN sprinkle in another.
  for (auto& v : rows[1]) v = std::round(v);
  for (size_t i = 0; i < rows[2].size(); i += 7) rows[2][i] = kNan;
  for (int k : {1, 64}) check_topk(be, rows, k);
  // k = 1 is the argmax (when no NaN sits in column 0).
  Tensor x = be.alloc(DType::F32, 1000, 5), am = be.alloc(DType::I32, 5, 1), ids = be.alloc(DType::I32, 1, 5), lp = be.alloc(DType::F32, 1, 5);
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), x.as<float>() + 1000 * static_cast<int64_t>(r));
  be.argmax_rows(x, am);
  be.topk_rows(x, 1, ids, lp);
  for (int r = 0; r < 5; ++r)
    if (r != 2) {
      EXPECT_EQ(ids.as<int32_t>()[r], am.as<int32_t>()[r]) << "row " << r;
    }
  for (Tensor* t : {&x, &am, &ids, &lp}) be.free(*t);
}

TEST(TopkRows, BadArgumentsAreErrors) {
  CpuBackend be(CpuOptions{});
  Tensor x = be.alloc(DType::F32, 10, 2), ids = be.alloc(DType::I32, 65, 2), lp = be.alloc(DType::F32, 65, 2);
  EXPECT_THROW(be.topk_rows(x, 0, ids, lp), Error);
  EXPECT_THROW(be.topk_rows(x, 11, ids, lp), Error);  // more than the columns
  Tensor big = be.alloc(DType::F32, 100, 2);
  EXPECT_THROW(be.topk_rows(big, 65, ids, lp), Error);  // above the contract's 64
  // A row with no number at all (every value NaN) gives valid column ids, never garbage.
  std::fill(x.as<float>(), x.as<float>() + 20, kNan);
  std::fill(ids.as<int32_t>(), ids.as<int32_t>() + 6, 1 << 30);  // garbage the op must overwrite
  be.topk_rows(x, 3, ids, lp);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(ids.as<int32_t>()[i] >= 0 && ids.as<int32_t>()[i] < 10);
  for (Tensor* t : {&x, &ids, &lp, &big}) be.free(*t);
}

// kv_copy: the result is that of the copies run one after another, for K and V, F32 and F16.
TEST(KvCopy, SequentialSemanticsWithOverlappingChains) {
  CpuBackend be(CpuOptions{});
  for (DType t : {DType::F32, DType::F16}) {
    const int cells = 8, w = 6;
    KvLayer kv{be.alloc(t, w, cells), be.alloc(t, w, cells)};
    auto fill = [&] {
      for (int c = 0; c < cells; ++c)
        for (int i = 0; i < w; ++i) {
          const float vk = static_cast<float>(c * 10 + i), vv = -vk;
          if (t == DType::F16) {
            kv.k.as<uint16_t>()[c * w + i] = f32_to_fp16(vk);
            kv.v.as<uint16_t>()[c * w + i] = f32_to_fp16(vv);
          } else {
            kv.k.as<float>()[c * w + i] = vk;
            kv.v.as<float>()[c * w + i] = vv;
          }
        }
    };
    auto cell_id = [&](const Tensor& x, int c) {  // which original cell a row now holds
      const float v = t == DType::F16 ? fp16_to_f32(x.as<uint16_t>()[c * w]) : x.as<float>()[c * w];
      return static_cast<int>(std::lround(std::fabs(v) / 10));
    };
    struct Case {
      std::vector<int32_t> src, dst, want;  // want: original cell held by each cell afterwards
    };
    const std::vector<Case> cases = {
        {{0, 2, 3}, {0, 1, 2}, {0, 2, 3, 3, 4, 5, 6, 7}},  // an accepted path compacted (a source is a later destination)
        {{1, 2}, {2, 3}, {0, 1, 1, 1, 4, 5, 6, 7}},        // a destination is a later source: the copy sees the new row
        {{5, 7, 6}, {1, 3, 4}, {0, 5, 2, 7, 6, 5, 6, 7}},  // scattered, non-monotonic
        {{4}, {4}, {0, 1, 2, 3, 4, 5, 6, 7}},              // self copy
    };
    Tensor src = be.alloc(DType::I32, 4, 1), dst = be.alloc(DType::I32, 4, 1);
    for (const Case& cs : cases) {
      fill();
      const int64_t m = static_cast<int64_t>(cs.src.size());
      std::copy(cs.src.begin(), cs.src.end(), src.as<int32_t>());
      std::copy(cs.dst.begin(), cs.dst.end(), dst.as<int32_t>());
      be.kv_copy(kv, src.reshape_2d(m, 1), dst.reshape_2d(m, 1));
      for (int c = 0; c < cells; ++c) {
        EXPECT_EQ(cell_id(kv.k, c), cs.want[static_cast<size_t>(c)]) << "K cell " << c;
        EXPECT_EQ(cell_id(kv.v, c), cs.want[static_cast<size_t>(c)]) << "V cell " << c;
        // Whole rows move, not only their first element.
        const float last = t == DType::F16 ? fp16_to_f32(kv.k.as<uint16_t>()[c * w + w - 1]) : kv.k.as<float>()[c * w + w - 1];
        EXPECT_EQ(last, static_cast<float>(cs.want[static_cast<size_t>(c)] * 10 + w - 1));
      }
    }
    src.as<int32_t>()[0] = 8;  // past the pool
    dst.as<int32_t>()[0] = 0;
    EXPECT_THROW(be.kv_copy(kv, src.reshape_2d(1, 1), dst.reshape_2d(1, 1)), Error);
    src.as<int32_t>()[0] = -1;
    EXPECT_THROW(be.kv_copy(kv, src.reshape_2d(1, 1), dst.reshape_2d(1, 1)), Error);
    for (Tensor* x : {&kv.k, &kv.v, &src, &dst}) be.free(*x);
  }
}

// ---- tree-masked attention vs a dense reference ----

struct Row {
  int seq;
  int parent;  // index of an earlier tree row of the same sequence, -1 = root; ignored for chain rows
  bool tree;
  int pos;     // RoPE position (filled by the builder)
  int j = -1;  // index among the sequence's tree rows (tree rows only)
};

struct AttnCase {
  int n_head, n_head_kv, hd, window;
  float softcap;
  DType kv_type;
  std::vector<int> seq_len;  // committed tokens per sequence
  std::vector<Row> rows;
  std::optional<DType> kv_type_v = std::nullopt;  // V's type when it differs from K's
};

void run_attention_case(const AttnCase& ac, uint32_t seed) {
  CpuBackend be(CpuOptions{});
  const int n_seq = static_cast<int>(ac.seq_len.size()), block = 4, n = static_cast<int>(ac.rows.size());
  const int max_blocks = 40, n_blocks = n_seq * max_blocks;
  const int64_t kv_w = static_cast<int64_t>(ac.n_head_kv) * ac.hd, q_w = static_cast<int64_t>(ac.n_head) * ac.hd;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  // Non-contiguous block tables: the physical blocks of all sequences are a random permutation.
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  Tensor table = be.alloc(DType::I32, max_blocks, n_seq);  // (n_seq, max_blocks)
  for (int i = 0; i < n_seq * max_blocks; ++i) table.as<int32_t>()[i] = perm[static_cast<size_t>(i)];
  auto cell = [&](int s, int lp) { return table.as<int32_t>()[s * max_blocks + lp / block] * block + lp % block; };
  // The cache in its own types (kv_quantize_row per cell, the way kv_store writes it); the reference reads
  // the decoded values (kv_decode_row), i.e. "dequantize, then F32 attention".
  const DType tk = ac.kv_type, tv = ac.kv_type_v.value_or(ac.kv_type);
  const int64_t n_cells = static_cast<int64_t>(n_blocks) * block;
  KvLayer kv{be.alloc(tk, ac.n_head_kv * kv_head_width(tk, ac.hd), n_cells), be.alloc(tv, ac.n_head_kv * kv_head_width(tv, ac.hd), n_cells),
             ac.n_head_kv, ac.hd, ac.hd};
  std::vector<float> dk(static_cast<size_t>(n_cells * kv_w)), dv(dk.size()), row(static_cast<size_t>(kv_w));  // (n_cells, kv_w)
  for (int64_t c = 0; c < n_cells; ++c)
    for (int which = 0; which < 2; ++which) {
      Tensor& t = which ? kv.v : kv.k;
      for (float& x : row) x = ud(rng);
      kv_quantize_row(t.type, row.data(), ac.n_head_kv, ac.hd, t.as<uint8_t>() + static_cast<size_t>(c) * t.row_bytes());
      kv_decode_row(t.type, t.as<uint8_t>() + static_cast<size_t>(c) * t.row_bytes(), ac.n_head_kv, ac.hd,
                    (which ? dv : dk).data() + c * kv_w);
    }
  auto get = [&](const Tensor& t, int64_t i) { return (&t == &kv.k ? dk : dv)[static_cast<size_t>(i)]; };
  // Rows: positions, tree indices, and the naive visible set in logical positions.
  std::vector<Row> rows = ac.rows;
  std::vector<int> n_tree(static_cast<size_t>(n_seq), 0), chain_next = ac.seq_len;
  std::vector<int> depth(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Row& x = rows[static_cast<size_t>(r)];
    if (x.tree) {
      x.j = n_tree[static_cast<size_t>(x.seq)]++;
      depth[static_cast<size_t>(r)] = x.parent < 0 ? 0 : depth[static_cast<size_t>(x.parent)] + 1;
      x.pos = ac.seq_len[static_cast<size_t>(x.seq)] + depth[static_cast<size_t>(r)];
    } else {
      x.pos = chain_next[static_cast<size_t>(x.seq)]++;
    }
  }
  Tensor pos = be.alloc(DType::I32, n, 1), seq = be.alloc(DType::I32, n, 1), kvl = be.alloc(DType::I32, n, 1);
  Tensor mask = be.alloc(DType::I32, kTreeMaskWords, n);  // (n, kTreeMaskWords)
  int max_kv = 0;
  std::vector<std::vector<int>> visible(static_cast<size_t>(n));  // logical positions, in any order
  for (int r = 0; r < n; ++r) {
    const Row& x = rows[static_cast<size_t>(r)];
    pos.as<int32_t>()[r] = x.pos;
    seq.as<int32_t>()[r] = x.seq;
    const int begin = ac.window > 0 ? std::max(0, x.pos + 1 - ac.window) : 0;
    if (!x.tree) {
      kvl.as<int32_t>()[r] = x.pos + 1;
      for (int p = begin; p <= x.pos; ++p) visible[static_cast<size_t>(r)].push_back(p);
      max_kv = std::max(max_kv, x.pos + 1);
      continue;
    }
    const int L = ac.seq_len[static_cast<size_t>(x.seq)];
    kvl.as<int32_t>()[r] = L;
    for (int p = begin; p < L; ++p) visible[static_cast<size_t>(r)].push_back(p);
    // Ancestors and self, found by walking parents (the dense reference's explicit ancestor mask).
    for (int a = r; a >= 0; a = rows[static_cast<size_t>(a)].parent) {
      const int ja = rows[static_cast<size_t>(a)].j;
      mask.as<uint32_t>()[r * kTreeMaskWords + ja / 32] |= 1u << (ja % 32);
      visible[static_cast<size_t>(r)].push_back(L + ja);
    }
    max_kv = std::max(max_kv, L + x.j + 1);
  }
  Tensor q = be.alloc(DType::F32, q_w, n), out = be.alloc(DType::F32, q_w, n);
  for (int64_t i = 0; i < q.n_elements(); ++i) q.as<float>()[i] = ud(rng);
  AttentionBatch ab;
  ab.n_tokens = n;
  ab.positions = pos;
  ab.seq = seq;
  ab.block_table = table;
  ab.block_size = block;
  ab.max_blocks = max_blocks;
  ab.max_kv_len = max_kv;
  ab.kv_len = kvl;
  ab.tree_mask = mask;
  AttentionParams p;
  p.n_head = ac.n_head;
  p.n_head_kv = ac.n_head_kv;
  p.head_dim = ac.hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(ac.hd));
  p.sliding_window = ac.window;
  p.logit_softcap = ac.softcap;
  be.attention(q, kv, ab, p, out);

  const int group = ac.n_head / ac.n_head_kv;
  double worst = 0;
  for (int r = 0; r < n; ++r) {
    const Row& x = rows[static_cast<size_t>(r)];
    for (int h = 0; h < ac.n_head; ++h) {
      const int hk = h / group;
      const auto& vis = visible[static_cast<size_t>(r)];
      std::vector<double> s(vis.size());
      double mx = -INFINITY;
      for (size_t i = 0; i < vis.size(); ++i) {
        const int64_t c = cell(x.seq, vis[i]);
        double d = 0;
        for (int e = 0; e < ac.hd; ++e) d += static_cast<double>(q.as<float>()[r * q_w + h * ac.hd + e]) * get(kv.k, c * kv_w + hk * ac.hd + e);
        d *= p.scale;
        if (ac.softcap > 0) d = ac.softcap * std::tanh(d / ac.softcap);
        s[i] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (int e = 0; e < ac.hd; ++e) {
        double o = 0;
        for (size_t i = 0; i < vis.size(); ++i) o += s[i] / sum * get(kv.v, cell(x.seq, vis[i]) * kv_w + hk * ac.hd + e);
        const double got = out.as<float>()[r * q_w + h * ac.hd + e];
        worst = std::max(worst, std::fabs(got - o));
        // TQ3_0 rotates q (K) and the output (V) in f32: a few more roundings than the other types.
        const double tol = tk == DType::TQ3_0 || tv == DType::TQ3_0 ? 2e-5 : 1e-5;
        ASSERT_NEAR(got, o, tol) << kv_type_name(tk) << "/" << kv_type_name(tv) << " row " << r << " head " << h << " dim " << e;
      }
    }
  }
  testing::Test::RecordProperty("max_abs_err", std::to_string(worst));
  for (Tensor* t : {&table, &kv.k, &kv.v, &pos, &seq, &kvl, &mask, &q, &out}) be.free(*t);
}

// A random tree over `n_nodes` rows of sequence s (parents drawn among earlier rows of the tree).
std::vector<Row> random_tree(int s, int n_nodes, std::mt19937& rng, int max_depth = 1 << 20) {
  std::vector<Row> rows;
  std::vector<int> depth;
  for (int i = 0; i < n_nodes; ++i) {
    int parent = -1;
    if (i > 0) {
      for (int tries = 0; tries < 8; ++tries) {
        parent = static_cast<int>(rng() % static_cast<uint32_t>(i));
        if (depth[static_cast<size_t>(parent)] + 1 < max_depth) break;
      }
      if (depth[static_cast<size_t>(parent)] + 1 >= max_depth) parent = 0;
    }
    depth.push_back(parent < 0 ? 0 : depth[static_cast<size_t>(parent)] + 1);
    rows.push_back({s, parent, true, 0});
  }
  return rows;
}

// Concatenates row groups, shifting each group's parent indices to batch rows.
std::vector<Row> concat(const std::vector<std::vector<Row>>& groups) {
  std::vector<Row> all;
  for (const auto& g : groups) {
    const int off = static_cast<int>(all.size());
    for (Row r : g) {
      if (r.tree && r.parent >= 0) r.parent += off;
      all.push_back(r);
    }
  }
  return all;
}

TEST(TreeAttention, MatchesDenseAncestorMaskFullCausal) {
  std::mt19937 rng(1);
  for (DType t : {DType::F32, DType::F16}) {
    AttnCase ac{4, 4, 16, 0, 0.0f, t, {13}, random_tree(0, 22, rng)};
    run_attention_case(ac, 11);
  }
}

TEST(TreeAttention, GqaSeveralSequencesAndChainRowsInOneBatch) {
  std::mt19937 rng(2);
  for (DType t : {DType::F32, DType::F16}) {
    // Sequence 0: a tree; 1: chain rows (prefill-like); 2: another tree; 3: a single-node tree (a root only).
    std::vector<Row> chain;
    for (int i = 0; i < 5; ++i) chain.push_back({1, -1, false, 0});
    AttnCase ac{8, 2, 16, 0, 0.0f, t, {9, 30, 1, 17},
                concat({random_tree(0, 10, rng), chain, random_tree(2, 33, rng), random_tree(3, 1, rng)})};
    run_attention_case(ac, 12);
  }
}

TEST(TreeAttention, SlidingWindowAndSoftcap) {
  std::mt19937 rng(3);
  for (DType t : {DType::F32, DType::F16}) {
    // Window 8, committed lengths past it; tree depth stays below the window (the model's guarantee).
    std::vector<Row> chain;
    for (int i = 0; i < 3; ++i) chain.push_back({1, -1, false, 0});
    AttnCase ac{4, 2, 8, 8, 5.0f, t, {25, 12}, concat({random_tree(0, 20, rng, 7), chain})};
    run_attention_case(ac, 13);
  }
}

TEST(TreeAttention, FullTreeOfMaxRowsHeadDimNotMultipleOf8) {
  std::mt19937 rng(4);
  // 128 rows (every mask word used), head size 12 (the scalar path), a deep chain-like tree.
  AttnCase ac{2, 1, 12, 0, 0.0f, DType::F16, {3}, random_tree(0, kMaxTreeRows, rng)};
  run_attention_case(ac, 14);
  AttnCase chainy{2, 2, 16, 0, 0.0f, DType::F32, {0}, {}};
  for (int i = 0; i < 40; ++i) chainy.rows.push_back({0, i - 1, true, 0});  // a chain verified as a tree
  run_attention_case(chainy, 15);
}

// Every KV type pair (all types alike, and mixes) through CpuBackend::attention's typed path: the cache's
// own bytes read through kv_attn equal F32 attention over the dequantized cache, with trees, GQA,
// several sequences, a sliding window and softcap. Head sizes 32 (no padding for the block types, TQ3_0
// padded to 128) and 128.
TEST(TreeAttention, EveryKvTypeMatchesDequantizedReference) {
  std::mt19937 rng(5);
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};
  std::vector<std::pair<DType, DType>> pairs;
  for (DType t : all) pairs.push_back({t, t});
  pairs.push_back({DType::F16, DType::Q8_0});
  pairs.push_back({DType::TQ3_0, DType::F16});
  pairs.push_back({DType::Q4_0, DType::TQ3_0});
  for (auto [k, v] : pairs)
    for (int hd : {32, 128}) {
      std::vector<Row> chain;
      for (int i = 0; i < 3; ++i) chain.push_back({1, -1, false, 0});
      AttnCase ac{4, 2, hd, 8, 5.0f, k, {25, 12}, concat({random_tree(0, 9, rng, 7), chain}), v};
      run_attention_case(ac, 16);
      AttnCase full{6, 2, hd, 0, 0.0f, k, {19}, random_tree(0, 7, rng), v};
      run_attention_case(full, 17);
    }
}

}  // namespace
}  // namespace pg
