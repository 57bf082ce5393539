// Token sampling: the llama.cpp-style chain penalties → logit bias → top-k → typical → top-p →
// min-p → temperature → draw, or greedy argmax when temperature ≤ 0. Deterministic for a seed.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <utility>
#include <vector>

namespace pg {

struct SamplingParams {
  float temperature = 0.8f;  // ≤ 0: greedy
  int top_k = 40;            // ≤ 0: off
  float top_p = 0.95f;       // ≥ 1: off
  float min_p = 0.05f;       // ≤ 0: off
  float typical_p = 1.0f;    // ≥ 1: off
  float repeat_penalty = 1.0f;  // 1: off (llama.cpp semantics: divide positive logits, multiply negative)
  int repeat_last_n = 64;       // window of previous tokens the penalties look at (-1: all)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logit; -inf bans the token
  uint64_t seed = 0xC0FFEE;

  bool greedy() const { return temperature <= 0.0f; }
  // Throws pg::Error describing the first absurd value (NaN, negative top_k beyond -1, etc.).
  void validate(int n_vocab) const;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

class Sampler {
 public:
  Sampler(const SamplingParams& p, int n_vocab);

  // Picks the next token from raw logits (n_vocab), applying the chain. Does not record it.
  int32_t sample(const float* logits);
  // The distribution sample(logits) draws from, over the whole vocabulary (one-hot when greedy).
  void distribution(const float* logits, std::vector<float>& probs);
  // Draws from the sampler's generator: U[0,1), and a token from non-negative weights (n_vocab).
  // Speculative sampling of sampled drafts uses these so one seed decides a whole request.
  double uniform();
  int32_t draw(const std::vector<float>& weights);
  // Records a token as part of the history (prompt or generated) the penalties look at.
  void accept(int32_t token);
  void reset();
  const SamplingParams& params() const { return p_; }
  // True when sample(logits) is argmax(logits) of the raw logits (greedy, no penalties, no logit bias),
  // so the model may compute the token on its backend and skip copying the logits.
  bool raw_argmax() const;

 private:
  SamplingParams p_;
  int n_vocab_;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch (logit, id), reused across calls
  std::vector<double> w_;                        // scratch: weights of the first w_.size() candidates
  // Applies the chain to cand_; returns the token when the choice is deterministic (greedy after
  // penalties), else -1 with the draw's weights in w_ (over cand_[0, w_.size())).
  int32_t prepare(const float* logits);
};

// Greedy choice: highest logit, ties to the lowest id (as llama.cpp).
int32_t argmax(const float* logits, int n_vocab);
// log-softmax of the raw logits: the chosen token's logprob and the n most likely alternatives.
float token_logprob(const float* logits, int n_vocab, int32_t id);
std::vector<TokenLogprob> top_logprobs(const float* logits, int n_vocab, int n);

}  // namespace pg
