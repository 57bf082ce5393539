// The prefix cache inside the engine loop: a chat's next turn reuses the previous turn's blocks (and,
// for hybrid models, its recurrent snapshot), requests running at the same time share cached blocks,
// outputs equal those of an engine without the cache, and the stats count what was served.
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "backend/factory.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace pg::engine {
namespace {

using namespace std::chrono_literals;

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<tok::Tokenizer> tok;
};

// A model per scheduler: a Model keeps per-cache scratch.
Loaded load(const std::string& rel) {
  Loaded r;
  BackendOptions bo;
  bo.device = "cpu";
  bo.cpu.n_threads = 2;
  r.backend = create_backend(bo);
  r.model = Model::load(test::shared_path(rel).string(), *r.backend);
  r.tok = tok::Tokenizer::from_gguf(r.model->file());
  return r;
}

std::vector<int32_t> tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t;
  // Ids from the middle of the vocabulary: no control tokens.
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(vocab / 4 + (seed * 7919u + static_cast<uint32_t>(i) * 104729u) % static_cast<uint32_t>(vocab / 2)));
  return t;
}

struct Out {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  RequestStats stats;
};

Out drain(RequestHandle& h) {
  Out r;
  const auto end = Clock::now() + 120s;
  Event e;
  while (Clock::now() < end) {
    if (!h.next(e, 100ms)) continue;
    for (auto& t : e.tokens) {
      r.ids.push_back(t.id);
      r.logprobs.push_back(t.logprob);
    }
    if (e.done) {
      r.stats = e.stats;
      return r;
    }
  }
  ADD_FAILURE() << "request did not finish";
  return r;
}

RequestSpec greedy(std::vector<int32_t> prompt, int max_tokens) {
  RequestSpec s;
  s.prompt = std::move(prompt);
  s.sampling.temperature = 0;
  s.max_tokens = max_tokens;
  s.stop_at_eog = false;
  return s;
}

SchedulerOptions options(int slots, int64_t ram_mib, int n_batch = 512) {
  SchedulerOptions o;
  o.n_slots = slots;
  o.n_ctx = 1024;
  o.n_batch = n_batch;
  o.prefix.ram_mib = ram_mib;
  return o;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Turn 2 = turn 1's prompt + its answer + a new message: served from turn 1's blocks, same tokens as
// without the cache. Attention (llama, gemma3 with its sliding window) and hybrid (qwen35) models;
// a small n_batch so prompts are prefilled in several chunks, as long prompts are. With partial blocks
// (the default) turn 2 reuses all of turn 1's KV, its answer included (hybrid: through the state
// snapshotted at release); with whole blocks only, the full blocks (hybrid: up to the boundary snapshot).
TEST(PrefixScheduler, NextTurnReusesThePreviousTurn) {
  for (const bool partial : {true, false})
    for (const char* rel : {"testdata/models/stories260K.gguf", "golden/models/tiny-gemma3-f16.gguf", "golden/models/tiny-qwen35-f16.gguf"}) {
      SCOPED_TRACE(std::string(rel) + (partial ? " partial blocks" : " whole blocks"));
      Loaded a = load(rel), b = load(rel);
      const int V = a.model->config().n_vocab;
      SchedulerOptions oo = options(2, 16, 96);
      oo.prefix.partial = partial;
      Scheduler on(*a.model, *a.tok, oo), off(*b.model, *b.tok, options(2, 0, 96));
      EXPECT_NE(on.prefix_cache(), nullptr);
      EXPECT_EQ(off.prefix_cache(), nullptr);
      const auto p1 = tokens(300, V, 1);
      const Out t1 = drain(*on.submit(greedy(p1, 8)));
      const Out r1 = drain(*off.submit(greedy(p1, 8)));
      EXPECT_EQ(t1.ids, r1.ids);
      EXPECT_EQ(t1.stats.n_cached, 0);
      const auto p2 = cat(cat(p1, t1.ids), tokens(40, V, 2));
      const Out t2 = drain(*on.submit(greedy(p2, 8)));
      const Out r2 = drain(*off.submit(greedy(p2, 8)));
      EXPECT_EQ(t2.ids, r2.ids);
      // Turn 1 holds KV for its 300 prompt tokens and 7 of its 8 answer tokens (the last one was
      // sampled, never run). Whole blocks: 256 of them (hybrid: its snapshot at 299 / 64 = 4 blocks).
      const int kv1 = static_cast<int>(p1.size() + t1.ids.size()) - 1;
      EXPECT_EQ(t2.stats.n_cached, partial ? kv1 : 256);
      EXPECT_EQ(r2.stats.n_cached, 0);
      // Turn 3 reuses turn 2 (whole blocks: its snapshot at 320 for the hybrid model).
      const auto p3 = cat(cat(p2, t2.ids), tokens(30, V, 3));
      const Out t3 = drain(*on.submit(greedy(p3, 8)));
      EXPECT_EQ(t3.ids, drain(*off.submit(greedy(p3, 8))).ids);
      const int kv2 = static_cast<int>(p2.size() + t2.ids.size()) - 1;
      EXPECT_EQ(t3.stats.n_cached, partial ? kv2 : 320);
      const PrefixStats st = on.prefix_cache()->stats();
      EXPECT_EQ(st.lookups, 3u);
      EXPECT_EQ(st.ram_hit_tokens, partial ? static_cast<uint64_t>(kv1 + kv2) : 576u);
      EXPECT_EQ(st.partial_hit_tokens, partial ? static_cast<uint64_t>(kv1 % 64 + kv2 % 64) : 0u);
      EXPECT_EQ(st.prompt_tokens, p1.size() + p2.size() + p3.size());
    }
}

// Four requests with one cached prefix run together: all share its blocks and each answers as it
// would alone.
TEST(PrefixScheduler, ConcurrentRequestsShareTheCachedPrefix) {
  Loaded a = load("testdata/models/stories260K.gguf"), b = load("testdata/models/stories260K.gguf");
  const int V = a.model->config().n_vocab;
  Scheduler on(*a.model, *a.tok, options(4, 16)), off(*b.model, *b.tok, options(4, 0));
  const auto sys = tokens(200, V, 7);
  drain(*on.submit(greedy(sys, 4)));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  std::vector<std::vector<int32_t>> ps;
  for (uint32_t i = 0; i < 4; ++i) {
    ps.push_back(cat(sys, tokens(20 + 5 * static_cast<int>(i), V, 10 + i)));
    hs.push_back(on.submit(greedy(ps.back(), 12)));
  }
  for (size_t i = 0; i < hs.size(); ++i) {
    const Out o = drain(*hs[i]);
    // The 3 full blocks, and the 8 cells of the tail (sys's last tokens and the answer) that each
    // prompt shares, copied into a block of its own.
    EXPECT_EQ(o.stats.n_cached, 200) << i;
    EXPECT_EQ(o.ids, drain(*off.submit(greedy(ps[i], 12))).ids) << i;
  }
}

// Speculative decoding: sequences end inside verify steps with rejected drafts' rows in the cache past
// their last accepted token; only the accepted history may be cached. The next turn equals the
// engine without the cache (and speculation is lossless, so both equal plain decoding).
TEST(PrefixScheduler, SpeculativeSequencesCacheOnlyAcceptedRows) {
  Loaded a = load("testdata/models/stories260K.gguf"), b = load("testdata/models/stories260K.gguf");
  const int V = a.model->config().n_vocab;
  SchedulerOptions so = options(2, 16), sb = options(2, 0);
  so.spec.type = sb.spec.type = spec::SpecType::kNgram;
  so.spec.n_max = sb.spec.n_max = 6;
  // Small blocks: a sequence's last (bonus) token often ends a full block, the case to get right.
  so.kv_block_size = sb.kv_block_size = 4;
  Scheduler on(*a.model, *a.tok, so), off(*b.model, *b.tok, sb);
  // Repetitive prompts, so the n-gram drafter drafts (and is sometimes wrong).
  std::vector<int32_t> p;
  for (int r = 0; r < 12; ++r) {
    const auto piece = tokens(11 + r % 3, V, static_cast<uint32_t>(r % 4));
    p.insert(p.end(), piece.begin(), piece.end());
  }
  for (int turn = 0; turn < 4; ++turn) {
    SCOPED_TRACE(turn);
    // A few max_tokens values so some sequences end mid-verify.
    RequestSpec rq = greedy(p, 9 + 7 * turn);
    rq.logprobs = 0;
    const Out x = drain(*on.submit(rq));
    const Out y = drain(*off.submit(rq));
    EXPECT_EQ(x.ids, y.ids);
    ASSERT_EQ(x.logprobs.size(), y.logprobs.size());
    for (size_t i = 0; i < x.logprobs.size(); ++i) EXPECT_NEAR(x.logprobs[i], y.logprobs[i], 1e-4) << i;
    if (turn > 0) {
      EXPECT_GT(x.stats.n_cached, 0);
    }
    p = cat(cat(p, x.ids), tokens(13, V, 40 + static_cast<uint32_t>(turn)));
  }
  EXPECT_GT(on.metrics().spec_rounds, 0u);
}

// The disk tier through the engine: a new scheduler (a restarted server) on the same directory serves
// a prompt the first one saw, and reports it as a disk hit.
TEST(PrefixScheduler, RestartedEngineHitsTheDiskTier) {
  const auto dir = std::filesystem::temp_directory_path() / ("pg_prefix_sched_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  Loaded a = load("testdata/models/stories260K.gguf");
  const int V = a.model->config().n_vocab;
  const auto p = tokens(300, V, 5);
  SchedulerOptions o = options(1, 16);
  o.prefix.disk_dir = dir.string();
  Out first;
  {
    Scheduler s(*a.model, *a.tok, o);
    first = drain(*s.submit(greedy(p, 6)));
    s.shutdown();
    s.prefix_cache()->flush();
  }
  Loaded b = load("testdata/models/stories260K.gguf");
  Scheduler s(*b.model, *b.tok, o);
  const Out again = drain(*s.submit(greedy(p, 6)));
  EXPECT_EQ(again.ids, first.ids);
  // All but the last prompt token, as a RAM hit: 4 blocks of 64 and 43 cells of the file's tail (the
  // first request's prompt and answer past position 256).
  EXPECT_EQ(again.stats.n_cached, 299);
  EXPECT_EQ(again.stats.n_cached_disk, 299);
  EXPECT_EQ(s.prefix_cache()->stats().disk_hit_tokens, 299u);
  EXPECT_EQ(s.prefix_cache()->stats().partial_hit_tokens, 43u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pg::engine
