// The device-fed greedy chain of the draft-model drafter (ModelDrafterOptions::device_chain: every
// depth's token ids read on the backend from the last depth's argmax, one download per step) proposes
// exactly the drafts of the per-depth path, step after step with rolled-back histories, for several
// slots at once, on golden tiny models and the bundled draft; requests it does not take (trees, p-min,
// unequal depths, hybrid drafts) fall back and match too.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "spec/drafter.h"
#include "testutil.h"

namespace pg::spec {
namespace {

struct Query {
  std::vector<int32_t> history;
  int n_max = 8, k = 1;
  float p_min = 0;
};

// Runs `steps` drafting steps of both drafters on the same queries; after each step every history
// takes a random accepted prefix of the (shared) chain plus one token, as a verifier would.
void compare(const std::string& path, int n_slots, int steps, bool vary, uint64_t* device_steps) {
  CpuBackend be(CpuOptions{});
  auto m = Model::load(path, be);
  const int n_vocab = m->config().n_vocab;
  auto per_depth = make_model_drafter(*m, n_slots, 256, 16, ModelDrafterOptions{false});
  auto device = make_model_drafter(*m, n_slots, 256, 16, ModelDrafterOptions{true});
  std::mt19937 rng(7);
  std::vector<Query> qs(static_cast<size_t>(n_slots));
  for (int s = 0; s < n_slots; ++s)
    for (int i = 0; i < 3 + 2 * s; ++i) qs[static_cast<size_t>(s)].history.push_back(static_cast<int32_t>(rng() % n_vocab));
  for (int step = 0; step < steps; ++step) {
    std::vector<DraftInput> in(static_cast<size_t>(n_slots));
    for (int s = 0; s < n_slots; ++s) {
      Query& q = qs[static_cast<size_t>(s)];
      if (vary) {
        // Every third step some slot asks for a tree, p-min or another depth: the fallback path.
        q.n_max = step % 3 == 2 && s == 0 ? 5 : 8;
        q.k = step % 3 == 1 && s == 1 ? 3 : 1;
        q.p_min = step % 6 == 4 ? 0.3f : 0.0f;
      }
      in[static_cast<size_t>(s)] = DraftInput{s, q.history, q.n_max, q.k, q.p_min, nullptr};
    }
    std::vector<Draft> a(in.size()), b(in.size());
    per_depth->propose(in, a);
    device->propose(in, b);
    for (int s = 0; s < n_slots; ++s) {
      const Draft& da = a[static_cast<size_t>(s)];
      const Draft& db = b[static_cast<size_t>(s)];
      ASSERT_EQ(da.chain, db.chain) << path << " step " << step << " slot " << s;
      ASSERT_EQ(da.topk.size(), db.topk.size());
      for (size_t d = 0; d < da.topk.size(); ++d) {
        EXPECT_EQ(da.topk[d].ids, db.topk[d].ids);
        EXPECT_EQ(da.topk[d].logprobs, db.topk[d].logprobs);
      }
      // Accept a random prefix, then a "bonus" token of the target (random here).
      Query& q = qs[static_cast<size_t>(s)];
      const size_t acc = da.chain.empty() ? 0 : rng() % (da.chain.size() + 1);
      q.history.insert(q.history.end(), da.chain.begin(), da.chain.begin() + static_cast<std::ptrdiff_t>(acc));
      q.history.push_back(static_cast<int32_t>(rng() % n_vocab));
    }
  }
  EXPECT_EQ(per_depth->device_chain_steps(), 0u);
  *device_steps = device->device_chain_steps();
}

std::string golden(const std::string& name) { return test::shared_path("golden/models/" + name + ".gguf").string(); }

TEST(DraftDeviceChain, SameDraftsAsPerDepthOnGoldenModels) {
  for (const char* arch : {"qwen3", "llama", "gemma3", "qwen3moe"}) {
    uint64_t dev = 0;
    compare(golden(std::string("tiny-") + arch + "-f16"), 3, 12, false, &dev);
    EXPECT_EQ(dev, 12u) << arch << ": every step is a greedy chain of one depth, so each takes the device path";
  }
}

TEST(DraftDeviceChain, FallsBackForTreesPMinAndUnequalDepths) {
  uint64_t dev = 0;
  compare(golden("tiny-qwen3-f16"), 3, 12, true, &dev);
  EXPECT_GT(dev, 0u);
  EXPECT_LT(dev, 12u);
}

TEST(DraftDeviceChain, HybridDraftKeepsThePerDepthPath) {
  uint64_t dev = 0;
  compare(golden("tiny-qwen35-f16"), 2, 6, false, &dev);
  EXPECT_EQ(dev, 0u);
}

TEST(DraftDeviceChain, SameDraftsAsPerDepthOnTheBundledDraft) {
  uint64_t dev = 0;
  compare(std::string(PEREGRINE_SOURCE_DIR) + "/models/peregrine-demo-draft-Q8_0.gguf", 4, 10, false, &dev);
  EXPECT_EQ(dev, 10u);
}

}  // namespace
}  // namespace pg::spec
