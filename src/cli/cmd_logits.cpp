// peregrine logits: float32 logits of every position of a token list from one batched forward.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"

namespace pg::cli {

int cmd_logits(int argc, char** argv) {
  ModelFlags mf;
  mf.cache_type = "f32";  // logits are compared against references: keep the KV cache exact
  std::string tokens, out;
  Args a("logits", "Evaluate a token list in one batched forward and write the logits of every position as float32\n"
                   "little-endian, [n_tokens][n_vocab] row-major. No BOS is added.");
  mf.add_to(a, false);
  a.opt("--tokens", &tokens, "comma-separated token ids", "ID,ID,...");
  a.opt("-o,--out", &out, "output file", "FILE");
  if (!a.parse(argc, argv)) return 0;
  PG_CHECK(!tokens.empty(), "--tokens is required");
  PG_CHECK(!out.empty(), "--out is required");
  const std::vector<int32_t> ids = parse_id_list(tokens);
  mf.ctx = std::max<int>(static_cast<int>(ids.size()), 1);
  mf.batch = std::max(mf.batch, static_cast<int>(ids.size()));
  auto lm = load_model(mf, false);
  const int n_vocab = lm.model->config().n_vocab;
  for (int32_t id : ids) PG_CHECK(id < n_vocab, "token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(n_vocab) + ")");
  auto cache = lm.model->make_cache(lm.kv_options(1, static_cast<int>(ids.size())));
  Batch b;
  for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], static_cast<int32_t>(i), 0, true);
  std::vector<float> logits;
  lm.model->forward(b, *cache, logits);
  FILE* f = std::fopen(out.c_str(), "wb");
  PG_CHECK(f != nullptr, "cannot write '" + out + "'");
  const size_t n = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
  const bool ok = std::fclose(f) == 0 && n == logits.size();
  PG_CHECK(ok, "failed writing '" + out + "'");
  std::fprintf(stderr, "wrote %zu x %d logits to %s\n", ids.size(), n_vocab, out.c_str());
  return 0;
}

}  // namespace pg::cli
