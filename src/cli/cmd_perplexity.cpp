// peregrine perplexity: llama-perplexity's method. The tokenized text is cut into consecutive
// windows of CTX tokens (remainder dropped); each window starts from an empty cache with its first
// token replaced by BOS, and only the second half is scored: the logits at positions CTX/2 … CTX−2
// predict the next token.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"

namespace pg::cli {

int cmd_perplexity(int argc, char** argv) {
  ModelFlags mf;
  mf.ctx = 512;
  std::string file;
  int max_chunks = -1;
  Args a("perplexity", "Compute the perplexity of a text file the way llama.cpp's llama-perplexity does.\n"
                       "Prints a running estimate per window and a last line 'PPL = <value>'.");
  mf.add_to(a);
  a.opt("-f,--file", &file, "text file", "FILE");
  a.opt("--chunks", &max_chunks, "evaluate at most this many windows (-1 = all)");
  if (!a.parse(argc, argv)) return 0;
  PG_CHECK(!file.empty(), "-f FILE is required");
  PG_CHECK(mf.ctx >= 4, "context size must be at least 4 for perplexity");
  std::ifstream in(file, std::ios::binary);
  PG_CHECK(in.good(), "cannot read '" + file + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto lm = load_model(mf);
  const auto& tok = *lm.tokenizer;
  const int n_ctx = lm.n_ctx;
  const bool add_bos = tok.add_bos() && tok.bos() >= 0;
  std::vector<int32_t> tokens = tok.encode(ss.str(), false, false);
  if (add_bos) tokens.insert(tokens.begin(), tok.bos());
  PG_CHECK(static_cast<int64_t>(tokens.size()) >= 2LL * n_ctx,
           "need at least " + std::to_string(2 * n_ctx) + " tokens for a context of " + std::to_string(n_ctx) + " (the text has " +
               std::to_string(tokens.size()) + ")");
  int n_chunk = static_cast<int>(tokens.size() / static_cast<size_t>(n_ctx));
  if (max_chunks >= 0) n_chunk = std::min(n_chunk, max_chunks);
  const int n_vocab = lm.model->config().n_vocab;
  auto cache = lm.model->make_cache(lm.kv_options(1, n_ctx));
  std::fprintf(stderr, "perplexity: %zu tokens, %d windows of %d\n", tokens.size(), n_chunk, n_ctx);
  const int first = n_ctx / 2;
  double nll = 0;
  int64_t count = 0;
  std::vector<float> logits;
  for (int c = 0; c < n_chunk; ++c) {
    const size_t start = static_cast<size_t>(c) * static_cast<size_t>(n_ctx);
    cache->clear(0);
    Batch b;
    for (int j = 0; j < n_ctx; ++j) {
      int32_t t = tokens[start + static_cast<size_t>(j)];
      if (j == 0 && add_bos) t = tok.bos();
      b.add(t, j, 0, j >= first && j < n_ctx - 1);
    }
    lm.model->forward(b, *cache, logits);
    for (int j = first; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + static_cast<size_t>(j - first) * static_cast<size_t>(n_vocab);
      float mx = row[0];
      for (int v = 1; v < n_vocab; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
      const int32_t next = tokens[start + static_cast<size_t>(j) + 1];
      nll += -(static_cast<double>(row[next] - mx) - std::log(sum));
      ++count;
    }
    std::printf("[%d]%.4f ", c + 1, std::exp(nll / static_cast<double>(count)));
    std::fflush(stdout);
  }
  std::printf("\nPPL = %.4f\n", std::exp(nll / static_cast<double>(count)));
  return 0;
}

}  // namespace pg::cli
