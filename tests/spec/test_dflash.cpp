// DFlash drafting through the engine's step loop is lossless: greedy output with the bundled DFlash
// draft (chain and DDTree, four sequences speculating in the same steps) is token-identical to plain
// greedy decoding of the bundled target, and the draft is accepted often (features captured from the
// step's own forward reach the drafter for prompt, decode and accepted verify rows).
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "model/dflash.h"
#include "model/model.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace pg::engine {
namespace {

using namespace std::chrono_literals;

std::vector<int32_t> drain(RequestHandle& h) {
  std::vector<int32_t> ids;
  Event e;
  const auto end = Clock::now() + 300s;
  while (Clock::now() < end) {
    if (!h.next(e, 100ms)) continue;
    for (auto& t : e.tokens) ids.push_back(t.id);
    if (e.done) return ids;
  }
  ADD_FAILURE() << "request did not finish";
  return ids;
}

// The demo's domains (models/README.md), with values the training prompts did not use.
std::vector<std::string> prompts(int n) {
  const char* names[] = {"apple", "harbor", "violet", "marble", "quartz", "lantern", "meadow", "copper"};
  std::vector<std::string> v;
  for (int i = 0; v.size() < static_cast<size_t>(n); ++i) {
    const std::string w = names[i % 8];
    switch (i % 6) {
      case 0: v.push_back("What is " + std::to_string(123 + 37 * i) + " + " + std::to_string(48 + 91 * i) + "?"); break;
      case 1: v.push_back("Reverse the word " + w + "."); break;
      case 2: v.push_back("How many letters are in the word " + w + "?"); break;
      case 3: v.push_back("Convert " + std::to_string(2 + i) + " kilometers to meters."); break;
      case 4: v.push_back("Write a Python function that returns the " + std::string(i % 2 ? "sum" : "maximum") + " of a list."); break;
      default: v.push_back("Write " + w + " in upper case."); break;
    }
  }
  return v;
}

struct Result {
  std::vector<std::vector<int32_t>> outs;
  MetricsSnapshot m;
};

Result run(const SpecOptions& spec_in, bool dflash, int n_prompts) {
  const std::string dir = std::string(PEREGRINE_SOURCE_DIR) + "/models/";
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend be(co);
  auto target = Model::load(dir + "peregrine-demo-target-Q8_0.gguf", be);
  auto tok = tok::Tokenizer::from_gguf(target->file());
  std::unique_ptr<DFlashModel> d;
  SpecOptions spec = spec_in;
  if (dflash) {
    d = DFlashModel::load(dir + "peregrine-demo-dflash-Q8_0.gguf", *target);
    spec.dflash = d.get();
  }
  SchedulerOptions so;
  so.n_slots = 4;
  so.n_ctx = 384;
  so.n_batch = 64;  // prompt chunks share steps with verify rows
  so.spec = spec;
  Scheduler sched(*target, *tok, so);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& q : prompts(n_prompts)) {
    RequestSpec r;
    r.prompt = tok->encode("<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n", false, true);
    r.sampling.temperature = 0;
    r.max_tokens = 96;
    hs.push_back(sched.submit(r));
  }
  Result res;
  for (auto& h : hs) res.outs.push_back(drain(*h));
  res.m = sched.metrics();
  return res;
}

SpecOptions dflash_spec(int n_max, int budget) {
  SpecOptions s;
  s.type = spec::SpecType::kDFlash;
  s.n_max = n_max;
  s.tree = budget > 0;
  if (s.tree) s.budget = budget;
  return s;
}

void expect_identical(const Result& plain, const Result& sp, const char* what) {
  int same = 0;
  for (size_t i = 0; i < plain.outs.size(); ++i) {
    EXPECT_EQ(sp.outs[i], plain.outs[i]) << what << ", prompt " << i;
    same += sp.outs[i] == plain.outs[i];
  }
  EXPECT_EQ(same, static_cast<int>(plain.outs.size())) << what;
  std::printf("%s: drafted %llu accepted %llu rounds %llu mean_accept_len %.2f\n", what, static_cast<unsigned long long>(sp.m.spec_drafted),
              static_cast<unsigned long long>(sp.m.spec_accepted), static_cast<unsigned long long>(sp.m.spec_rounds),
              sp.m.spec_mean_accept_len());
}

TEST(DFlashLossless, GreedyIdenticalChainAndDDTree) {
  const int n = 24;
  const Result plain = run({}, false, n);
  const Result chain = run(dflash_spec(8, 0), true, n);
  expect_identical(plain, chain, "DFlash chain n_max 8");
  const Result tree = run(dflash_spec(8, 22), true, n);
  expect_identical(plain, tree, "DFlash DDTree budget 22");
  const Result full = run(dflash_spec(15, 0), true, n);
  expect_identical(plain, full, "DFlash chain n_max 15 (whole block)");
  // The draft was trained on the target's own outputs: it must be accepted far more than chance.
  EXPECT_GT(chain.m.spec_mean_accept_len(), 2.0);
  EXPECT_GT(tree.m.spec_mean_accept_len(), chain.m.spec_mean_accept_len() - 0.25);
}

// Requests one after another (one slot, as `peregrine bench --draft` runs them), all starting with the
// same long system prompt, so every request after the first gets a prefix-cache hit (full blocks and a
// partly reused one). DFlash drafts from the target's features of every context position, which only a
// prefill makes: before the fix the hit skipped those positions and only the first request drafted.
struct PrefixRun {
  std::vector<std::vector<int32_t>> outs;
  std::vector<RequestStats> stats;
};

PrefixRun run_shared_prefix(const SpecOptions& spec_in, bool dflash, int n_requests) {
  const std::string dir = std::string(PEREGRINE_SOURCE_DIR) + "/models/";
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend be(co);
  auto target = Model::load(dir + "peregrine-demo-target-Q8_0.gguf", be);
  auto tok = tok::Tokenizer::from_gguf(target->file());
  std::unique_ptr<DFlashModel> d;
  SpecOptions spec = spec_in;
  if (dflash) {
    d = DFlashModel::load(dir + "peregrine-demo-dflash-Q8_0.gguf", *target);
    spec.dflash = d.get();
  }
  SchedulerOptions so;
  so.n_slots = 1;
  so.n_ctx = 512;
  so.n_batch = 64;
  so.spec = spec;
  so.prefix.ram_mib = 64;  // the prefix cache on (explicitly: the test is about its hits)
  Scheduler sched(*target, *tok, so);
  const std::string system =
      "<|im_start|>system\nYou are a careful assistant. Answer arithmetic exactly, spell words letter by letter when asked, "
      "convert units with the metric prefixes, and write short Python functions with a docstring. Keep every answer short, "
      "plain and correct, and never add anything the question did not ask for.<|im_end|>\n";
  PrefixRun res;
  const std::vector<std::string> qs = prompts(n_requests);
  for (const auto& q : qs) {
    RequestSpec r;
    r.prompt = tok->encode(system + "<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n", false, true);
    r.sampling.temperature = 0;
    r.max_tokens = 48;
    auto h = sched.submit(r);
    std::vector<int32_t> ids;
    Event e;
    const auto end = Clock::now() + 300s;
    while (Clock::now() < end) {
      if (!h->next(e, 100ms)) continue;
      for (auto& t : e.tokens) ids.push_back(t.id);
      if (e.done) break;
    }
    EXPECT_TRUE(e.done) << "request did not finish";
    res.outs.push_back(std::move(ids));
    res.stats.push_back(e.stats);
  }
  return res;
}

TEST(DFlashPrefix, DraftsForEveryRequestAfterPrefixHits) {
  const int n = 4;
  const PrefixRun plain = run_shared_prefix({}, false, n);
  // The plain run's later requests do hit the prefix cache (the shared system prompt is > 1 block):
  // the scenario the bug needs.
  for (int i = 1; i < n; ++i) EXPECT_GE(plain.stats[static_cast<size_t>(i)].n_cached, 64) << "request " << i;
  for (const SpecOptions& sp : {dflash_spec(8, 0), dflash_spec(8, 22)}) {
    const PrefixRun r = run_shared_prefix(sp, true, n);
    for (int i = 0; i < n; ++i) {
      const RequestStats& st = r.stats[static_cast<size_t>(i)];
      EXPECT_GT(st.draft_n, 0) << (sp.tree ? "DDTree" : "chain") << ", request " << i << " (n_cached " << st.n_cached << ")";
      EXPECT_EQ(r.outs[static_cast<size_t>(i)], plain.outs[static_cast<size_t>(i)]) << (sp.tree ? "DDTree" : "chain") << ", request " << i;
      std::printf("%s request %d: n_cached %d drafted %d accepted %d rounds %d\n", sp.tree ? "DDTree" : "chain", i, st.n_cached,
                  st.draft_n, st.draft_n_accepted, st.draft_rounds);
    }
  }
}

// SchedulerOptions::spec_phases (the `bench --draft` spec-phases line): with one slot every step that
// verifies is one verify round, so the phase sums cover exactly spec_rounds steps; drafting and the verify
// forward take time, and the four phases of a step never add up to more than the steps' busy time. Off:
// nothing is summed.
TEST(SpecPhases, SumsEveryVerifyStep) {
  const std::string dir = std::string(PEREGRINE_SOURCE_DIR) + "/models/";
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend be(co);
  auto target = Model::load(dir + "peregrine-demo-target-Q8_0.gguf", be);
  auto tok = tok::Tokenizer::from_gguf(target->file());
  auto d = DFlashModel::load(dir + "peregrine-demo-dflash-Q8_0.gguf", *target);
  for (const bool on : {true, false}) {
    SchedulerOptions so;
    so.n_slots = 1;
    so.n_ctx = 256;
    so.n_batch = 64;
    so.spec = dflash_spec(8, 0);
    so.spec.dflash = d.get();
    so.spec_phases = on;
    MetricsSnapshot m;
    {
      Scheduler sched(*target, *tok, so);
      RequestSpec r;
      r.prompt = tok->encode("<|im_start|>user\nReverse the word lantern.<|im_end|>\n<|im_start|>assistant\n", false, true);
      r.sampling.temperature = 0;
      r.max_tokens = 32;
      drain(*sched.submit(r));
      sched.shutdown();  // the last step's counters land after its tokens are delivered
      m = sched.metrics();
    }
    ASSERT_GT(m.spec_rounds, 0u);
    if (!on) {
      EXPECT_EQ(m.phase_steps, 0u);
      EXPECT_EQ(m.phase_draft_s + m.phase_verify_s + m.phase_commit_s + m.phase_other_s, 0.0);
      continue;
    }
    EXPECT_EQ(m.phase_steps, m.spec_rounds);
    EXPECT_GT(m.phase_draft_s, 0.0);
    EXPECT_GT(m.phase_verify_s, 0.0);
    EXPECT_GE(m.phase_commit_s, 0.0);
    EXPECT_GE(m.phase_other_s, 0.0);
    EXPECT_LE(m.phase_draft_s + m.phase_verify_s + m.phase_commit_s + m.phase_other_s, m.busy_seconds * (1 + 1e-9));
    std::printf("spec-phases over %llu steps: draft %.3f verify %.3f commit %.3f other %.3f ms/step\n",
                static_cast<unsigned long long>(m.phase_steps), 1e3 * m.phase_draft_s / m.phase_steps,
                1e3 * m.phase_verify_s / m.phase_steps, 1e3 * m.phase_commit_s / m.phase_steps, 1e3 * m.phase_other_s / m.phase_steps);
  }
}

}  // namespace
}  // namespace pg::engine
