#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "engine/sampler.h"

namespace pg {
namespace {

std::vector<float> logits_of(std::initializer_list<float> v) { return std::vector<float>(v); }

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 5);
  auto l = logits_of({1, 3, 3, 2, -1});
  EXPECT_EQ(s.sample(l.data()), 1);
  EXPECT_EQ(argmax(l.data(), 5), 1);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[static_cast<size_t>(i)] = std::sin(static_cast<float>(i)) * 2;
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, 100);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.sample(l.data()));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, FrequenciesFollowSoftmaxAtTemperatureOne) {
  auto l = logits_of({0.0f, 1.0f, 2.0f, -1.0f});
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  p.seed = 7;
  Sampler s(p, 4);
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s.sample(l.data())];
  double z = 0;
  for (float v : l) z += std::exp(v);
  for (int i = 0; i < 4; ++i) {
    const double expect = std::exp(l[static_cast<size_t>(i)]) / z;
    EXPECT_NEAR(counts[i] / static_cast<double>(n), expect, 0.01) << "token " << i;
  }
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  auto l = logits_of({5, 4, 3, 2, 1, 0});
  SamplingParams p;
  p.temperature = 5;  // flatten so that the filters decide
  p.min_p = 0;
  p.top_p = 1;
  p.top_k = 2;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    Sampler s(p, 6);
    EXPECT_LT(s.sample(l.data()), 2);
  }
  p.top_k = 0;
  p.top_p = 0.5f;  // softmax of the raw logits: p0 ≈ 0.63 alone covers 0.5
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    Sampler s(p, 6);
    EXPECT_EQ(s.sample(l.data()), 0);
  }
  p.top_p = 1;
  p.min_p = 0.3f;  // keeps tokens with p ≥ 0.3·p_max: e^-1 = 0.37 passes, e^-2 does not
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    Sampler s(p, 6);
    EXPECT_LT(s.sample(l.data()), 2);
  }
}

TEST(Sampler, LogitBiasAndPenalties) {
  auto l = logits_of({3, 2.9f, 0});
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, -std::numeric_limits<float>::infinity()}};
  Sampler s(p, 3);
  EXPECT_EQ(s.sample(l.data()), 1);
  SamplingParams q;
  q.temperature = 0;
  q.presence_penalty = 0.5f;
  Sampler t(q, 3);
  EXPECT_EQ(t.sample(l.data()), 0);
  t.accept(0);
  EXPECT_EQ(t.sample(l.data()), 1);  // 3 − 0.5 < 2.9
  SamplingParams r;
  r.temperature = 0;
  r.repeat_penalty = 1.1f;
  Sampler u(r, 3);
  u.accept(0);
  EXPECT_EQ(u.sample(l.data()), 1);  // 3/1.1 < 2.9
}

TEST(Sampler, RejectsAbsurdParameters) {
  SamplingParams p;
  p.temperature = std::nanf("");
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.top_p = -1;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.logit_bias = {{10, 1.0f}};
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.repeat_penalty = 0;
  EXPECT_THROW(Sampler(p, 10), Error);
}

TEST(Sampler, LogprobsAreNormalised) {
  auto l = logits_of({1, 2, 3});
  auto top = top_logprobs(l.data(), 3, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 2);
  double s = 0;
  for (auto& t : top) s += std::exp(t.logprob);
  EXPECT_NEAR(s, 1.0, 1e-6);
  EXPECT_NEAR(token_logprob(l.data(), 3, 2), top[0].logprob, 1e-6);
}

}  // namespace
}  // namespace pg
