// Quantized KV cache types end to end on golden models: every type (and a few K/V pairs) forwards, its
// logit drift against an F16 cache is bounded per type (and printed: docs/kv-cache-types.md quotes it),
// a quantized cache saves/restores and forks (copy-on-write) exactly, and bad types are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "core/kv_quant.h"
#include "kv/paged_kv_cache.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

std::vector<int32_t> tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 104729u) % static_cast<uint32_t>(vocab)));
  return t;
}

std::vector<float> run(Model& m, KvCache& c, const std::vector<int32_t>& toks, int seq) {
  Batch b;
  for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], c.seq_len(seq) + static_cast<int>(i), seq, true);
  std::vector<float> out;
  m.forward(b, c, out);
  return out;
}

struct Env {
  CpuBackend be{CpuOptions{2, false, 1}};
  std::unique_ptr<Model> model;
  int V = 0;
  explicit Env(const std::string& stem) {
    model = Model::load(test::shared_path("golden/models/" + stem + ".gguf").string(), be);
    V = model->config().n_vocab;
  }
};

KvCacheOptions opts(DType k, DType v, int n_seq = 1, int n_ctx = 96) {
  KvCacheOptions o{n_seq, n_ctx, k, 16};
  o.type_v = v;
  return o;
}

// max |a - b| / max |b|: the drift of a row set of logits relative to its scale.
double rel_drift(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    s = std::max(s, static_cast<double>(std::fabs(b[i])));
  }
  return d / s;
}

// Per type the bound on the relative logit drift vs an F16 cache over 48 positions of the tiny models
// (their K/V are random-init scale, the worst case for the 4-bit types); measured values are printed.
double drift_bound(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: return 2e-3;
    case DType::BF16: return 2e-2;
    case DType::Q8_0: return 3e-2;
    case DType::Q5_0: case DType::Q5_1: return 0.15;
    case DType::Q4_0: case DType::Q4_1: return 0.3;
    default: return 0.6;  // TQ3_0 (padded to 128 at head_dim 64 here: the padding adds no accuracy)
  }
}

TEST(KvTypes, EveryTypeForwardsWithBoundedDriftVsF16) {
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};
  std::map<DType, double> sum;  // per type (K = V) the drift summed over the models
  for (const char* stem : {"tiny-qwen3-f16", "tiny-gemma3-f16", "tiny-qwen35-f16", "tiny-llama-f16"}) {
    Env e(stem);
    const auto prompt = tokens(48, e.V, 11);
    auto ref_cache = e.model->make_cache(opts(DType::F16, DType::F16));
    const auto ref = run(*e.model, *ref_cache, prompt, 0);
    std::vector<std::pair<DType, DType>> pairs;
    for (DType t : all) pairs.push_back({t, t});
    pairs.push_back({DType::Q8_0, DType::F16});
    pairs.push_back({DType::F16, DType::Q4_0});
    pairs.push_back({DType::TQ3_0, DType::Q8_0});
    pairs.push_back({DType::F32, DType::TQ3_0});
    for (auto [k, v] : pairs) {
      auto c = e.model->make_cache(opts(k, v));
      ASSERT_EQ(c->layer(c->has_layer(0) ? 0 : 3).k.type, k);
      const auto got = run(*e.model, *c, prompt, 0);
      ASSERT_EQ(got.size(), ref.size());
      for (float x : got) ASSERT_TRUE(std::isfinite(x)) << stem << " " << kv_type_name(k) << "/" << kv_type_name(v);
      const double d = rel_drift(got, ref);
      std::printf("drift %-16s K %-5s V %-5s  max|dlogit|/max|logit| = %.5f\n", stem, kv_type_name(k).c_str(), kv_type_name(v).c_str(), d);
      EXPECT_LE(d, std::max(drift_bound(k), drift_bound(v))) << stem << " " << kv_type_name(k) << "/" << kv_type_name(v);
      if (k == v) sum[k] += d;
      if (k != DType::F16 && k != DType::F32 && k == v) {
        EXPECT_GT(d, 0.0) << "a quantized cache gave F16 logits: not stored in its type?";
      }
    }
  }
  // More bits, less drift: the order the formats promise (a mis-stored type breaks it).
  EXPECT_LT(sum[DType::Q8_0], sum[DType::Q5_1]);
  EXPECT_LT(sum[DType::Q5_1], sum[DType::Q4_0]);
  EXPECT_LT(sum[DType::Q5_0], sum[DType::Q4_0]);
  EXPECT_LT(sum[DType::BF16], sum[DType::Q8_0]);
}

// Bytes per token are exact for each type: n_layer_attn x (K row + V row) with kv_quant's padded heads.
TEST(KvTypes, BytesPerTokenFollowTheLayout) {
  Env e("tiny-qwen3-f16");
  const auto& cfg = e.model->config();
  int n_attn = 0;
  for (int il = 0; il < cfg.n_layer; ++il) n_attn += cfg.layer_kind[static_cast<size_t>(il)] == LayerKind::Attention;
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_1, DType::TQ3_0}) {
    auto c = e.model->make_cache(opts(t, DType::Q5_0, 2, 64));
    const size_t row = kv_row_bytes(t, cfg.n_head_kv, cfg.head_dim) + kv_row_bytes(DType::Q5_0, cfg.n_head_kv, cfg.head_dim_v);
    EXPECT_EQ(c->bytes_per_token(), row * static_cast<size_t>(n_attn)) << kv_type_name(t);
    EXPECT_EQ(c->bytes(), row * static_cast<size_t>(n_attn) * static_cast<size_t>(c->total_blocks() * c->block_size()));
  }
}

// A quantized cache's state saves and restores byte for byte, and a restored sequence continues exactly
// as the original; a fork (share_prefix, copy-on-write of the quantized block rows) continues exactly as a
// sequence that computed the prefix itself.
TEST(KvTypes, SaveRestoreAndCopyOnWriteOfAQuantizedCache) {
  for (const char* stem : {"tiny-qwen3-f16", "tiny-qwen35-f16"}) {
    Env e(stem);
    for (auto [k, v] : {std::pair{DType::Q8_0, DType::Q4_0}, std::pair{DType::TQ3_0, DType::TQ3_0}, std::pair{DType::Q5_1, DType::BF16}}) {
      auto c = e.model->make_cache(opts(k, v, 2));
      const auto prompt = tokens(21, e.V, 3), more = tokens(5, e.V, 4);
      run(*e.model, *c, prompt, 0);
      const auto state = c->save_seq(0);
      const auto cont = run(*e.model, *c, more, 0);
      auto c2 = e.model->make_cache(opts(k, v, 2));
      c2->restore_seq(1, state);
      EXPECT_EQ(c2->save_seq(1), state);
      EXPECT_EQ(run(*e.model, *c2, more, 1), cont) << stem << " " << kv_type_name(k) << "/" << kv_type_name(v);
      auto wrong = e.model->make_cache(opts(k, DType::F16, 1));
      EXPECT_THROW(wrong->restore_seq(0, state), Error);
      if (e.model->config().has_recurrent()) continue;  // a hybrid fork needs a captured snapshot (other test)
      // Fork at 18 of 21: block 1 (16..31) is shared; the fork's first write copies its quantized rows.
      c->truncate(0, 21);
      c->share_prefix(0, 1, 18);
      const auto tail = tokens(3, e.V, 9);
      const auto forked = run(*e.model, *c, tail, 1);
      auto solo = e.model->make_cache(opts(k, v, 1));
      std::vector<int32_t> p18(prompt.begin(), prompt.begin() + 18);
      run(*e.model, *solo, p18, 0);
      EXPECT_EQ(run(*e.model, *solo, tail, 0), forked) << stem << " " << kv_type_name(k) << "/" << kv_type_name(v);
    }
  }
}

// Tree verification on a quantized cache: a tree forward, then commit of a root-to-leaf path, leaves
// the cache byte for byte as a chain forward of that path would (commit moves the quantized rows with
// kv_copy), and decoding continues with identical logits.
TEST(KvTypes, TreeCommitOnAQuantizedCache) {
  for (const char* stem : {"tiny-qwen3-f16", "tiny-gemma3-f16"}) {
    Env e(stem);
    for (auto [k, v] : {std::pair{DType::Q8_0, DType::TQ3_0}, std::pair{DType::Q4_1, DType::Q4_1}}) {
      const std::string what = std::string(stem) + " " + kv_type_name(k) + "/" + kv_type_name(v);
      auto c = e.model->make_cache(opts(k, v));
      const auto prompt = tokens(13, e.V, 21), tt = tokens(5, e.V, 22);
      run(*e.model, *c, prompt, 0);
      // Tree: 0 root; 1 and 2 children of 0; 3 child of 2; 4 child of 3. Depth = position offset.
      const int par[5] = {-1, 0, 0, 2, 3}, depth[5] = {0, 1, 1, 2, 3};
      Batch b;
      for (int i = 0; i < 5; ++i) b.add_tree(tt[static_cast<size_t>(i)], 13 + depth[i], 0, par[i], true);
      std::vector<float> out;
      e.model->forward(b, *c, out);
      c->commit(0, {0, 2, 3, 4});
      ASSERT_EQ(c->seq_len(0), 17) << what;
      auto ref = e.model->make_cache(opts(k, v));
      std::vector<int32_t> hist = prompt;
      for (int i : {0, 2, 3, 4}) hist.push_back(tt[static_cast<size_t>(i)]);
      const auto rl = run(*e.model, *ref, hist, 0);
      EXPECT_EQ(c->save_seq(0), ref->save_seq(0)) << what << ": committed rows differ from the chain's";
      // The leaf's tree logits are the chain's last row (same cells in the same order, same types).
      const std::vector<float> leaf(out.begin() + 4 * e.V, out.begin() + 5 * e.V), last(rl.end() - e.V, rl.end());
      EXPECT_EQ(leaf, last) << what;
      const auto more = tokens(3, e.V, 23);
      EXPECT_EQ(run(*e.model, *c, more, 0), run(*e.model, *ref, more, 0)) << what;
    }
  }
}

TEST(KvTypes, BadTypesAreClearErrors) {
  Env e("tiny-qwen3-f16");
  for (DType bad : {DType::Q4_K, DType::I32, DType::Q8_1}) {
    try {
      e.model->make_cache(opts(DType::F16, bad));
      ADD_FAILURE() << "accepted " << dtype_name(bad);
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("tq3_0"), std::string::npos) << err.what();  // lists the types
    }
  }
  EXPECT_THROW(parse_kv_type("q4_k"), Error);
  EXPECT_THROW(parse_kv_type("q9"), Error);
  EXPECT_EQ(parse_kv_type("TQ3_0"), DType::TQ3_0);
}

}  // namespace
}  // namespace pg
