#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "kv/paged_kv_cache.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

TEST(KvCache, BlocksAreAllocatedFreedAndReused) {
  CpuBackend be;
  PagedKvCache kv(be, {{8, 8}, {0, 0}, {8, 8}}, {2, 100, DType::F32, 16, 8});
  EXPECT_EQ(kv.max_blocks(), 7);
  EXPECT_EQ(kv.free_blocks(), 8);
  EXPECT_TRUE(kv.has_layer(0));
  EXPECT_FALSE(kv.has_layer(1));
  ASSERT_TRUE(kv.reserve(0, 33));  // 3 blocks
  EXPECT_EQ(kv.free_blocks(), 5);
  ASSERT_TRUE(kv.reserve(1, 80));  // 5 blocks
  EXPECT_EQ(kv.free_blocks(), 0);
  EXPECT_FALSE(kv.reserve(0, 49));  // a 4th block is not available
  // Cells of different sequences never collide.
  std::set<int32_t> cells;
  for (int p = 0; p < 33; ++p) EXPECT_TRUE(cells.insert(kv.cell(0, p)).second);
  for (int p = 0; p < 80; ++p) EXPECT_TRUE(cells.insert(kv.cell(1, p)).second);
  kv.set_len(1, 80);
  kv.truncate(1, 20);  // keeps 2 blocks
  EXPECT_EQ(kv.seq_len(1), 20);
  EXPECT_EQ(kv.free_blocks(), 3);
  ASSERT_TRUE(kv.reserve(0, 49));
  kv.clear(0);
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_THROW(kv.reserve(0, 101), Error);
  EXPECT_THROW(kv.cell(0, 0), Error);
}

// Several sequences in one batch give exactly the logits each gets alone.
TEST(Batching, InterleavedSequencesMatchSeparateRuns) {
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend be(co);
  auto model = Model::load(test::shared_path("golden/models/tiny-qwen3-Q4_K_M.gguf").string(), be);
  const std::vector<int32_t> a = {5, 300, 17, 42, 99, 3, 128}, bb = {256, 400, 77, 12};
  auto solo = [&](const std::vector<int32_t>& ids) {
    auto cache = model->make_cache({1, 64, DType::F16, 16});
    Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], static_cast<int>(i), 0, true);
    std::vector<float> out;
    model->forward(b, *cache, out);
    // one more decode step through the cache
    b.clear();
    b.add(7, static_cast<int>(ids.size()), 0, true);
    std::vector<float> step;
    model->forward(b, *cache, step);
    out.insert(out.end(), step.begin(), step.end());
    return out;
  };
  const auto ra = solo(a), rb = solo(bb);
  auto cache = model->make_cache({3, 64, DType::F16, 16});
  Batch b;
  size_t ia = 0, ib = 0;
  while (ia < a.size() || ib < bb.size()) {  // interleave rows of sequences 2 and 0
    if (ia < a.size()) b.add(a[ia], static_cast<int>(ia), 2, true), ++ia;
    if (ib < bb.size()) b.add(bb[ib], static_cast<int>(ib), 0, true), ++ib;
  }
  std::vector<float> out;
  model->forward(b, *cache, out);
  const int nv = model->config().n_vocab;
  ia = ib = 0;
  for (int r = 0; r < b.size(); ++r) {
    const float* row = out.data() + static_cast<size_t>(r) * nv;
    const bool is_a = b.seq[static_cast<size_t>(r)] == 2;
    const float* ref = (is_a ? ra.data() + ia++ * nv : rb.data() + ib++ * nv);
    for (int v = 0; v < nv; ++v) ASSERT_EQ(row[v], ref[v]) << "row " << r;
  }
  b.clear();
  b.add(7, static_cast<int>(bb.size()), 0, true);
  b.add(7, static_cast<int>(a.size()), 2, true);
  model->forward(b, *cache, out);
  for (int v = 0; v < nv; ++v) {
    ASSERT_EQ(out[static_cast<size_t>(v)], rb[bb.size() * nv + static_cast<size_t>(v)]);
    ASSERT_EQ(out[static_cast<size_t>(nv + v)], ra[a.size() * nv + static_cast<size_t>(v)]);
  }
}

// The F16 cache stays close to the F32 cache, and micro-batching does not change results.
TEST(Batching, F16CacheAndMicroBatches) {
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend be(co);
  ModelOptions mo;
  auto run = [&](int max_batch, DType kv_type) {
    mo.max_batch = max_batch;
    auto model = Model::load(test::shared_path("golden/models/tiny-llama-f16.gguf").string(), be, mo);
    auto cache = model->make_cache({1, 64, kv_type, 8});
    Batch b;
    for (int i = 0; i < 40; ++i) b.add((i * 37 + 11) % 512, i, 0, true);
    std::vector<float> out;
    model->forward(b, *cache, out);
    return out;
  };
  const auto full = run(512, DType::F32), micro = run(7, DType::F32), half = run(512, DType::F16);
  ASSERT_EQ(full.size(), micro.size());
  double max_half = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(full[i], micro[i]);
    max_half = std::max(max_half, static_cast<double>(std::fabs(full[i] - half[i])));
  }
  EXPECT_LT(max_half, 2e-2);
  EXPECT_GT(max_half, 0.0);  // the F16 cache really rounds
}

TEST(Model, RejectsBadBatches) {
  CpuBackend be;
  auto model = Model::load(test::shared_path("golden/models/tiny-qwen3-f16.gguf").string(), be);
  auto cache = model->make_cache({1, 16, DType::F32});
  std::vector<float> out;
  Batch b;
  EXPECT_THROW(model->forward(b, *cache, out), Error);
  b.add(512, 0, 0, true);  // outside the 512-token vocabulary
  EXPECT_THROW(model->forward(b, *cache, out), Error);
  b.clear();
  b.add(1, 16, 0, true);  // beyond the context
  EXPECT_THROW(model->forward(b, *cache, out), Error);
  b.clear();
  b.add(1, 0, 1, true);  // no such sequence slot
  EXPECT_THROW(model->forward(b, *cache, out), Error);
}

}  // namespace
}  // namespace pg
