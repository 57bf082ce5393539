#include "engine/generate.h"

#include <chrono>

#include "core/error.h"

namespace pg {

GenerateStats generate(Model& model, KvCache& cache, const std::vector<int32_t>& prompt, Sampler& sampler,
                       const GenerateOptions& opt, const std::function<bool(int32_t)>& is_eog,
                       const std::function<bool(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  GenerateStats st;
  PG_CHECK(!prompt.empty(), "empty prompt");
  const int n_ctx = cache.n_ctx();
  PG_CHECK(static_cast<int>(prompt.size()) < n_ctx,
           "prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " + std::to_string(n_ctx));
  cache.clear(opt.seq);
  sampler.reset();
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) {
    b.add(prompt[i], static_cast<int32_t>(i), opt.seq, i + 1 == prompt.size());
    sampler.accept(prompt[i]);
  }
  std::vector<float> logits;
  // Greedy decoding takes the token from the backend and skips copying the logits.
  int32_t greedy = -1;
  const uint8_t only = 1;
  ForwardOptions fopt;
  if (sampler.raw_argmax()) {
    fopt.argmax = &greedy;
    fopt.argmax_only = &only;
  }
  auto t0 = clock::now();
  model.forward(b, cache, logits, fopt);
  st.prompt_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  st.n_prompt = static_cast<int>(prompt.size());

  int pos = static_cast<int>(prompt.size());
  auto t1 = clock::now();
  for (int i = 0; opt.n_predict < 0 || i < opt.n_predict; ++i) {
    const int32_t tok = fopt.argmax ? greedy : sampler.sample(logits.data());
    sampler.accept(tok);
    if (opt.stop_at_eog && is_eog && is_eog(tok)) break;
    ++st.n_generated;
    if (!on_token(tok)) break;
    if (pos >= n_ctx || (opt.n_predict >= 0 && i + 1 >= opt.n_predict)) break;
    b.clear();
    b.add(tok, pos++, opt.seq, true);
    model.forward(b, cache, logits, fopt);
  }
  st.decode_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
  return st;
}

}  // namespace pg
