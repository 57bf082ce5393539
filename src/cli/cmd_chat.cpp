// peregrine chat: a conversation in the terminal through the model's chat template. Each turn
// reuses the KV cache for the part of the prompt that did not change.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/scheduler.h"

namespace pg::cli {
namespace {

// Splits "<think>…</think>answer" into (reasoning, answer).
std::pair<std::string, std::string> split_reasoning(const std::string& text) {
  const auto end = text.find("</think>");
  if (end == std::string::npos) return {"", text};
  std::string r = text.substr(0, end);
  if (r.rfind("<think>", 0) == 0) r = r.substr(7);
  std::string a = text.substr(end + 8);
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \n"), e = s.find_last_not_of(" \n");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  return {trim(r), trim(a)};
}

// What the user sees of a partial reply: reasoning hidden, and a trailing partial "<think>" held
// back until it is decided, so printed text never has to be taken back.
std::string visible_part(const std::string& r) {
  const auto start = r.find("<think>");
  if (start != std::string::npos) {
    const auto end = r.find("</think>", start);
    if (end == std::string::npos) return r.substr(0, start);
    std::string rest = r.substr(end + 8);
    rest.erase(0, rest.find_first_not_of('\n') == std::string::npos ? rest.size() : rest.find_first_not_of('\n'));
    return r.substr(0, start) + rest;
  }
  static const std::string tag = "<think>";
  for (size_t k = std::min(r.size(), tag.size() - 1); k > 0; --k)
    if (r.compare(r.size() - k, k, tag, 0, k) == 0) return r.substr(0, r.size() - k);
  return r;
}

}  // namespace

int cmd_chat(int argc, char** argv) {
  ModelFlags mf;
  SamplingFlags sf;
  SpecFlags spf;
  std::string system, template_file, prompt;
  int n_predict = 512;
  bool no_think = false, show_reasoning = false;
  Args a("chat", "Chat with a model in the terminal using its chat template. Type a message and press enter;\n"
                 "an empty line or end of input quits. With -p, answers one message and exits.");
  mf.add_to(a);
  mf.add_prefix_to(a);
  sf.p.temperature = 0.7f;
  sf.add_to(a);
  spf.add_to(a);
  a.opt("-p,--prompt", &prompt, "answer this one message and exit");
  a.opt("--system", &system, "system prompt");
  a.opt("--chat-template-file", &template_file, "use this Jinja template instead of the model's", "FILE");
  a.opt("-n,--n-predict", &n_predict, "maximum tokens per reply");
  a.flag("--no-think", &no_think, "ask the template to skip reasoning (enable_thinking=false)");
  a.flag("--show-reasoning", &show_reasoning, "print the model's reasoning (<think> blocks) too");
  if (!a.parse(argc, argv)) return 0;
  PG_CHECK(n_predict > 0, "n-predict must be positive");
  spf.validate();
  const bool bundled = mf.model.empty() && !std::getenv("PEREGRINE_MODEL");
  if (mf.model.empty()) mf.model = default_model_path();
  auto lm = load_model(mf);
  auto draft = load_spec(spf, mf, lm, mf.model, bundled);
  const auto& tok = *lm.tokenizer;
  std::string src;
  if (!template_file.empty()) {
    std::ifstream f(template_file, std::ios::binary);
    PG_CHECK(f.good(), "cannot read chat template '" + template_file + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    src = ss.str();
  } else {
    src = chat::select_gguf_chat_template(lm.model->file(), "", false);
  }
  chat::ChatTemplate tmpl(src, chat::gguf_token_text(lm.model->file(), "tokenizer.ggml.bos_token_id"),
                          chat::gguf_token_text(lm.model->file(), "tokenizer.ggml.eos_token_id"));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (no_think) vars["enable_thinking"] = false;

  // The same step loop as the server (engine/scheduler.h), with one slot; each turn is one request.
  const engine::SchedulerOptions so = lm.scheduler_options(1, mf.batch, draft.opt);
  engine::Scheduler sched(*lm.model, tok, so);
  const SamplingParams sp = sf.resolve();
  const bool interactive = prompt.empty();
  int turn = 0;

  for (;;) {
    std::string line;
    if (interactive) {
      std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line) || line.empty()) break;
    } else {
      line = prompt;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::string text = tmpl.render(messages, nullptr, true, vars);
    std::vector<int32_t> ids = tok.encode(text, true, true);
    PG_CHECK(static_cast<int>(ids.size()) + n_predict <= lm.n_ctx, "the conversation no longer fits the context (" +
                                                                     std::to_string(lm.n_ctx) + " tokens; use -c)");
    engine::RequestSpec rs;
    rs.prompt = ids;
    rs.sampling = sp;
    rs.sampling.seed = sp.seed + static_cast<uint64_t>(turn++);
    rs.max_tokens = n_predict;
    auto h = sched.submit(rs);
    std::string reply;
    size_t printed = 0;
    auto show = [&](bool final) {
      const std::string v = show_reasoning ? reply : (final ? split_reasoning(reply).second : visible_part(reply));
      if (v.size() > printed && v.compare(0, printed, v, 0, printed) == 0) {
        std::fwrite(v.data() + printed, 1, v.size() - printed, stdout);
        std::fflush(stdout);
        printed = v.size();
      }
    };
    engine::Event e;
    for (;;) {
      if (!h->next(e, std::chrono::milliseconds(100))) continue;
      reply += e.text;
      show(false);
      if (e.done) break;
    }
    PG_CHECK(e.finish != engine::FinishReason::kError, "generation failed: " + e.error);
    show(true);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    auto [reasoning, answer] = split_reasoning(reply);
    nlohmann::ordered_json msg = {{"role", "assistant"}, {"content", answer}};
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    messages.push_back(msg);
    if (!interactive) break;
  }
  return 0;
}

}  // namespace pg::cli
