// The engine's request loop on a real (tiny) model: batched decoding gives the tokens of one-at-a-time
// decoding, stop strings split over tokens never leak, cancellation and deadlines free slots, and
// requests beyond the slot count wait their turn.
#include <gtest/gtest.h>

#include <thread>

#include "backend/factory.h"
#include "engine/scheduler.h"
#include "engine/stop_matcher.h"
#include "gguf/gguf.h"
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

Loaded load_stories() {
  Loaded r;
  BackendOptions bo;
  bo.device = "cpu";
  bo.cpu.n_threads = 2;
  r.backend = create_backend(bo);
  r.model = Model::load(test::shared_path("testdata/models/stories260K.gguf").string(), *r.backend);
  r.tok = tok::Tokenizer::from_gguf(r.model->file());
  return r;
}

// Each Scheduler gets a model of its own: a Model keeps per-cache scratch, and one model serving
// caches of different shapes in turn is not what the server does.
Loaded& stories() {
  static Loaded l = load_stories();
  return l;
}

template <class D>
void mark_continuation(D& d) {
  if constexpr (requires { d.continuation(); }) d.continuation();
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

struct Result {
  std::vector<int32_t> ids;
  std::string text;
  Event last;
};

Result drain(RequestHandle& h, std::chrono::seconds limit = 120s) {
  Result r;
  const auto end = Clock::now() + limit;
  Event e;
  while (Clock::now() < end) {
    if (!h.next(e, 100ms)) continue;
    for (auto& t : e.tokens) r.ids.push_back(t.id);
    r.text += e.text;
    if (e.done) {
      r.last = e;
      return r;
    }
  }
  ADD_FAILURE() << "request " << h.id() << " did not finish in time";
  return r;
}

RequestSpec greedy(const std::string& prompt, int max_tokens) {
  auto& l = stories();
  RequestSpec s;
  s.prompt = l.tok->encode(prompt, true, false);
  s.sampling.temperature = 0;
  s.max_tokens = max_tokens;
  return s;
}

const std::vector<std::string> kPrompts = {
    "Once upon a time", "The little dog", "Lily wanted to", "One day, a boy named Tim",
    "The sun was", "Sue and her mom", "In the park there was", "Ben had a red ball",
};

TEST(StopMatcher, HoldsBackPossibleStartsAndNeverLeaks) {
  StopMatcher m({"END", "xyz"});
  EXPECT_EQ(m.push("abc E"), "abc ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("X"), "ENX");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.push("foo EN"), "foo ");
  EXPECT_EQ(m.push("D tail"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.which(), "END");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, EarliestMatchWinsAndFlushReleasesPartialPrefix) {
  StopMatcher m({"bc", "abcd"});
  EXPECT_EQ(m.push("xab"), "x");
  EXPECT_EQ(m.push("c"), "a");
  EXPECT_EQ(m.which(), "bc");
  StopMatcher n({"abcab"});
  EXPECT_EQ(n.push("zzabca"), "zz");
  EXPECT_EQ(n.flush(), "abca");
  StopMatcher none;
  EXPECT_EQ(none.push("anything"), "anything");
}

TEST(StopMatcher, MultiByteCharactersSplitAnywhere) {
  // "é" is two bytes; feeding byte by byte must not release half a stop string.
  const std::string stop = "\xC3\xA9t\xC3\xA9";
  StopMatcher m({stop});
  std::string out;
  const std::string in = "summer \xC3\xA9t\xC3\xA9 done";
  for (char c : in) out += m.push(std::string(1, c));
  EXPECT_EQ(out, "summer ");
  EXPECT_TRUE(m.matched());
}

TEST(Scheduler, BatchedEqualsSequential) {
  auto l = load_stories();
  std::vector<std::vector<int32_t>> sequential;
  {
    auto l1 = load_stories();
    SchedulerOptions o;
    o.n_slots = 1;
    o.n_ctx = 256;
    Scheduler s(*l1.model, *l1.tok, o);
    for (const auto& p : kPrompts) {
      auto h = s.submit(greedy(p, 60));
      sequential.push_back(drain(*h).ids);
    }
  }
  SchedulerOptions o;
  o.n_slots = 4;  // 8 requests on 4 slots: joins and leaves mid-flight, and a queue
  o.n_ctx = 256;
  o.n_batch = 7;  // small: prompts are prefilled in chunks interleaved with decode rows
  Scheduler s(*l.model, *l.tok, o);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    hs.push_back(s.submit(greedy(kPrompts[i], 20 + static_cast<int>(i) * 3)));
  }
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = drain(*hs[i]);
    const size_t n = static_cast<size_t>(20 + i * 3);
    ASSERT_EQ(r.ids.size(), n) << kPrompts[i];
    const std::vector<int32_t> want(sequential[i].begin(), sequential[i].begin() + static_cast<long>(n));
    EXPECT_EQ(r.ids, want) << kPrompts[i] << "\nbatched:    " << join(r.ids) << "\nsequential: " << join(want);
    EXPECT_EQ(r.last.finish, FinishReason::kLength);
    EXPECT_EQ(r.last.stats.n_generated, static_cast<int>(n));
    EXPECT_EQ(r.last.stats.n_prompt, static_cast<int>(greedy(kPrompts[i], 1).prompt.size()));
  }
  auto m = s.metrics();
  EXPECT_EQ(m.requests_submitted, 8u);
  EXPECT_EQ(m.requests_finished["length"], 8u);
  EXPECT_GT(m.queue_wait.count, 0u);
  // 8 sequences on 4 slots: some steps must have carried several sequences.
  EXPECT_LT(m.steps, m.generated_tokens);
  EXPECT_EQ(m.ttft.count, 8u);
}

TEST(Scheduler, StopStringAcrossTokenBoundariesIsNeverEmitted) {
  auto l = load_stories();
  SchedulerOptions o;
  o.n_slots = 2;
  o.n_ctx = 256;
  Scheduler s(*l.model, *l.tok, o);
  auto full = drain(*s.submit(greedy("Once upon a time", 60)));
  ASSERT_GT(full.text.size(), 30u);
  // Choose a stop string that starts inside one token's text and ends inside a later one.
  std::vector<size_t> ends;  // byte offset where each token's text ends
  {
    tok::Detokenizer d(*l.tok);
    mark_continuation(d);
    size_t off = 0;
    for (int32_t id : full.ids) {
      off += d.push(id).size();
      ends.push_back(off);
    }
  }
  size_t start = 0;
  for (size_t i = 2; i + 2 < ends.size(); ++i)
    if (ends[i + 1] - ends[i] >= 2 && ends[i + 2] > ends[i + 1]) {
      start = ends[i] + 1;  // one byte into token i+1
      break;
    }
  ASSERT_GT(start, 0u);
  size_t stop_end = start;
  while (stop_end < full.text.size() && stop_end < start + 8) ++stop_end;
  const std::string stop = full.text.substr(start, stop_end - start);
  const size_t first = full.text.find(stop);
  auto req = greedy("Once upon a time", 60);
  req.stop = {"NEVER-THERE", stop};
  auto h = s.submit(req);
  // Read event by event: no partial prefix of the stop string may appear at any point.
  std::string streamed;
  Event e;
  while (h->next(e, 30s)) {
    streamed += e.text;
    if (e.done) break;
  }
  EXPECT_EQ(streamed, full.text.substr(0, first));
  EXPECT_EQ(e.finish, FinishReason::kStop);
  EXPECT_EQ(e.stop_word, stop);
}

TEST(Scheduler, CancellationFreesTheSlotWithinAStep) {
  auto l = load_stories();
  SchedulerOptions o;
  o.n_slots = 1;
  o.n_ctx = 512;
  Scheduler s(*l.model, *l.tok, o);
  auto req = greedy("Once upon a time", 500);
  req.stop_at_eog = false;
  auto h = s.submit(req);
  Event e;
  int got = 0;
  while (got < 3 && h->next(e, 30s)) got += static_cast<int>(e.tokens.size());
  ASSERT_GE(got, 3);
  EXPECT_GT(s.metrics().kv_blocks_used, 0);
  h->cancel();
  Result r = drain(*h, 30s);
  EXPECT_EQ(r.last.finish, FinishReason::kCancelled);
  EXPECT_LT(r.last.stats.n_generated, 500);
  // The freed slot takes the next request at once.
  auto r2 = drain(*s.submit(greedy("The little dog", 5)), 30s);
  EXPECT_EQ(r2.last.finish, FinishReason::kLength);
  for (int i = 0; i < 50 && s.metrics().active != 0; ++i) std::this_thread::sleep_for(10ms);
  auto m = s.metrics();
  EXPECT_EQ(m.active, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.requests_finished["cancelled"], 1u);
}

TEST(Scheduler, QueueBeyondSlotsAndCancelWhileQueued) {
  auto l = load_stories();
  SchedulerOptions o;
  o.n_slots = 2;
  o.n_ctx = 4096;
  Scheduler s(*l.model, *l.tok, o);
  // Two long requests hold both slots until cancelled; three more must wait.
  auto long_req = greedy("Once upon a time", 4000);
  long_req.stop_at_eog = false;
  auto a = s.submit(long_req), b = s.submit(long_req);
  Event e;
  ASSERT_TRUE(a->next(e, 30s));
  ASSERT_TRUE(b->next(e, 30s));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 3; ++i) {
    auto r = greedy(kPrompts[static_cast<size_t>(i)], 30);
    r.stop_at_eog = false;
    hs.push_back(s.submit(r));
  }
  EXPECT_EQ(s.metrics().queued, 3);
  EXPECT_EQ(s.metrics().active, 2);
  hs.back()->cancel();  // cancelled while queued: never takes a slot
  auto cancelled = drain(*hs.back());
  EXPECT_EQ(cancelled.last.finish, FinishReason::kCancelled);
  EXPECT_EQ(cancelled.last.stats.n_generated, 0);
  EXPECT_FALSE(hs[0]->finished());
  a->cancel();
  b->cancel();
  EXPECT_EQ(drain(*a).last.finish, FinishReason::kCancelled);
  EXPECT_EQ(drain(*b).last.finish, FinishReason::kCancelled);
  for (size_t i = 0; i + 1 < hs.size(); ++i) {
    auto r = drain(*hs[i]);
    EXPECT_EQ(r.last.finish, FinishReason::kLength);
    EXPECT_EQ(r.ids.size(), 30u);
    EXPECT_GT(r.last.stats.queue_ms, 0.0);
  }
}

TEST(Scheduler, RejectsBeforeAnyWork) {
  auto l = load_stories();
  SchedulerOptions o;
  o.n_slots = 1;
  o.n_ctx = 64;
  o.max_queue = 1;
  Scheduler s(*l.model, *l.tok, o);
  auto kind_of = [&](RequestSpec r) {
    try {
      s.submit(std::move(r));
    } catch (const RejectError& e) {
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  auto r = greedy("Once upon a time", 60);  // prompt + 60 > 64
  EXPECT_EQ(kind_of(r), static_cast<int>(RejectError::Kind::kContextOverflow));
  r.max_tokens = 0;
  EXPECT_EQ(kind_of(r), static_cast<int>(RejectError::Kind::kInvalid));
  r.max_tokens = 4;
  r.prompt.clear();
  EXPECT_EQ(kind_of(r), static_cast<int>(RejectError::Kind::kInvalid));
  r = greedy("hi", 4);
  r.prompt.push_back(100000);
  EXPECT_EQ(kind_of(r), static_cast<int>(RejectError::Kind::kInvalid));
  r = greedy("hi", 4);
  r.sampling.temperature = std::nanf("");
  EXPECT_EQ(kind_of(r), static_cast<int>(RejectError::Kind::kInvalid));
  EXPECT_EQ(s.metrics().requests_submitted, 0u);
  EXPECT_EQ(s.metrics().requests_rejected, 5u);
}

TEST(Scheduler, DeadlineEndsARequest) {
  auto l = load_stories();
  SchedulerOptions o;
  o.n_slots = 1;
  o.n_ctx = 4096;
  Scheduler s(*l.model, *l.tok, o);
  auto r = greedy("Once upon a time", 4000);
  r.stop_at_eog = false;
  r.deadline = Clock::now() + 200ms;
  auto res = drain(*s.submit(r), 30s);
  EXPECT_EQ(res.last.finish, FinishReason::kTimeout);
  EXPECT_LT(res.last.stats.n_generated, 4000);
}

TEST(Scheduler, LogprobsAndSeededSamplingAreReproducible) {
  auto l = load_stories();
  SchedulerOptions o;
  o.n_slots = 2;
  o.n_ctx = 256;
  Scheduler s(*l.model, *l.tok, o);
  auto r = greedy("Once upon a time", 12);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 1234;
  r.logprobs = 3;
  auto a = s.submit(r);
  auto b = s.submit(r);  // decoded in the same steps as `a`
  auto ra = drain(*a), rb = drain(*b);
  EXPECT_EQ(ra.ids, rb.ids);
  EXPECT_EQ(ra.text, rb.text);
  // Logprobs ride on every token.
  Event e;
  auto c = s.submit(r);
  std::vector<TokenOut> toks;
  while (c->next(e, 30s)) {
    for (auto& t : e.tokens) toks.push_back(t);
    if (e.done) break;
  }
  ASSERT_FALSE(toks.empty());
  for (const auto& t : toks) {
    EXPECT_LE(t.logprob, 0.0f);
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_GE(t.top[0].logprob, t.logprob);
  }
}


// Speculation inside the continuous-batching loop: several streams speculate in the same steps (with
// the n-gram drafter and a draft model), their token streams, concatenated texts and finish reasons
// are those of plain decoding whatever the event chunking, and cancellation frees a speculating slot
// (its draft state included) within a step.
TEST(Scheduler, SpeculativeStreamsEqualPlainAndCancel) {
  auto plain_l = load_stories();
  SchedulerOptions o;
  o.n_slots = 4;
  o.n_ctx = 512;
  std::vector<Result> plain;
  {
    Scheduler s(*plain_l.model, *plain_l.tok, o);
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (const auto& p : kPrompts) hs.push_back(s.submit(greedy(p, 60)));
    for (auto& h : hs) plain.push_back(drain(*h));
  }
  for (auto type : {spec::SpecType::kNgram, spec::SpecType::kDraft}) {
    auto l = load_stories();
    auto draft = load_stories();  // the same weights as a draft: a separate model instance with its own cache
    SchedulerOptions so = o;
    so.spec.type = type;
    so.spec.n_max = 4;
    so.spec.draft = draft.model.get();
    Scheduler s(*l.model, *l.tok, so);
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (const auto& p : kPrompts) hs.push_back(s.submit(greedy(p, 60)));
    for (size_t i = 0; i < hs.size(); ++i) {
      Result r = drain(*hs[i]);
      EXPECT_EQ(r.ids, plain[i].ids) << kPrompts[i];
      EXPECT_EQ(r.text, plain[i].text) << kPrompts[i];
      EXPECT_EQ(r.last.finish, plain[i].last.finish) << kPrompts[i];
    }
    EXPECT_GT(s.metrics().spec_rounds, 0u);
    // Cancel a long speculating request: it ends within a step and its slot takes the next one.
    auto req = greedy("Once upon a time", 400);
    req.stop_at_eog = false;
    auto h = s.submit(req);
    Event e;
    int got = 0;
    while (got < 3 && h->next(e, 30s)) got += static_cast<int>(e.tokens.size());
    h->cancel();
    Result r = drain(*h, 30s);
    EXPECT_EQ(r.last.finish, FinishReason::kCancelled);
    EXPECT_EQ(drain(*s.submit(greedy("The little dog", 5)), 30s).last.finish, FinishReason::kLength);
    for (int i = 0; i < 50 && s.metrics().active != 0; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(s.metrics().kv_blocks_used, 0);
  }
}

TEST(Scheduler, SpeculativeOptionsAreChecked) {
  auto l = load_stories();
  SchedulerOptions o;
  o.spec.type = spec::SpecType::kDraft;  // no draft model
  EXPECT_THROW(Scheduler(*l.model, *l.tok, o), Error);
  o.spec.type = spec::SpecType::kNgram;
  o.spec.budget = 0;
  EXPECT_THROW(Scheduler(*l.model, *l.tok, o), Error);
  o.spec.budget = 22;
  o.spec.n_max = 200;
  EXPECT_THROW(Scheduler(*l.model, *l.tok, o), Error);
}

}  // namespace
}  // namespace pg::engine
