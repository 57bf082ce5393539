// peregrine run: the continuation of a raw prompt, streamed to stdout (logs on stderr).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/generate.h"

namespace pg::cli {

int cmd_run(int argc, char** argv) {
  ModelFlags mf;
  SamplingFlags sf;
  std::string prompt, prompt_file;
  int n_predict = 128;
  bool no_bos = false, no_parse_special = false, show_stats = false;
  Args a("run", "Generate a continuation of a raw prompt (no chat template). The continuation is written to stdout.");
  mf.add_to(a);
  a.opt("-p,--prompt", &prompt, "prompt text");
  a.opt("-f,--file", &prompt_file, "read the prompt from a file", "FILE");
  a.opt("-n,--n-predict", &n_predict, "tokens to generate (-1 = until end of generation)");
  sf.add_to(a);
  a.flag("--no-bos", &no_bos, "do not add BOS even if the model asks for it");
  a.flag("--no-parse-special", &no_parse_special, "treat special-token text in the prompt as plain text");
  a.flag("--stats", &show_stats, "print timings to stderr");
  if (!a.parse(argc, argv)) return 0;
  if (!prompt_file.empty()) {
    std::ifstream f(prompt_file, std::ios::binary);
    PG_CHECK(f.good(), "cannot read prompt file '" + prompt_file + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    prompt = ss.str();
  }
  PG_CHECK(n_predict >= -1, "n-predict must be ≥ -1");
  auto lm = load_model(mf);
  const auto& tok = *lm.tokenizer;
  std::vector<int32_t> ids = tok.encode(prompt, false, !no_parse_special);
  if (!no_bos && tok.add_bos() && tok.bos() >= 0) ids.insert(ids.begin(), tok.bos());
  PG_CHECK(!ids.empty(), "the prompt is empty and the model adds no BOS token");
  SamplingParams sp = sf.resolve();
  Sampler sampler(sp, lm.model->config().n_vocab);
  auto cache = lm.model->make_cache({1, lm.n_ctx, lm.kv_type});
  tok::Detokenizer detok(tok, false);
  detok.continuation();
  GenerateOptions go;
  go.n_predict = n_predict;
  auto st = generate(*lm.model, *cache, ids, sampler, go, [&](int32_t t) { return tok.is_eog(t); }, [&](int32_t t) {
    const std::string s = detok.push(t);
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  const std::string rest = detok.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fflush(stdout);
  if (show_stats)
    std::fprintf(stderr, "\nprompt: %d tokens in %.1f ms (%.1f tok/s); generation: %d tokens in %.1f ms (%.1f tok/s)\n", st.n_prompt,
                 st.prompt_ms, st.n_prompt * 1000.0 / std::max(st.prompt_ms, 1e-9), st.n_generated, st.decode_ms,
                 st.n_generated * 1000.0 / std::max(st.decode_ms, 1e-9));
  return 0;
}

}  // namespace pg::cli
