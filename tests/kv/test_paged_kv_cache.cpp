// The paged KV cache behind the KvCache interface: prefix sharing with copy-on-write, K and V storage
// types chosen separately, block accounting, and the errors of bad requests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
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

// Chain forward of toks on seq at its current length; the logits of every row.
std::vector<float> run(Model& m, KvCache& c, const std::vector<int32_t>& toks, int seq, bool capture = false) {
  Batch b;
  for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], c.seq_len(seq) + static_cast<int>(i), seq, true);
  std::vector<float> out;
  ForwardOptions f;
  f.capture = capture;
  m.forward(b, c, out, f);
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

// A sequence forked from another's prefix (mid-block, so the block holding the fork point is shared)
// continues exactly like a sequence that computed the prefix itself, and the source, writing after the
// fork into the shared block, is not disturbed by the fork's writes (nor the fork by the source's).
TEST(PagedKvCache, SharePrefixWithCopyOnWrite) {
  for (const char* stem : {"tiny-qwen3-f16", "tiny-gemma3-f16"}) {
    Env e(stem);
    auto cache = e.model->make_cache({3, 128, DType::F32, 16});
    auto& paged = dynamic_cast<PagedKvCache&>(*cache);
    const auto prompt = tokens(26, e.V, 1), a = tokens(9, e.V, 2), b = tokens(7, e.V, 3);
    run(*e.model, *cache, prompt, 0);
    const int free0 = cache->free_blocks();
    cache->share_prefix(0, 1, 20);  // blocks 0 and 1 (positions 16..25) shared
    EXPECT_EQ(cache->seq_len(1), 20);
    EXPECT_EQ(cache->free_blocks(), free0) << "sharing must not copy";
    EXPECT_EQ(paged.block_refcount(cache->block_table()[0]), 2);
    EXPECT_EQ(cache->cell(1, 17), cache->cell(0, 17));
    const auto got1 = run(*e.model, *cache, a, 1);  // writes at 20.. land in the shared block: copied first
    EXPECT_NE(cache->cell(1, 17), cache->cell(0, 17));
    EXPECT_EQ(cache->free_blocks(), free0 - 1);
    const auto got0 = run(*e.model, *cache, b, 0);
    // References computed without sharing.
    auto ref = e.model->make_cache({2, 128, DType::F32, 16});
    std::vector<int32_t> h1(prompt.begin(), prompt.begin() + 20);
    h1.insert(h1.end(), a.begin(), a.end());
    std::vector<int32_t> h0 = prompt;
    h0.insert(h0.end(), b.begin(), b.end());
    const auto r1 = run(*e.model, *ref, h1, 0), r0 = run(*e.model, *ref, h0, 1);
    const size_t V = static_cast<size_t>(e.V);
    EXPECT_EQ(std::memcmp(got1.data(), r1.data() + 20 * V, got1.size() * 4), 0) << stem << ": the fork";
    EXPECT_EQ(std::memcmp(got0.data(), r0.data() + 26 * V, got0.size() * 4), 0) << stem << ": the source after the fork wrote";
    // A whole-sequence share, then the source is cleared: the fork keeps its blocks.
    cache->share_prefix(0, 2, cache->seq_len(0));
    const auto before = cache->save_seq(2);
    cache->clear(0);
    EXPECT_EQ(cache->save_seq(2), before);
    cache->clear(1);
    cache->clear(2);
    EXPECT_EQ(cache->free_blocks(), cache->total_blocks()) << "every block returns to the pool";
  }
}

TEST(PagedKvCache, SharePrefixOfAHybridNeedsASnapshot) {
  Env e("tiny-qwen35-f16");
  auto cache = e.model->make_cache({2, 64, DType::F32, 16, 0, 16});
  const auto prompt = tokens(12, e.V, 4);
  run(*e.model, *cache, std::vector<int32_t>(prompt.begin(), prompt.begin() + 8), 0);
  run(*e.model, *cache, std::vector<int32_t>(prompt.begin() + 8, prompt.end()), 0, /*capture=*/true);  // snapshots at 7..11
  EXPECT_THROW(cache->share_prefix(0, 1, 5), Error);  // no recurrent state captured after 5 tokens
  cache->share_prefix(0, 1, 10);
  const auto next = tokens(3, e.V, 5);
  const auto got = run(*e.model, *cache, next, 1);
  auto ref = e.model->make_cache({1, 64, DType::F32, 16});
  std::vector<int32_t> h(prompt.begin(), prompt.begin() + 10);
  h.insert(h.end(), next.begin(), next.end());
  const auto r = run(*e.model, *ref, h, 0);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(got[i] - r[10 * static_cast<size_t>(e.V) + i])));
  EXPECT_LE(worst, 1e-5);
}

// K and V storage chosen separately: the layers get the requested types, a forward with F16 keys and F32
// values sits between the all-F32 and all-F16 caches, and a saved state does not load into a cache of
// other types.
TEST(PagedKvCache, KAndVTypesChosenSeparately) {
  Env e("tiny-qwen3-f16");
  KvCacheOptions o{1, 64, DType::F32, 16};
  o.type_k = DType::F16;
  auto mixed = e.model->make_cache(o);
  EXPECT_EQ(mixed->layer(0).k.type, DType::F16);
  EXPECT_EQ(mixed->layer(0).v.type, DType::F32);
  auto f32 = e.model->make_cache({1, 64, DType::F32, 16});
  const auto prompt = tokens(20, e.V, 6);
  const auto lm = run(*e.model, *mixed, prompt, 0), l32 = run(*e.model, *f32, prompt, 0);
  double worst = 0;
  for (size_t i = 0; i < lm.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(lm[i] - l32[i])));
  EXPECT_GT(worst, 0.0) << "keys were not stored as F16";
  EXPECT_LT(worst, 0.05);
  const auto state = mixed->save_seq(0);
  EXPECT_THROW(f32->restore_seq(0, state), Error);
  auto mixed2 = e.model->make_cache(o);
  mixed2->restore_seq(0, state);
  EXPECT_EQ(mixed2->save_seq(0), state);
  KvCacheOptions bad{1, 64, DType::F32, 16};
  bad.type_v = DType::Q4_K;  // a weight type, not a KV type
  EXPECT_THROW(e.model->make_cache(bad), Error);
}

TEST(PagedKvCache, BadRequestsAreErrors) {
  CpuBackend be;
  PagedKvCache kv(be, {{8, 8}}, {2, 64, DType::F32, 16, 4});
  EXPECT_THROW(kv.share_prefix(0, 0, 0), Error);
  EXPECT_THROW(kv.share_prefix(0, 1, 1), Error);  // the source holds nothing
  EXPECT_THROW(kv.share_prefix(0, 2, 0), Error);
  EXPECT_THROW(kv.write_cell(0, 0), Error);       // not reserved
  ASSERT_TRUE(kv.reserve(0, 64));                 // every block
  kv.set_len(0, 40);
  kv.share_prefix(0, 1, 40);
  EXPECT_THROW(kv.write_cell(1, 39), Error);  // a copy-on-write needs a free block; there is none
  kv.truncate(0, 0);                          // the source lets go: the fork owns its blocks alone
  EXPECT_NO_THROW(kv.write_cell(1, 39));
  EXPECT_THROW(kv.commit(1, {0}), Error);  // no tree
}

}  // namespace
}  // namespace pg
