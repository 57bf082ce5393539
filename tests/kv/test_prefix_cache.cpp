// The prefix cache in RAM and on disk (kv/prefix_cache.h, kv/disk_cache.h), driven the way the
// scheduler drives it (attach at admission, prefill chunks that stop at chunk_end(), after_forward,
// release), against the real golden models on the CPU backend.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "engine/prefix.h"
#include "kv/disk_cache.h"
#include "kv/prefix_cache.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 104729u + 13u) % static_cast<uint32_t>(vocab)));
  return t;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Env {
  CpuBackend be{CpuOptions{2, false, 1}};
  std::unique_ptr<Model> model;
  int V = 0;
  explicit Env(const std::string& file) {
    model = Model::load(test::shared_path("golden/models/" + file).string(), be);
    V = model->config().n_vocab;
  }
};

// Chain forward of toks[from, to) on seq, every row's logits.
std::vector<float> forward(Model& m, KvCache& c, const std::vector<int32_t>& toks, int seq, int from, int to) {
  Batch b;
  for (int i = from; i < to; ++i) b.add(toks[static_cast<size_t>(i)], i, seq, true);
  std::vector<float> out;
  m.forward(b, c, out);
  return out;
}

// What the scheduler does for one request: attach, prefill in chunks ending at chunk_end(), then the
// logits of the last chunk (the rows a hit and a miss both compute). Returns the hit.
PrefixHit prefill(Model& m, KvCache& c, PrefixCache* pc, int seq, const std::vector<int32_t>& prompt, std::vector<float>& last) {
  PrefixHit hit;
  if (pc) hit = pc->attach(seq, prompt);
  const int n = static_cast<int>(prompt.size());
  int from = hit.n_tokens;
  EXPECT_EQ(c.seq_len(seq), from);
  while (from < n) {
    const int to = pc ? pc->chunk_end(seq, from, n) : n;
    last = forward(m, c, prompt, seq, from, to);
    if (pc) pc->after_forward(seq, to);
    from = to;
  }
  return hit;
}

struct Cached {
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<PrefixCache> pc;
  Cached(Model& m, int n_seq, int n_ctx, int64_t ram_mib, const std::string& dir = "", int block = 16, bool partial = true) {
    KvCacheOptions ko{n_seq, n_ctx, DType::F16, block};
    engine::PrefixOptions po;
    po.ram_mib = ram_mib;
    po.disk_dir = dir;
    po.partial = partial;
    kv = engine::make_cache_with_prefix(m, ko, po, pc);
  }
};

// The uncached run with the batch shapes the cached one had: the prefix's KV as the first request
// computed it (attention: `first` as one batch, cut back to `hit`; hybrid: `p` up to the boundary, where
// the first request's prefill stopped), then the rest in the chunks the scheduler uses (hybrid: stop at
// p's own last boundary). Returns the last chunk's logits.
std::vector<float> reference(Model& m, const std::vector<int32_t>& first, const std::vector<int32_t>& p, int hit, int bs = 16) {
  const bool hybrid = m.config().has_recurrent();
  auto plain = m.make_cache({1, 1024, DType::F16, bs});
  if (hybrid) {
    forward(m, *plain, p, 0, 0, hit);
  } else {
    forward(m, *plain, first, 0, 0, static_cast<int>(first.size()));
    plain->truncate(0, hit);
  }
  const int n = static_cast<int>(p.size()), point = (n - 1) / bs * bs;
  int from = hit;
  if (hybrid && point > hit) {
    forward(m, *plain, p, 0, hit, point);
    from = point;
  }
  return forward(m, *plain, p, 0, from, n);
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double worst(const std::vector<float>& a, const std::vector<float>& b) {
  double w = a.size() == b.size() ? 0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) w = std::max(w, static_cast<double>(std::fabs(a[i] - b[i])));
  return w;
}

std::vector<std::string> golden_models() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(test::shared_path("golden/models")))
    if (e.path().extension() == ".gguf") out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Whole blocks only (--no-partial-blocks): a request sharing the first request's prompt plus more (the
// next chat turn) hits its whole blocks —
// for hybrid models through the snapshot at the first prompt's last boundary — and the logits of the
// rows it prefills are bit-identical to a run without the cache that evaluates the same batch shapes
// (the prefix as one batch up to that boundary, then the rest). Every golden architecture and quantization.
TEST(PrefixCache, HitLogitsBitIdenticalForEveryGoldenModel) {
  const auto models = golden_models();
  ASSERT_GE(models.size(), 20u);
  for (const auto& file : models) {
    SCOPED_TRACE(file);
    Env e(file);
    const bool hybrid = e.model->config().has_recurrent();
    Cached c(*e.model, 2, 256, 4, "", 16, false);
    ASSERT_NE(c.pc, nullptr);
    const auto p1 = tokens(70, e.V, 1), p2 = cat(p1, tokens(21, e.V, 2));
    std::vector<float> l1, l2, ref;
    EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l1).n_tokens, 0);
    c.pc->release(0, p1);
    EXPECT_EQ(c.kv->seq_len(0), 0);
    // p1's 4 full blocks (64 tokens) before its last token are cached; p2 reuses them all.
    EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 1, p2, l2).n_tokens, 64);
    ref = reference(*e.model, p1, p2, 64);
    EXPECT_TRUE(same(l2, ref)) << "worst |diff| " << worst(l2, ref);
    // And a divergent prompt (shares 3 blocks only) on an attention model: hits 48.
    c.pc->release(1, p2);
    if (!hybrid) {
      const auto p3 = cat(std::vector<int32_t>(p1.begin(), p1.begin() + 50), tokens(30, e.V, 3));
      std::vector<float> l3;
      EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 0, p3, l3).n_tokens, 48);
      auto plain3 = e.model->make_cache({1, 256, DType::F16, 16});
      forward(*e.model, *plain3, p1, 0, 0, 70);
      plain3->truncate(0, 48);
      EXPECT_TRUE(same(l3, forward(*e.model, *plain3, p3, 0, 48, static_cast<int>(p3.size()))));
      c.pc->release(0, p3);
    }
  }
}

// The forwards of an uncached run, in order: (tokens, from, to) chunks on one fresh sequence; a chunk
// without tokens truncates the sequence to `from` (the KV of a cached prefix as the batch that first
// computed it had it: batch shapes decide the bits).
struct Chunk {
  const std::vector<int32_t>* toks;
  int from, to;
};

std::vector<float> run_chunks(Model& m, const std::vector<Chunk>& cs, int bs = 16) {
  auto plain = m.make_cache({1, 1024, DType::F16, bs});
  std::vector<float> last;
  for (const auto& c : cs) {
    if (c.toks)
      last = forward(m, *plain, *c.toks, 0, c.from, c.to);
    else
      plain->truncate(0, c.from);
  }
  return last;
}

// The chunks prefill() runs for prompt p after a hit of `hit` tokens (hybrid: it stops once at p's last
// full-block boundary before its final token).
void prefill_chunks(std::vector<Chunk>& cs, const std::vector<int32_t>& p, int hit, bool hybrid, int bs = 16) {
  const int n = static_cast<int>(p.size()), point = (n - 1) / bs * bs;
  if (hybrid && point > hit) {
    cs.push_back({&p, hit, point});
    hit = point;
  }
  cs.push_back({&p, hit, n});
}

// Partial blocks (the default): turn 1's prompt and its answer (decoded one row at a time, as the
// engine does) are reused to their last cell — the tail block's leading cells copied into the new
// sequence's own block — and the logits are bit-identical to an uncached run with the same batch shapes,
// for every golden architecture and quantization (hybrid: through the recurrent state snapshotted at
// release). A prompt diverging inside a cached block reuses that block's matching leading cells
// (attention); a hybrid one falls back to the deepest block-boundary snapshot.
TEST(PrefixCache, PartialHitLogitsBitIdenticalForEveryGoldenModel) {
  const auto models = golden_models();
  ASSERT_GE(models.size(), 20u);
  for (const auto& file : models) {
    SCOPED_TRACE(file);
    Env e(file);
    const bool hybrid = e.model->config().has_recurrent();
    Cached c(*e.model, 2, 256, 4);
    ASSERT_NE(c.pc, nullptr);
    const auto p1 = tokens(70, e.V, 1), h1 = cat(p1, tokens(13, e.V, 4));
    std::vector<Chunk> ref;
    std::vector<float> l1, l2, l3;
    EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l1).n_tokens, 0);
    prefill_chunks(ref, p1, 0, hybrid);
    for (int i = 70; i < 83; ++i) {  // the answer, one decode row at a time
      forward(*e.model, *c.kv, h1, 0, i, i + 1);
      ref.push_back({&h1, i, i + 1});
    }
    c.pc->release(0, h1);
    // Turn 2 = turn 1's prompt + answer + a new message: all 83 positions, 3 of them from the tail.
    const auto p2 = cat(h1, tokens(21, e.V, 2));
    const PrefixHit hit = prefill(*e.model, *c.kv, c.pc.get(), 1, p2, l2);
    EXPECT_EQ(hit.n_tokens, 83);
    EXPECT_EQ(hit.n_partial, 3);
    prefill_chunks(ref, p2, 83, hybrid);
    const auto r2 = run_chunks(*e.model, ref);
    EXPECT_TRUE(same(l2, r2)) << "worst |diff| " << worst(l2, r2);
    c.pc->release(1, p2);
    // Attention: 6 full blocks and p2's tail (h1's tail is superseded by p2's block 5, which starts
    // with it); hybrid tails stay (each has the state of its own length).
    EXPECT_EQ(c.pc->stats().ram_blocks, hybrid ? 8u : 7u);
    EXPECT_EQ(c.pc->stats().partial_hit_tokens, 3u);
    // Divergence inside block 4 (positions 64..79, from turn 1): 2 cells of it match.
    const auto p3 = cat(std::vector<int32_t>(p1.begin(), p1.begin() + 66), tokens(20, e.V, 3));
    const PrefixHit h3 = prefill(*e.model, *c.kv, c.pc.get(), 0, p3, l3);
    if (hybrid) {
      EXPECT_EQ(h3.n_tokens, 64) << "the snapshot at p1's boundary";
      EXPECT_EQ(h3.n_partial, 0);
      std::vector<Chunk> r3{{&p1, 0, 64}};
      prefill_chunks(r3, p3, 64, true);
      EXPECT_TRUE(same(l3, run_chunks(*e.model, r3)));
    } else {
      EXPECT_EQ(h3.n_tokens, 66);
      EXPECT_EQ(h3.n_partial, 2);
      EXPECT_TRUE(same(l3, run_chunks(*e.model, {{&p1, 0, 70}, {nullptr, 66, 0}, {&p3, 66, 86}})));
      // And inside block 3 (positions 48..63, turn 1's prompt batch): 2 cells.
      c.pc->release(0, p3);
      const auto p4 = cat(std::vector<int32_t>(p1.begin(), p1.begin() + 50), tokens(30, e.V, 5));
      std::vector<float> l4;
      const PrefixHit h4 = prefill(*e.model, *c.kv, c.pc.get(), 0, p4, l4);
      EXPECT_EQ(h4.n_tokens, 50);
      EXPECT_EQ(h4.n_partial, 2);
      EXPECT_TRUE(same(l4, run_chunks(*e.model, {{&p1, 0, 70}, {nullptr, 50, 0}, {&p4, 50, 80}})));
      c.pc->release(0, p4);
    }
  }
}

// Sequences running at once that copy cells of the same cached block — one sharing the whole tail, one
// diverging inside it — each compute what they would without the cache; the cached block is never
// written (a third request attached after both wrote reads it intact), only the full blocks are shared
// (refcounts), and a flood of other prompts over the budget evicts nothing they hold.
TEST(PrefixCache, ConcurrentSequencesShareAndDivergeMidBlock) {
  Env e("tiny-qwen3-f16.gguf");
  Cached c(*e.model, 4, 256, 4);
  auto& paged = dynamic_cast<PagedKvCache&>(*c.kv);
  const auto p1 = tokens(40, e.V, 1);
  std::vector<float> l;
  prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l);
  c.pc->release(0, p1);  // 2 full blocks + a tail of 8
  const auto a = cat(std::vector<int32_t>(p1.begin(), p1.begin() + 36), tokens(9, e.V, 2)), b = cat(p1, tokens(13, e.V, 3));
  const PrefixHit ha = c.pc->attach(1, a), hb = c.pc->attach(2, b);
  EXPECT_EQ(ha.n_tokens, 36);
  EXPECT_EQ(ha.n_partial, 4);
  EXPECT_EQ(hb.n_tokens, 40);
  EXPECT_EQ(hb.n_partial, 8);
  const int32_t blk0 = paged.block_of(1, 0);
  EXPECT_EQ(blk0, paged.block_of(2, 0));
  EXPECT_EQ(paged.block_refcount(blk0), 3);
  EXPECT_NE(paged.block_of(1, 2), paged.block_of(2, 2)) << "each has its own copy of the tail";
  EXPECT_EQ(paged.block_refcount(paged.block_of(1, 2)), 1);
  EXPECT_EQ(paged.block_refcount(paged.block_of(2, 2)), 1);
  const auto la = forward(*e.model, *c.kv, a, 1, 36, 45), lb = forward(*e.model, *c.kv, b, 2, 40, 53);
  EXPECT_TRUE(same(la, run_chunks(*e.model, {{&p1, 0, 40}, {nullptr, 36, 0}, {&a, 36, 45}})));
  EXPECT_TRUE(same(lb, run_chunks(*e.model, {{&p1, 0, 40}, {&b, 40, 53}})));
  // a wrote positions 36.. of its copy: the cached tail still holds p1's.
  const auto d = cat(p1, tokens(5, e.V, 4));
  std::vector<float> ld;
  EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 3, d, ld).n_tokens, 40);
  EXPECT_TRUE(same(ld, run_chunks(*e.model, {{&p1, 0, 40}, {&d, 40, 45}})));
  c.pc->release(3, d);
  const int32_t a2 = paged.block_of(1, 2), b2 = paged.block_of(2, 2);
  for (int s = 0; s < 8; ++s) {
    const auto other = tokens(60, e.V, 100 + static_cast<uint32_t>(s));
    prefill(*e.model, *c.kv, c.pc.get(), 0, other, l);
    c.pc->release(0, other);
  }
  EXPECT_EQ(paged.block_refcount(blk0), 3);
  EXPECT_EQ(paged.block_of(1, 2), a2);
  EXPECT_EQ(paged.block_of(2, 2), b2);
  // They continue as without the cache.
  const auto a_more = cat(a, tokens(3, e.V, 6));
  EXPECT_TRUE(same(forward(*e.model, *c.kv, a_more, 1, 45, 48), run_chunks(*e.model, {{&p1, 0, 40}, {nullptr, 36, 0}, {&a, 36, 45}, {&a_more, 45, 48}})));
  c.pc->release(1, a_more);
  c.pc->release(2, b);
  EXPECT_EQ(c.kv->free_blocks() + static_cast<int>(c.pc->stats().ram_blocks), c.kv->total_blocks());
}

// Tails are blocks of the budget like full ones: LRU over leaves, tail first; under a tight budget a
// prompt still copies the leading cells of a cached full block, and the pool's accounting holds.
TEST(PrefixCache, EvictionWithPartialTails) {
  Env e("tiny-llama-f16.gguf");
  KvCacheOptions ko{1, 256, DType::F16, 16};
  auto probe = e.model->make_cache(ko);
  const size_t bb = dynamic_cast<PagedKvCache&>(*probe).block_bytes();
  ko.n_blocks = 16 + 5;
  auto kv = e.model->make_cache(ko);
  PrefixCacheOptions po;
  po.ram_bytes = 5 * bb;
  auto pc = std::make_unique<PrefixCache>(dynamic_cast<PagedKvCache&>(*kv), po);
  std::vector<float> l;
  const auto a = tokens(50, e.V, 1), b = tokens(50, e.V, 2);  // 3 full blocks and a tail of 2 each
  prefill(*e.model, *kv, pc.get(), 0, a, l);
  pc->release(0, a);
  EXPECT_EQ(pc->stats().ram_blocks, 4u);
  prefill(*e.model, *kv, pc.get(), 0, b, l);
  pc->release(0, b);
  EXPECT_EQ(pc->stats().ram_blocks, 5u) << "a's tail, then its blocks 2 and 1 go";
  EXPECT_EQ(pc->stats().evicted_blocks, 3u);
  EXPECT_EQ(prefill(*e.model, *kv, pc.get(), 0, b, l).n_tokens, 49) << "b whole but its last token";
  pc->release(0, b);
  EXPECT_EQ(prefill(*e.model, *kv, pc.get(), 0, a, l).n_tokens, 16);
  pc->release(0, a);
  EXPECT_LE(pc->stats().ram_blocks, 5u);
  EXPECT_EQ(kv->free_blocks() + static_cast<int>(pc->stats().ram_blocks), kv->total_blocks());
  const auto c2 = cat(std::vector<int32_t>(a.begin(), a.begin() + 40), tokens(200, e.V, 3));
  const PrefixHit h = prefill(*e.model, *kv, pc.get(), 0, c2, l);
  EXPECT_EQ(h.n_tokens, 40) << "a's blocks 0 and 1 and 8 cells of its block 2";
  EXPECT_EQ(h.n_partial, 8);
  pc->release(0, c2);
  EXPECT_LE(pc->stats().ram_blocks, 5u);
  EXPECT_EQ(kv->free_blocks() + static_cast<int>(pc->stats().ram_blocks), kv->total_blocks());
}

// Sliding-window layers (gemma3, window smaller than the prompt): the cached rows outside the window
// are simply not attended to, as without the cache.
TEST(PrefixCache, SlidingWindowReuseRespectsTheWindow) {
  Env e("tiny-gemma3-f16.gguf");
  const int w = e.model->config().sliding_window;
  ASSERT_GT(w, 0);
  const int n1 = std::max(70, w + 40);
  Cached c(*e.model, 2, 1024, 8);
  const auto p1 = tokens(n1, e.V, 7), p2 = cat(p1, tokens(w + 10, e.V, 8));
  std::vector<float> l1, l2;
  prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l1);
  c.pc->release(0, p1);
  const int hit = prefill(*e.model, *c.kv, c.pc.get(), 0, p2, l2).n_tokens;
  EXPECT_EQ(hit, n1) << "the whole prompt, its last partial block copied";
  auto plain = e.model->make_cache({1, 1024, DType::F16, 16});
  forward(*e.model, *plain, p1, 0, 0, n1);
  plain->truncate(0, hit);
  EXPECT_TRUE(same(l2, forward(*e.model, *plain, p2, 0, hit, static_cast<int>(p2.size()))));
}

// Two running sequences share the cached blocks (refcounts: the index + each), each computes the same
// as without sharing, and releasing them leaves only the index's references.
TEST(PrefixCache, ConcurrentSequencesShareBlocks) {
  Env e("tiny-qwen3-f16.gguf");
  Cached c(*e.model, 3, 256, 4, "", 16, false);
  auto& paged = dynamic_cast<PagedKvCache&>(*c.kv);
  const auto p1 = tokens(40, e.V, 1);
  std::vector<float> l;
  prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l);
  c.pc->release(0, p1);
  const auto a = cat(p1, tokens(9, e.V, 2)), b = cat(p1, tokens(13, e.V, 3));
  std::vector<float> la, lb;
  EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 1, a, la).n_tokens, 32);
  EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 2, b, lb).n_tokens, 32);
  const int32_t blk0 = paged.block_of(1, 0);
  EXPECT_EQ(blk0, paged.block_of(2, 0));
  EXPECT_EQ(paged.block_refcount(blk0), 3);
  // The index must never evict blocks running sequences hold, even far over budget.
  for (int s = 0; s < 6; ++s) {
    const auto other = tokens(60, e.V, 100 + static_cast<uint32_t>(s));
    prefill(*e.model, *c.kv, c.pc.get(), 0, other, l);
    c.pc->release(0, other);
  }
  EXPECT_EQ(paged.block_refcount(blk0), 3);
  auto plain = e.model->make_cache({1, 256, DType::F16, 16});
  forward(*e.model, *plain, p1, 0, 0, 40);
  plain->truncate(0, 32);
  EXPECT_TRUE(same(la, forward(*e.model, *plain, a, 0, 32, static_cast<int>(a.size()))));
  c.pc->release(1, a);
  c.pc->release(2, b);
  EXPECT_EQ(c.kv->free_blocks() + static_cast<int>(c.pc->stats().ram_blocks), c.kv->total_blocks());
}

// A budget of a few blocks: the least recently used chain goes, tail first, and what stays is within
// the budget; a chain used again survives.
TEST(PrefixCache, EvictionUnderATinyBudget) {
  Env e("tiny-llama-f16.gguf");
  Cached c(*e.model, 1, 256, 0);
  EXPECT_EQ(c.pc, nullptr) << "--cache-ram 0 turns the prefix cache off";
  // One block of the tiny llama is bytes_per_token·16; budget ~5 blocks.
  KvCacheOptions ko{1, 256, DType::F16, 16};
  auto probe = e.model->make_cache(ko);
  const size_t bb = dynamic_cast<PagedKvCache&>(*probe).block_bytes();
  std::unique_ptr<PrefixCache> pc;
  ko.n_blocks = 16 + 5;
  auto kv = e.model->make_cache(ko);
  PrefixCacheOptions po;
  po.ram_bytes = 5 * bb;
  po.partial = false;  // whole blocks: the counts below are of full blocks (partial tails: EvictionWithPartialTails)
  pc = std::make_unique<PrefixCache>(dynamic_cast<PagedKvCache&>(*kv), po);
  EXPECT_EQ(pc->budget_blocks(), 5);
  std::vector<float> l;
  const auto a = tokens(50, e.V, 1), b = tokens(50, e.V, 2);  // 3 cacheable blocks each
  prefill(*e.model, *kv, pc.get(), 0, a, l);
  pc->release(0, a);
  EXPECT_EQ(pc->stats().ram_blocks, 3u);
  prefill(*e.model, *kv, pc.get(), 0, b, l);
  pc->release(0, b);
  EXPECT_EQ(pc->stats().ram_blocks, 5u) << "over budget by one: a's last block goes";
  EXPECT_EQ(pc->stats().evicted_blocks, 1u);
  EXPECT_EQ(prefill(*e.model, *kv, pc.get(), 0, a, l).n_tokens, 32) << "a keeps its first two blocks";
  pc->release(0, a);  // a is the most recent now; b's tail goes
  EXPECT_EQ(prefill(*e.model, *kv, pc.get(), 0, b, l).n_tokens, 32) << "b lost its tail";
  pc->release(0, b);
  EXPECT_LE(pc->stats().ram_blocks, 5u);
  EXPECT_EQ(kv->free_blocks() + static_cast<int>(pc->stats().ram_blocks), kv->total_blocks());
}

// A sequence that ended inside a speculative verify step has rows past its accepted history (rejected
// drafts): release(…, n_valid) caches only the blocks below n_valid.
TEST(PrefixCache, ReleaseCachesOnlyTheValidRows) {
  Env e("tiny-qwen3-f16.gguf");
  Cached c(*e.model, 1, 256, 4);
  const auto p = tokens(70, e.V, 1);
  std::vector<float> l;
  prefill(*e.model, *c.kv, c.pc.get(), 0, p, l);
  EXPECT_EQ(c.kv->seq_len(0), 70);
  c.pc->release(0, p, 47);  // rows 47.. are not p's
  EXPECT_EQ(c.pc->stats().ram_blocks, 3u) << "2 full blocks and the tail of rows 32..46";
  EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 0, p, l).n_tokens, 47);
  c.pc->release(0, p);
  EXPECT_EQ(c.pc->stats().ram_blocks, 5u) << "4 full blocks (the third superseding the old tail) and the tail of rows 64..69";
}

struct TempDir {
  fs::path p;
  TempDir() {
    p = fs::temp_directory_path() / ("pg_prefix_" + std::to_string(getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(p, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(p, ec);
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

std::vector<fs::path> block_files(const fs::path& dir, bool quarantined = false) {
  std::vector<fs::path> out;
  for (const auto& d : fs::recursive_directory_iterator(dir))
    if (d.path().extension() == ".pgkv" && (d.path().parent_path().filename() == "quarantine") == quarantined) out.push_back(d.path());
  return out;
}

// A "restart": a new cache and prefix cache on the same directory hit the block file the first one
// wrote — its full blocks and its partial tail (hybrid: through the tail's snapshot) — with logits
// bit-identical to the uncached run; attention and hybrid models. The disk budget counts the tail.
TEST(PrefixCache, DiskRoundTripAcrossARestart) {
  for (const char* file : {"tiny-qwen3-f16.gguf", "tiny-qwen35-f16.gguf", "tiny-qwen35moe-f16.gguf", "tiny-llama-Q4_K_M.gguf"}) {
    SCOPED_TRACE(file);
    Env e(file);
    const bool hybrid = e.model->config().has_recurrent();
    TempDir dir;
    const auto p1 = tokens(70, e.V, 1), p2 = cat(p1, tokens(21, e.V, 2));
    size_t bpt = 0;
    {
      Cached c(*e.model, 1, 256, 4, dir.p.string());
      ASSERT_TRUE(c.pc->disk_enabled());
      bpt = c.kv->bytes_per_token();
      std::vector<float> l;
      prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l);
      c.pc->release(0, p1);
      c.pc->flush();
      EXPECT_EQ(c.pc->stats().disk_files, 1u);
    }
    const auto files = block_files(dir.p);
    ASSERT_EQ(files.size(), 1u);
    // 4 blocks and the 6 tail cells (hybrid: and two snapshots) after the header; the budget counts them all.
    EXPECT_GE(fs::file_size(files[0]), 70 * bpt);
    Cached c(*e.model, 1, 256, 4, dir.p.string());
    EXPECT_EQ(c.pc->stats().disk_files, 1u) << "the index is rebuilt by the scan";
    EXPECT_EQ(c.pc->stats().disk_bytes, fs::file_size(files[0]));
    std::vector<float> l2;
    const PrefixHit hit = prefill(*e.model, *c.kv, c.pc.get(), 0, p2, l2);
    EXPECT_EQ(hit.n_tokens, 70) << "p1 whole: 4 blocks and its tail";
    EXPECT_EQ(hit.n_disk, 70);
    EXPECT_EQ(hit.n_partial, 6);
    std::vector<Chunk> ref;
    prefill_chunks(ref, p1, 0, hybrid);
    prefill_chunks(ref, p2, 70, hybrid);
    const auto r2 = run_chunks(*e.model, ref);
    EXPECT_TRUE(same(l2, r2)) << "worst |diff| " << worst(l2, r2);
    c.pc->release(0, p2);
    // The blocks and the tail joined the RAM index: the same prompt again is a RAM hit.
    const PrefixHit again = prefill(*e.model, *c.kv, c.pc.get(), 0, p2, l2);
    EXPECT_GE(again.n_tokens, 70);
    EXPECT_EQ(again.n_disk, 0);
    c.pc->release(0, p2);
  }
}

// Greedy tokens of seq after its prompt (`last`: the prefill's last chunk's logits), decoding one row
// at a time as the engine does.
std::vector<int32_t> greedy(Model& m, KvCache& c, int seq, std::vector<int32_t> toks, const std::vector<float>& last, int steps) {
  const int V = m.config().n_vocab;
  std::vector<float> row(last.end() - V, last.end());
  std::vector<int32_t> out;
  for (int s = 0; s < steps; ++s) {
    const int32_t t = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(t);
    toks.push_back(t);
    row = forward(m, c, toks, seq, static_cast<int>(toks.size()) - 1, static_cast<int>(toks.size()));
  }
  return out;
}

// The restarted server's first repeat: turn 1 (prompt, then its answer decoded row by row) on a
// server with the disk tier, a restart, then (a) turn 2 = turn 1's prompt + answer + a new message and
// (b) turn 1's prompt again. The disk hit reuses what the RAM hit reuses — the tail included — and its
// logits and greedy tokens are bit-identical to the RAM hit's and to no cache's (same batch shapes).
// Attention and hybrid (tiny-qwen35: the tail's release snapshot; the repeat, which ends inside the
// tail, falls back to the block snapshot as RAM does).
TEST(PrefixCache, DiskTailHitMatchesRamHitAndNoCache) {
  for (const char* file : {"tiny-qwen3-f16.gguf", "tiny-llama-Q4_K_M.gguf", "tiny-qwen35-f16.gguf"}) {
    SCOPED_TRACE(file);
    Env e(file);
    const bool hybrid = e.model->config().has_recurrent();
    const auto p1 = tokens(70, e.V, 1), h1 = cat(p1, tokens(13, e.V, 4)), p2 = cat(h1, tokens(21, e.V, 2));
    // Turn 1 on a cache: prefill p1, decode h1's answer, release.
    auto turn1 = [&](Cached& c) {
      std::vector<float> l;
      prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l);
      for (int i = 70; i < 83; ++i) forward(*e.model, *c.kv, h1, 0, i, i + 1);
      c.pc->release(0, h1);
    };
    std::vector<Chunk> first;  // turn 1's forwards, uncached
    prefill_chunks(first, p1, 0, hybrid);
    for (int i = 70; i < 83; ++i) first.push_back({&h1, i, i + 1});
    for (int which = 0; which < 2; ++which) {
      SCOPED_TRACE(which == 0 ? "turn 2" : "turn 1 repeated");
      const auto& q = which == 0 ? p2 : p1;
      // RAM: the same server, no restart.
      Cached ram(*e.model, 1, 256, 4);
      turn1(ram);
      std::vector<float> l_ram;
      const PrefixHit h_ram = prefill(*e.model, *ram.kv, ram.pc.get(), 0, q, l_ram);
      const auto g_ram = greedy(*e.model, *ram.kv, 0, q, l_ram, 4);
      // Disk: turn 1, restart, q.
      TempDir dir;
      {
        Cached c(*e.model, 1, 256, 4, dir.p.string());
        turn1(c);
        c.pc->flush();
      }
      Cached disk(*e.model, 1, 256, 4, dir.p.string());
      std::vector<float> l_disk;
      const PrefixHit h_disk = prefill(*e.model, *disk.kv, disk.pc.get(), 0, q, l_disk);
      const auto g_disk = greedy(*e.model, *disk.kv, 0, q, l_disk, 4);
      EXPECT_EQ(h_disk.n_tokens, h_ram.n_tokens);
      EXPECT_EQ(h_disk.n_partial, h_ram.n_partial);
      EXPECT_EQ(h_disk.n_disk, h_disk.n_tokens);
      // What each reuses: turn 2 all of h1 (5 blocks and the 3 cells of its tail); the repeat all but
      // p1's last token (attention: 4 blocks and 5 cells of h1's block 4, which the file holds whole) or
      // the 64 of the block snapshot (hybrid).
      const int want = which == 0 ? 83 : hybrid ? 64 : 69;
      EXPECT_EQ(h_disk.n_tokens, want);
      EXPECT_EQ(h_disk.n_partial, which == 0 ? 3 : hybrid ? 0 : 5);
      // No cache, with the batch shapes the cached KV was computed with.
      std::vector<Chunk> ref = first;
      if (hybrid && want == 64) ref = {{&p1, 0, 64}};
      else if (!hybrid && want < 83) ref.push_back({nullptr, want, 0});
      prefill_chunks(ref, q, want, hybrid);
      auto plain = e.model->make_cache({1, 1024, DType::F16, 16});
      std::vector<float> l_ref;
      for (const auto& ch : ref) {
        if (ch.toks) l_ref = forward(*e.model, *plain, *ch.toks, 0, ch.from, ch.to);
        else plain->truncate(0, ch.from);
      }
      const auto g_ref = greedy(*e.model, *plain, 0, q, l_ref, 4);
      EXPECT_TRUE(same(l_disk, l_ram)) << "worst |diff| " << worst(l_disk, l_ram);
      EXPECT_TRUE(same(l_disk, l_ref)) << "worst |diff| " << worst(l_disk, l_ref);
      EXPECT_EQ(g_disk, g_ram);
      EXPECT_EQ(g_disk, g_ref);
      disk.pc->release(0, cat(q, g_disk));
      ram.pc->release(0, cat(q, g_ram));
    }
  }
}

void flip_byte(const fs::path& p, uint64_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char ch = 0;
  f.read(&ch, 1);
  ch = static_cast<char>(ch ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&ch, 1);
}

// Broken files — a flipped payload byte, a flipped header byte, a cut file, another model's file under
// our folder, garbage — are skipped (quarantined) and the request is a miss computed correctly.
TEST(PrefixCache, CorruptTruncatedAndForeignFilesAreSkipped) {
  Env e("tiny-qwen3-f16.gguf");
  const auto p1 = tokens(70, e.V, 1), p2 = cat(p1, tokens(21, e.V, 2));
  auto ref = [&] {
    auto plain = e.model->make_cache({1, 256, DType::F16, 16});
    std::vector<float> l;
    prefill(*e.model, *plain, nullptr, 0, p2, l);
    return l;
  }();
  for (int mode = 0; mode < 5; ++mode) {
    SCOPED_TRACE(mode);
    TempDir dir;
    {
      Cached c(*e.model, 1, 256, 4, dir.p.string());
      std::vector<float> l;
      prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l);
      c.pc->release(0, p1);
      c.pc->flush();
    }
    auto files = block_files(dir.p);
    ASSERT_EQ(files.size(), 1u);
    const fs::path f = files[0];
    const uint64_t size = fs::file_size(f);
    if (mode == 0) flip_byte(f, size - 100);   // payload: found at load (checksum)
    if (mode == 1) flip_byte(f, 30);           // header: found at the scan
    if (mode == 2) fs::resize_file(f, size - 1000);
    if (mode == 3) {
      // Another model's file renamed into our folder.
      Env other("tiny-llama-f16.gguf");
      TempDir od;
      Cached oc(*other.model, 1, 256, 4, od.p.string());
      const auto op = tokens(70, other.V, 1);
      std::vector<float> l;
      prefill(*other.model, *oc.kv, oc.pc.get(), 0, op, l);
      oc.pc->release(0, op);
      oc.pc->flush();
      auto of = block_files(od.p);
      ASSERT_EQ(of.size(), 1u);
      fs::copy_file(of[0], f.parent_path() / of[0].filename());
    }
    if (mode == 4) std::ofstream(f.parent_path() / "0123456789abcdef.pgkv") << "not a block file";
    Cached c(*e.model, 1, 256, 4, dir.p.string());
    std::vector<float> l2;
    const PrefixHit hit = prefill(*e.model, *c.kv, c.pc.get(), 0, p2, l2);
    if (mode <= 2) {
      EXPECT_EQ(hit.n_tokens, 0);
      EXPECT_TRUE(same(l2, ref)) << "a miss computes everything";
      EXPECT_EQ(block_files(dir.p).size(), 0u);
      EXPECT_EQ(block_files(dir.p, true).size(), 1u) << "quarantined";
    } else {
      EXPECT_EQ(hit.n_disk, 70) << "the good file still serves";
      EXPECT_EQ(block_files(dir.p).size(), 1u);
      EXPECT_EQ(block_files(dir.p, true).size(), 1u);
    }
    c.pc->release(0, p2);
  }
}

// The tail section of a block file (its cells, its snapshot, its tokens in the header) is covered
// like the rest: a flipped byte in it or a cut inside it quarantines the file and the request is a miss
// computed as without the cache; so is a version 1 file (found at the scan, by its version).
TEST(PrefixCache, CorruptOrTruncatedTailSectionIsRejected) {
  for (const char* file : {"tiny-qwen3-f16.gguf", "tiny-qwen35-f16.gguf"}) {
    SCOPED_TRACE(file);
    Env e(file);
    const auto p1 = tokens(70, e.V, 1), p2 = cat(p1, tokens(21, e.V, 2));
    std::vector<Chunk> miss;  // a miss's forwards (hybrid: stopping at p2's last boundary)
    prefill_chunks(miss, p2, 0, e.model->config().has_recurrent());
    const auto ref = run_chunks(*e.model, miss);
    for (int mode = 0; mode < 5; ++mode) {
      SCOPED_TRACE(mode);
      TempDir dir;
      {
        Cached c(*e.model, 1, 256, 4, dir.p.string());
        std::vector<float> l;
        prefill(*e.model, *c.kv, c.pc.get(), 0, p1, l);
        c.pc->release(0, p1);
        c.pc->flush();
      }
      auto files = block_files(dir.p);
      ASSERT_EQ(files.size(), 1u);
      const fs::path f = files[0];
      const uint64_t size = fs::file_size(f);
      std::vector<uint8_t> bytes(size);
      std::ifstream(f, std::ios::binary).read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
      BlockFileHeader h;
      std::string why;
      ASSERT_TRUE(parse_block_file_header(bytes, size, h, why)) << why;
      ASSERT_EQ(h.tail_cells, 6u);
      const uint64_t tail = h.header_bytes + h.tail_at();
      if (mode == 0) flip_byte(f, tail + h.tail_bytes() / 2);  // a tail cell's K/V (found at load: the checksum)
      if (mode == 1) flip_byte(f, h.tail_snapshot_at() < h.payload_bytes() ? h.header_bytes + h.tail_snapshot_at() + 5 : size - 1);  // its snapshot (hybrid), else its last byte
      if (mode == 2) flip_byte(f, h.header_bytes - 16 - 4 * 6 + 8);  // a tail token in the header (found at the scan)
      if (mode == 3) fs::resize_file(f, tail + h.tail_bytes() / 3);  // cut inside the tail
      if (mode == 4) {  // a version 1 file (its version field; the parser reads no further)
        std::fstream v(f, std::ios::in | std::ios::out | std::ios::binary);
        v.seekp(8);
        v.put(1);
      }
      Cached c(*e.model, 1, 256, 4, dir.p.string());
      std::vector<float> l2;
      const PrefixHit hit = prefill(*e.model, *c.kv, c.pc.get(), 0, p2, l2);
      EXPECT_EQ(hit.n_tokens, 0);
      EXPECT_TRUE(same(l2, ref)) << "a miss computes everything";
      EXPECT_EQ(block_files(dir.p).size(), 0u);
      EXPECT_EQ(block_files(dir.p, true).size(), 1u) << "quarantined";
      c.pc->release(0, p2);
    }
  }
}

// Two servers on one directory (two caches alive at once, writing the same and different chains):
// every file a third one scans is valid, and each serves the other's chain after a restart.
TEST(PrefixCache, TwoServersShareOneDirectory) {
  Env e("tiny-qwen3-f16.gguf");
  TempDir dir;
  const auto common = tokens(70, e.V, 1), a_only = tokens(70, e.V, 2), b_only = tokens(70, e.V, 3);
  {
    Cached a(*e.model, 1, 256, 4, dir.p.string()), b(*e.model, 1, 256, 4, dir.p.string());
    std::vector<float> l;
    for (int round = 0; round < 3; ++round) {
      for (auto* c : {&a, &b}) {
        const auto& own = c == &a ? a_only : b_only;
        for (const auto* p : {&common, &own}) {
          prefill(*e.model, *c->kv, c->pc.get(), 0, *p, l);
          c->pc->release(0, *p);
        }
      }
    }
    a.pc->flush();
    b.pc->flush();
  }
  EXPECT_EQ(block_files(dir.p).size(), 3u);
  EXPECT_EQ(block_files(dir.p, true).size(), 0u) << "nothing broken";
  Cached c(*e.model, 1, 256, 4, dir.p.string());
  EXPECT_EQ(c.pc->stats().disk_files, 3u);
  std::vector<float> l;
  for (const auto* p : {&common, &a_only, &b_only}) {
    const auto q = cat(*p, tokens(5, e.V, 9));
    EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 0, q, l).n_disk, 70) << "4 blocks and the tail";
    c.pc->release(0, q);
  }
}

// The disk budget is an LRU over files, and a chain extending an earlier one replaces it.
TEST(PrefixCache, DiskBudgetAndSupersededFiles) {
  Env e("tiny-qwen3-f16.gguf");
  TempDir dir;
  KvCacheOptions ko{1, 256, DType::F16, 16};
  engine::PrefixOptions po;
  po.ram_mib = 4;
  po.disk_dir = dir.p.string();
  std::unique_ptr<PrefixCache> pc;
  auto kv = engine::make_cache_with_prefix(*e.model, ko, po, pc);
  std::vector<float> l;
  // a: 2 blocks and a tail of 8 cells; a2: 6 blocks and a tail of 4 (2.5× a's KV).
  const auto a = tokens(40, e.V, 1), a2 = cat(a, tokens(60, e.V, 9));
  prefill(*e.model, *kv, pc.get(), 0, a, l);
  pc->release(0, a);
  pc->flush();
  const uint64_t one = pc->stats().disk_bytes;
  prefill(*e.model, *kv, pc.get(), 0, a2, l);
  pc->release(0, a2);
  pc->flush();
  EXPECT_EQ(pc->stats().disk_files, 1u) << "a's file (its tail the start of a2's block 2) is a prefix of a2's";
  EXPECT_GT(pc->stats().disk_bytes, one);
  kv.reset();
  pc.reset();
  // Budget for about two small files: the oldest goes.
  po.disk_bytes = 2 * one + one / 4;
  kv = engine::make_cache_with_prefix(*e.model, ko, po, pc);
  EXPECT_EQ(pc->stats().disk_files, 0u) << "a2's file is over the new budget";
  for (uint32_t s = 0; s < 3; ++s) {
    const auto p = tokens(40, e.V, 20 + s);
    prefill(*e.model, *kv, pc.get(), 0, p, l);
    pc->release(0, p);
    pc->flush();
  }
  EXPECT_EQ(pc->stats().disk_files, 2u);
  EXPECT_LE(pc->stats().disk_bytes, po.disk_bytes);
}

TEST(PrefixCache, UnwritableDirectoryTurnsTheDiskTierOff) {
  Env e("tiny-qwen3-f16.gguf");
  TempDir dir;
  std::ofstream(dir.p / "file") << "a file, not a directory";  // (root ignores permissions; this fails for anyone)
  Cached c(*e.model, 1, 256, 4, (dir.p / "file" / "sub").string());
  EXPECT_FALSE(c.pc->disk_enabled());
  std::vector<float> l;
  const auto p = tokens(40, e.V, 1);
  prefill(*e.model, *c.kv, c.pc.get(), 0, p, l);
  c.pc->release(0, p);  // still serves from RAM: all but the last token (2 blocks and 7 cells of the tail)
  EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 0, p, l).n_tokens, 39);
}

TEST(PrefixCache, DiskFullOrVanishedDirectoryKeepsServing) {
  Env e("tiny-qwen3-f16.gguf");
  TempDir dir;
  Cached c(*e.model, 1, 256, 4, dir.p.string());
  ASSERT_TRUE(c.pc->disk_enabled());
  fs::remove_all(dir.p);  // every write now fails
  std::vector<float> l;
  const auto p = tokens(40, e.V, 1);
  prefill(*e.model, *c.kv, c.pc.get(), 0, p, l);
  c.pc->release(0, p);
  c.pc->flush();
  EXPECT_FALSE(c.pc->disk_enabled());
  EXPECT_EQ(prefill(*e.model, *c.kv, c.pc.get(), 0, p, l).n_tokens, 39);
  c.pc->release(0, p);
}

TEST(PrefixCache, ByteSizes) {
  EXPECT_EQ(parse_byte_size("20G"), 20ull << 30);
  EXPECT_EQ(parse_byte_size("512M"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("512m"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("1.5G"), 3ull << 29);
  EXPECT_EQ(parse_byte_size("64"), 64ull << 20);
  EXPECT_EQ(parse_byte_size("4096B"), 4096u);
  for (const char* bad : {"", "G", "-1G", "12Q", "1e400", "abc", "nan"}) EXPECT_THROW(parse_byte_size(bad), Error) << bad;
}

// The parser of block files never reads out of bounds and rejects every cut of a valid header and
// every flipped byte — with and without a tail (version 2) — and version 1 files by their version.
TEST(PrefixCache, BlockFileHeaderParser) {
  for (int with_tail = 0; with_tail < 2; ++with_tail) {
    SCOPED_TRACE(with_tail);
    BlockFileHeader h;
    h.model_id = 42;
    h.k_type = 1;
    h.v_type = 1;
    h.block_size = 4;
    h.n_blocks = 2;
    h.block_bytes = 12;  // 3 bytes per cell
    h.keys = {7, 8};
    h.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
    if (with_tail) {
      h.tail_tokens = {9, 10, 11};
      h.tail_cells = 3;
      h.tail_key = 99;
    }
    const uint64_t payload = 2 * 12 + (with_tail ? 9 : 0);
    EXPECT_EQ(h.payload_bytes(), payload);
    const auto bytes = make_block_file_header(h);
    BlockFileHeader g;
    std::string why;
    ASSERT_TRUE(parse_block_file_header(bytes, bytes.size() + payload, g, why)) << why;
    EXPECT_EQ(g.version, 2u);
    EXPECT_EQ(g.keys, h.keys);
    EXPECT_EQ(g.tokens, h.tokens);
    EXPECT_EQ(g.tail_tokens, h.tail_tokens);
    EXPECT_EQ(g.tail_key, h.tail_key);
    EXPECT_EQ(g.tail_at(), 24u);
    EXPECT_FALSE(parse_block_file_header(bytes, bytes.size() + payload - 1, g, why)) << "truncated payload (the tail's last byte)";
    for (size_t n = 0; n < bytes.size(); ++n) {
      const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_FALSE(parse_block_file_header(cut, bytes.size() + payload, g, why));
    }
    for (size_t i = 0; i < bytes.size(); ++i) {
      auto bad = bytes;
      bad[i] ^= 1;
      EXPECT_FALSE(parse_block_file_header(bad, bytes.size() + payload, g, why)) << "flipped byte " << i;
    }
    // A version 1 file: rejected by its version, saying so.
    auto v1 = bytes;
    v1[8] = 1;
    EXPECT_FALSE(parse_block_file_header(v1, v1.size() + payload, g, why));
    EXPECT_NE(why.find("version 1"), std::string::npos) << why;
  }
  // Inconsistent tail fields, each with a valid header checksum: a tail as long as a block, a tail key
  // without a tail, a snapshot depth past the chain or on an attention file, cells of unequal size.
  auto bad_header = [](auto edit) {
    BlockFileHeader h;
    h.block_size = 4;
    h.n_blocks = 1;
    h.block_bytes = 8;
    h.keys = {7};
    h.tokens = {1, 2, 3, 4};
    edit(h);
    h.tail_cells = static_cast<uint32_t>(h.tail_tokens.size());
    const auto bytes = make_block_file_header(h);
    BlockFileHeader g;
    std::string why;
    return !parse_block_file_header(bytes, bytes.size() + h.payload_bytes(), g, why) && !why.empty();
  };
  EXPECT_FALSE(bad_header([](BlockFileHeader&) {})) << "the unedited header is valid";
  EXPECT_TRUE(bad_header([](BlockFileHeader& h) { h.tail_tokens = {1, 2, 3, 4}, h.tail_key = 5; }));
  EXPECT_TRUE(bad_header([](BlockFileHeader& h) { h.tail_key = 5; }));
  EXPECT_TRUE(bad_header([](BlockFileHeader& h) { h.tail_tokens = {1}; }));
  EXPECT_TRUE(bad_header([](BlockFileHeader& h) { h.snap_depth = 1; }));
  EXPECT_TRUE(bad_header([](BlockFileHeader& h) { h.snapshot_bytes = 16, h.snap_depth = 2; }));
  EXPECT_TRUE(bad_header([](BlockFileHeader& h) { h.snapshot_bytes = 16; }));
  EXPECT_TRUE(bad_header([](BlockFileHeader& h) { h.block_bytes = 9; }));
  EXPECT_FALSE(bad_header([](BlockFileHeader& h) { h.snapshot_bytes = 16, h.tail_tokens = {1}, h.tail_key = 5; })) << "hybrid, tail only";
}

}  // namespace
}  // namespace pg
