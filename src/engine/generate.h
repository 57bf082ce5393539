// Single-sequence generation used by `peregrine run`/`chat`/`bench`: prefill the prompt in one
// batched forward, then decode token by token with the sampler until n tokens or end of generation.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/sampler.h"
#include "model/model.h"

namespace pg {

struct GenerateOptions {
  int n_predict = 128;       // < 0: until end of generation or context end
  bool stop_at_eog = true;
  int seq = 0;               // cache sequence slot
};

struct GenerateStats {
  int n_prompt = 0, n_generated = 0;
  double prompt_ms = 0, decode_ms = 0;
};

// on_token(id) returns false to stop. `is_eog` decides end-of-generation tokens.
GenerateStats generate(Model& model, KvCache& cache, const std::vector<int32_t>& prompt, Sampler& sampler,
                       const GenerateOptions& opt, const std::function<bool(int32_t)>& is_eog,
                       const std::function<bool(int32_t)>& on_token);

}  // namespace pg
