// peregrine run: the continuation of a raw prompt, streamed to stdout (logs on stderr).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/scheduler.h"

namespace pg::cli {

int cmd_run(int argc, char** argv) {
  ModelFlags mf;
  SamplingFlags sf;
  SpecFlags spf;
  std::string prompt, prompt_file;
  int n_predict = 128;
  bool no_bos = false, no_parse_special = false, show_stats = false;
  Args a("run", "Generate a continuation of a raw prompt (no chat template). The continuation is written to stdout.");
  mf.add_to(a);
  mf.add_prefix_to(a);
  a.opt("-p,--prompt", &prompt, "prompt text");
  a.opt("-f,--file", &prompt_file, "read the prompt from a file", "FILE");
  a.opt("-n,--n-predict", &n_predict, "tokens to generate (-1 = until end of generation)");
  sf.add_to(a);
  spf.add_to(a);
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
  spf.validate();
  const bool bundled = mf.model.empty() && !std::getenv("PEREGRINE_MODEL");
  if (mf.model.empty()) mf.model = default_model_path();
  auto lm = load_model(mf);
  auto draft = load_spec(spf, mf, lm, mf.model, bundled);
  const auto& tok = *lm.tokenizer;
  std::vector<int32_t> ids = tok.encode(prompt, false, !no_parse_special);
  if (!no_bos && tok.add_bos() && tok.bos() >= 0) ids.insert(ids.begin(), tok.bos());
  PG_CHECK(!ids.empty(), "the prompt is empty and the model adds no BOS token");
  PG_CHECK(static_cast<int>(ids.size()) < lm.n_ctx,
           "prompt of " + std::to_string(ids.size()) + " tokens does not fit the context of " + std::to_string(lm.n_ctx));
  // The same step loop as the server (engine/scheduler.h), with one slot.
  const engine::SchedulerOptions so = lm.scheduler_options(1, mf.batch, draft.opt);
  engine::Scheduler sched(*lm.model, tok, so);
  engine::RequestSpec rs;
  rs.prompt = ids;
  rs.sampling = sf.resolve();
  const int room = lm.n_ctx - static_cast<int>(ids.size());
  rs.max_tokens = n_predict < 0 ? room : std::min(n_predict, room);
  if (rs.max_tokens == 0) return 0;
  auto h = sched.submit(rs);
  engine::Event e;
  engine::RequestStats st;
  for (;;) {
    if (!h->next(e, std::chrono::milliseconds(100))) continue;
    std::fwrite(e.text.data(), 1, e.text.size(), stdout);
    std::fflush(stdout);
    if (e.done) {
      PG_CHECK(e.finish != engine::FinishReason::kError, "generation failed: " + e.error);
      st = e.stats;
      break;
    }
  }
  if (show_stats)
    std::fprintf(stderr, "\nprompt: %d tokens in %.1f ms (%.1f tok/s); generation: %d tokens in %.1f ms (%.1f tok/s)\n", st.n_prompt,
                 st.prompt_ms, st.n_prompt * 1000.0 / std::max(st.prompt_ms, 1e-9), st.n_generated, st.decode_ms,
                 st.n_generated * 1000.0 / std::max(st.decode_ms, 1e-9));
  if (so.spec.on()) std::fprintf(stderr, "\n%s\n", spec_line(st.draft_n, st.draft_n_accepted, st.draft_rounds).c_str());
  return 0;
}

}  // namespace pg::cli
