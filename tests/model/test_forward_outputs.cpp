// Per-row outputs of Model::forward (ForwardOptions): top-k ids and log-probabilities computed on the
// backend, rows that skip the logits download, and hidden states of chosen layers (the DFlash seam).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

Batch prompt_batch(int n, int vocab, const std::vector<int>& outputs) {
  Batch b;
  for (int p = 0; p < n; ++p)
    b.add((p * 37 + 11) % vocab, p, 0, std::find(outputs.begin(), outputs.end(), p) != outputs.end());
  return b;
}

class ForwardOutputs : public testing::TestWithParam<std::string> {};

// Top-k from the backend equals a host top-k over the downloaded logits; skipped rows still get argmax
// and top-k; wanted rows get exactly the logits of a plain forward.
TEST_P(ForwardOutputs, TopkAndLogitsSkip) {
  CpuBackend be(CpuOptions{2, false, 64});
  auto model = Model::load(test::shared_path("golden/models/" + GetParam() + ".gguf").string(), be);
  const int V = model->config().n_vocab;
  const std::vector<int> outs = {0, 4, 9, 15, 19};
  const Batch b = prompt_batch(20, V, outs);
  std::vector<float> ref, got;
  model->forward(b, *model->make_cache({1, 64, DType::F32, 16}), ref);
  for (int k : {1, 8, 64}) {
    auto cache = model->make_cache({1, 64, DType::F32, 16});
    ForwardOptions f;
    const uint8_t skip[] = {0, 1, 1, 0, 1};
    std::vector<int32_t> ids(outs.size() * static_cast<size_t>(k), -1), am(outs.size(), -1);
    std::vector<float> lp(outs.size() * static_cast<size_t>(k), 0.0f);
    f.top_k = k;
    f.topk_ids = ids.data();
    f.topk_logprobs = lp.data();
    f.logits_skip = skip;
    f.argmax = am.data();
    model->forward(b, *cache, got, f);
    for (size_t i = 0; i < outs.size(); ++i) {
      const float* row = ref.data() + i * static_cast<size_t>(V);
      if (!skip[i]) {
        EXPECT_EQ(std::memcmp(got.data() + i * static_cast<size_t>(V), row, static_cast<size_t>(V) * 4), 0) << "row " << i;
      }
      std::vector<int32_t> order(static_cast<size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return row[a] > row[c]; });
      const double mx = row[order[0]];
      double sum = 0;
      for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      EXPECT_EQ(am[i], order[0]) << "row " << i;
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(ids[i * static_cast<size_t>(k) + static_cast<size_t>(j)], order[static_cast<size_t>(j)]) << "row " << i << " rank " << j;
        EXPECT_NEAR(lp[i * static_cast<size_t>(k) + static_cast<size_t>(j)], row[order[static_cast<size_t>(j)]] - mx - std::log(sum), 1e-4)
            << "row " << i << " rank " << j;
      }
    }
  }
}

// Hidden states: the last layer's, through the final norm and the output matrix, are the logits; the
// layout is (n_outputs, layers·n_embd) in the caller's layer order; results do not depend on the
// micro-batch split or on which other layers are requested.
TEST_P(ForwardOutputs, HiddenStatesOfChosenLayers) {
  // Gated DeltaNet token by token: its chunked prefill form rounds differently per micro-batch length.
  CpuBackend be(CpuOptions{2, false, 1});
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  auto model = Model::load(path, be);
  const ModelConfig& c = model->config();
  const int V = c.n_vocab, E = c.n_embd, L = c.n_layer;
  const std::vector<int> outs = {2, 7, 11};
  const Batch b = prompt_batch(12, V, outs);
  std::vector<float> logits, hidden, h_last, h_first;
  ForwardOptions f;
  f.hidden_layers = {L - 1, 0};
  f.hidden = &hidden;
  model->forward(b, *model->make_cache({1, 64, DType::F32, 16}), logits, f);
  ASSERT_EQ(hidden.size(), outs.size() * 2 * static_cast<size_t>(E));
  // Last layer → final norm → output projection = the logits.
  const ModelWeights& w = model->weights();
  Tensor x = be.alloc(DType::F32, E, static_cast<int64_t>(outs.size())), y = be.alloc(DType::F32, V, static_cast<int64_t>(outs.size()));
  for (size_t i = 0; i < outs.size(); ++i) std::copy_n(hidden.data() + i * 2 * static_cast<size_t>(E), E, x.as<float>() + i * static_cast<size_t>(E));
  be.rms_norm(x, w.output_norm, x, c.rms_eps);
  be.matmul(w.output, x, y);
  if (c.final_logit_softcap > 0) be.softcap(y, c.final_logit_softcap);
  EXPECT_EQ(std::memcmp(y.as<float>(), logits.data(), logits.size() * 4), 0) << "last hidden state does not give the logits";
  be.free(x);
  be.free(y);
  // One layer at a time, and in micro-batches of 3 rows: the same values.
  for (int layer : {0, L - 1}) {
    ModelOptions mo;
    mo.max_batch = 3;
    auto m3 = Model::load(path, be, mo);
    std::vector<float> lg, h;
    ForwardOptions f1;
    f1.hidden_layers = {layer};
    f1.hidden = &h;
    m3->forward(b, *m3->make_cache({1, 64, DType::F32, 16}), lg, f1);
    ASSERT_EQ(h.size(), outs.size() * static_cast<size_t>(E));
    const size_t slot = layer == 0 ? 1 : 0;
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_EQ(std::memcmp(h.data() + i * static_cast<size_t>(E), hidden.data() + (i * 2 + slot) * static_cast<size_t>(E), static_cast<size_t>(E) * 4), 0)
          << "layer " << layer << " row " << i;
  }
  // Layers differ from each other (the capture is not one buffer read twice).
  if (L > 1) {
    EXPECT_NE(std::memcmp(hidden.data(), hidden.data() + E, static_cast<size_t>(E) * 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ForwardOutputs,
                         testing::Values("tiny-llama-Q4_K_M", "tiny-gemma3-f16", "tiny-qwen35-f16", "tiny-qwen3moe-f16"),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(ForwardOutputsErrors, BadOptions) {
  CpuBackend be(CpuOptions{2, false, 64});
  auto model = Model::load(test::shared_path("golden/models/tiny-qwen3-f16.gguf").string(), be);
  auto cache = model->make_cache({1, 64, DType::F32, 16});
  const Batch b = prompt_batch(3, model->config().n_vocab, {2});
  std::vector<float> out, hidden;
  std::vector<int32_t> ids(65);
  std::vector<float> lp(65);
  ForwardOptions f;
  f.top_k = 65;
  f.topk_ids = ids.data();
  f.topk_logprobs = lp.data();
  EXPECT_THROW(model->forward(b, *cache, out, f), Error);
  f.top_k = 4;
  f.topk_logprobs = nullptr;
  EXPECT_THROW(model->forward(b, *cache, out, f), Error);
  ForwardOptions h;
  h.hidden_layers = {0};
  EXPECT_THROW(model->forward(b, *cache, out, h), Error);  // no destination
  h.hidden = &hidden;
  h.hidden_layers = {model->config().n_layer};
  EXPECT_THROW(model->forward(b, *cache, out, h), Error);
  h.hidden_layers = {0, 0};
  EXPECT_THROW(model->forward(b, *cache, out, h), Error);
  EXPECT_EQ(cache->seq_len(0), 0);  // refused before anything ran
}

}  // namespace
}  // namespace pg
