// Greedy tokens picked on the backend (ForwardOptions::argmax): the same token as the engine's host
// argmax over the downloaded logits, for every output row, while rows that still want logits get
// exactly the logits of a plain forward. Also Backend::argmax_rows' tie and NaN rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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
