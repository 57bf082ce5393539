// The bundled demo models (models/): logits match PyTorch's, greedy chat answers are right, and the
// draft agrees with the target often enough for speculative decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace pg {
namespace {

std::filesystem::path models_dir() { return std::filesystem::path(PEREGRINE_SOURCE_DIR) / "models"; }

TEST(Bundled, TargetLogitsMatchPyTorch) {
  const auto card = nlohmann::json::parse(test::read_text(models_dir() / "card.json"));
  const auto ids = card["reference"]["token_ids"].get<std::vector<int32_t>>();
  const auto& ref_info = card["reference"]["files"]["peregrine-demo-target-Q8_0.gguf"];
  const auto ref = test::read_f32(models_dir() / ref_info["logits_file"].get<std::string>());
  CpuOptions co;
  co.exact_f32 = true;
  co.n_threads = 2;
  CpuBackend be(co);
  auto model = Model::load((models_dir() / "peregrine-demo-target-Q8_0.gguf").string(), be);
  auto cache = model->make_cache({1, 64, DType::F32});
  Batch b;
  for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], static_cast<int>(i), 0, true);
  std::vector<float> logits;
  model->forward(b, *cache, logits);
  ASSERT_EQ(logits.size(), ref.size());
  double mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) mx = std::max(mx, static_cast<double>(std::fabs(logits[i] - ref[i])));
  EXPECT_LE(mx, 1e-3);
  std::printf("bundled target vs PyTorch: max |diff| %.2e\n", mx);
}

struct Chat {
  std::unique_ptr<CpuBackend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<tok::Tokenizer> tok;
  std::unique_ptr<KvCache> cache;
  explicit Chat(const std::string& file) {
    CpuOptions co;
    co.n_threads = 2;
    be = std::make_unique<CpuBackend>(co);
    model = Model::load((models_dir() / file).string(), *be);
    tok = tok::Tokenizer::from_gguf(model->file());
    cache = model->make_cache({1, 512, DType::F16});
  }
  std::vector<int32_t> prompt(const std::string& question) const {
    return tok->encode("<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n", false, true);
  }
  // Greedy generation through the engine's one step loop (the scheduler), without speculation; made per
  // call so that no engine thread runs while a test drives the model's forward directly.
  std::vector<int32_t> greedy(const std::vector<int32_t>& p, int n) {
    engine::SchedulerOptions o;
    o.n_slots = 1;
    o.n_ctx = 512;
    engine::Scheduler sched(*model, *tok, o);
    engine::RequestSpec req;
    req.prompt = p;
    req.sampling.temperature = 0;
    req.max_tokens = n;
    auto h = sched.submit(std::move(req));
    std::vector<int32_t> out;
    engine::Event e;
    while (h->next(e, std::chrono::seconds(60))) {
      for (const auto& t : e.tokens) out.push_back(t.id);
      if (e.done) break;
    }
    return out;
  }
};

TEST(Bundled, AnswersArithmeticAndConversions) {
  Chat c("peregrine-demo-target-Q8_0.gguf");
  const std::pair<const char*, const char*> qa[] = {
      {"What is 347 + 589?", "347 + 589 = 936."}, {"Convert 7 km to m.", "7 km = 7000 m."}, {"What is 52 - 17?", "52 - 17 = 35."}};
  for (const auto& [q, a] : qa) {
    const std::string text = c.tok->detokenize(c.greedy(c.prompt(q), 200));
    EXPECT_NE(text.find(a), std::string::npos) << q << " -> " << text;
  }
}

TEST(Bundled, DraftAgreesWithTargetOnMostPositions) {
  Chat target("peregrine-demo-target-Q8_0.gguf"), draft("peregrine-demo-draft-Q8_0.gguf");
  int agree = 0, total = 0;
  for (const char* q : {"What is 481 + 276?", "Convert 12 hours to minutes.", "Reverse the word \"forest\".",
                        "Write a Python function `scale_it(x)` that returns x times 4."}) {
    const auto p = target.prompt(q);
    const auto gen = target.greedy(p, 120);
    ASSERT_GT(gen.size(), 4u);
    // Teacher-forced: the draft predicts each token of the target's own generation.
    std::vector<int32_t> seq = p;
    seq.insert(seq.end(), gen.begin(), gen.end());
    Batch b;
    for (size_t i = 0; i + 1 < seq.size(); ++i) b.add(seq[i], static_cast<int>(i), 0, i + 1 >= p.size());
    std::vector<float> logits;
    draft.cache->clear(0);
    draft.model->forward(b, *draft.cache, logits);
    const int nv = draft.model->config().n_vocab;
    for (size_t j = 0; j < gen.size(); ++j) {
      const float* row = logits.data() + j * static_cast<size_t>(nv);
      agree += argmax(row, nv) == gen[j];
      ++total;
    }
  }
  const double rate = static_cast<double>(agree) / total;
  std::printf("draft/target agreement: %d/%d = %.1f%%\n", agree, total, 100 * rate);
  EXPECT_GE(rate, 0.6);
}

}  // namespace
}  // namespace pg
