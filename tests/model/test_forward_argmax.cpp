// Greedy tokens picked on the backend (ForwardOptions::argmax): the same token as the engine's host
// argmax over the downloaded logits, for every output row, while rows that still want logits get
// exactly the logits of a plain forward. Also Backend::argmax_rows' tie and NaN rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

TEST(ArgmaxRows, TiesToLowestColumnAndNanRules) {
  CpuBackend be(CpuOptions{});
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {
      {1, 3, 3, 2, -1},          // tie → 1
      {nan, 5, 7, 1, 0},         // NaN in column 0 → 0, as a strict > scan from column 0 gives
      {0, nan, -2, 4, 4},        // NaN elsewhere never wins → 3
      {-inf, -inf, -inf, -inf, -inf},  // all −inf → 0
      {-1, -2, -3, -4, 9},       // last column
  };
  Tensor x = be.alloc(DType::F32, 5, static_cast<int64_t>(rows.size()));
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), x.as<float>() + 5 * r);
  Tensor ids = be.alloc(DType::I32, static_cast<int64_t>(rows.size()), 1);
  be.argmax_rows(x, ids);
  const int32_t want[] = {1, 0, 3, 0, 4};
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(ids.as<int32_t>()[r], want[r]) << "row " << r;
    EXPECT_EQ(ids.as<int32_t>()[r], argmax(rows[r].data(), 5)) << "row " << r << " differs from the engine's argmax";
  }
  be.free(x);
  be.free(ids);
}

// The same rules on rows long enough for the vectorised scan (a vocabulary-sized row and short / odd
// widths around its 8- and 16-column steps): random values with the maximum planted at every position
// class (first column, inside a vector, in the scalar tail), ties, NaN and ±0 around it, against the
// engine's scalar argmax. A wrong tie rule, a NaN that wins or a lost tail fails here.
TEST(ArgmaxRows, LongRowsMatchTheScalarScan) {
  CpuBackend be(CpuOptions{});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0;
  for (const int64_t d : {int64_t{2}, int64_t{9}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{33}, int64_t{1000}, int64_t{151936}}) {
    for (int c = 0; c < 10; ++c) {
      std::vector<float> row(static_cast<size_t>(d));
      for (auto& v : row) v = nd(rng);
      const int64_t at = c == 0 ? 0 : c == 1 ? d - 1 : static_cast<int64_t>(rng() % static_cast<uint32_t>(d));
      switch (c % 5) {
        case 0: row[static_cast<size_t>(at)] = 50.0f; break;  // a clear maximum
        case 1:  // a tie: the same maximum later in the row too
          row[static_cast<size_t>(at)] = 50.0f;
          row[static_cast<size_t>(d - 1)] = 50.0f;
          break;
        case 2:  // NaNs everywhere but the maximum (NaN never wins)
          for (int64_t i = 1; i < d; i += 3) row[static_cast<size_t>(i)] = nan;
          row[static_cast<size_t>(at)] = 60.0f;
          break;
        case 3:  // NaN in column 0: column 0
          row[0] = nan;
          break;
        case 4:  // a maximum of zero with both signs
          for (auto& v : row) v = -std::abs(v) - 1.0f;
          row[static_cast<size_t>(at)] = -0.0f;
          row[static_cast<size_t>((at + 1) % d)] = 0.0f;
          break;
      }
      Tensor x = be.alloc(DType::F32, d, 1);
      std::copy(row.begin(), row.end(), x.as<float>());
      Tensor ids = be.alloc(DType::I32, 1, 1);
      be.argmax_rows(x, ids);
      EXPECT_EQ(ids.as<int32_t>()[0], argmax(row.data(), static_cast<int>(d))) << "width " << d << " case " << c;
      be.free(x);
      be.free(ids);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 80);
}

class ForwardArgmax : public testing::TestWithParam<std::string> {};

TEST_P(ForwardArgmax, MatchesHostArgmaxAndKeepsWantedLogits) {
  CpuBackend be(CpuOptions{});
  auto model = Model::load(test::shared_path("golden/models/" + GetParam() + ".gguf").string(), be);
  const int V = model->config().n_vocab;
  // 24 prompt rows of which 4 want outputs; rows 0 and 2 of those want only the greedy token.
  Batch b;
  const std::vector<int> out_rows = {3, 10, 17, 23};
  for (int p = 0; p < 24; ++p)
    b.add((p * 37 + 11) % V, p, 0, std::find(out_rows.begin(), out_rows.end(), p) != out_rows.end());
  std::vector<float> ref, got;
  {
    auto cache = model->make_cache({1, 64, DType::F16, 16});
    model->forward(b, *cache, ref);
  }
  auto cache = model->make_cache({1, 64, DType::F16, 16});
  std::vector<int32_t> greedy(4, -7);
  const uint8_t only[] = {1, 0, 1, 0};
  ForwardOptions fo;
  fo.argmax = greedy.data();
  fo.argmax_only = only;
  model->forward(b, *cache, got, fo);
  ASSERT_EQ(got.size(), ref.size());
  for (int i = 0; i < 4; ++i) {
    const float* r = ref.data() + static_cast<size_t>(i) * V;
    EXPECT_EQ(greedy[static_cast<size_t>(i)], argmax(r, V)) << "output row " << i;
    if (!only[i]) {
      EXPECT_EQ(0, std::memcmp(r, got.data() + static_cast<size_t>(i) * V, static_cast<size_t>(V) * sizeof(float))) << "output row " << i;
    }
  }
  // Decode steps through the greedy path continue exactly as the logits path does.
  std::vector<int32_t> a_tokens, b_tokens;
  auto c1 = model->make_cache({1, 64, DType::F16, 16});
  auto c2 = model->make_cache({1, 64, DType::F16, 16});
  std::vector<float> l1, l2;
  int32_t t1 = 1, t2 = 1, g = -1;
  const uint8_t one = 1;
  ForwardOptions go;
  go.argmax = &g;
  go.argmax_only = &one;
  for (int p = 0; p < 12; ++p) {
    Batch s1, s2;
    s1.add(t1, p, 0, true);
    s2.add(t2, p, 0, true);
    model->forward(s1, *c1, l1);
    model->forward(s2, *c2, l2, go);
    t1 = argmax(l1.data(), V);
    t2 = g;
    a_tokens.push_back(t1);
    b_tokens.push_back(t2);
  }
  EXPECT_EQ(a_tokens, b_tokens);
}

TEST(ForwardArgmaxErrors, ArgmaxOnlyWithoutArgmaxIsRejected) {
  CpuBackend be(CpuOptions{});
  auto model = Model::load(test::shared_path("golden/models/tiny-llama-f16.gguf").string(), be);
  auto cache = model->make_cache({1, 16, DType::F16, 16});
  Batch b;
  b.add(1, 0, 0, true);
  const uint8_t only = 1;
  ForwardOptions fo;
  fo.argmax_only = &only;
  std::vector<float> l;
  EXPECT_THROW(model->forward(b, *cache, l, fo), Error);
}

INSTANTIATE_TEST_SUITE_P(Golden, ForwardArgmax, testing::Values("tiny-llama-Q4_K_M", "tiny-gemma3-f16", "tiny-qwen35-f16"),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
}  // namespace pg
