// libFuzzer target for the HTTP server's request bodies. The first byte picks the route (low 3 bits)
// and two server settings (bit 3: --clamp-max-tokens, bit 4: a default max_tokens); the rest is the
// body. Each route runs the same functions as its handler in src/server (parse_body, the API's
// parser, prompt rendering, tokenization, the output parser set up as ChatRun does, make_spec) and
// then the checks the engine's Scheduler::submit makes, stopping where the handler would hand the
// request to the engine. No HTTP server and no model: a small synthetic Qwen-style BPE vocabulary
// (real special tokens) is built in memory once. Templates: tests/server/chatml.jinja, and for
// requests with tools a Hermes variant that opens a <think> block (fuzz/seeds_server/
// chatml_think_tools.jinja), as a GGUF's tokenizer.chat_template.tool_use would be.
//
// The only acceptable failure is an ApiError with a 4xx status; the engine-side validation may also
// refuse with pg::Error (the handler turns that into 400). Anything else escaping, a sanitizer
// report, a hang (-timeout) or a huge allocation (-rss_limit_mb) is a bug. Seeds and a dictionary:
// fuzz/seeds_server/ (each seed's first character '0'..'7' names its route).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "chat/parse/output_parser.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/synth.h"
#include "gguf/writer.h"
#include "server/chat_prompt.h"
#include "server/chat_request.h"
#include "server/json_util.h"
#include "server/prepare.h"
#include "server/structured.h"
#include "tokenizer/tokenizer.h"

#if !defined(PG_FUZZ_CHATML) || !defined(PG_FUZZ_CHATML_THINK_TOOLS)
#error "PG_FUZZ_CHATML and PG_FUZZ_CHATML_THINK_TOOLS (template paths) must be defined by fuzz/server.cmake"
#endif

namespace {

using namespace pg;
using namespace pg::server;

enum Route : uint8_t {
  kChatCompletions,  // POST /v1/chat/completions
  kCompletions,      // POST /v1/completions
  kResponses,        // POST /v1/responses
  kMessages,         // POST /v1/messages
  kCountTokens,      // POST /v1/messages/count_tokens
  kTokenize,         // POST /tokenize
  kDetokenize,       // POST /detokenize
  kApplyTemplate,    // POST /apply-template
};

constexpr int kNCtx = 2048;  // slot size: small enough that fuzzed prompts overflow it

struct Fixture {
  std::vector<uint8_t> vocab_bytes;  // the synthetic vocabulary GGUF; `vocab` points into it
  std::unique_ptr<gguf::File> vocab;
  std::unique_ptr<tok::Tokenizer> tok;
  std::unique_ptr<ChatPrompt> prompt;
};

Fixture* g_fx = nullptr;
bool g_verbose = false;  // FUZZ_SERVER_VERBOSE=1: print each input's prompt or error (triage of single inputs)
volatile uint64_t g_sink;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_server_request: %s\n", what);
  __builtin_trap();
}

std::string read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "fuzz_server_request: cannot read %s\n", path);
    std::abort();
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void sink(const std::string& s) { g_sink = g_sink + s.size(); }

// What HttpOut::json_reply and the error path do with a body: both must serialise whatever the
// request put into them.
void reply(const json& j) { sink(j.dump(-1, ' ', false, json::error_handler_t::replace)); }

// The engine's own checks (Scheduler::submit), applied to what make_spec produced: a spec that gets
// this far must be within the slot, or make_spec let something through it should have caught.
void check_spec(const engine::RequestSpec& s, int n_vocab) {
  if (s.prompt.empty()) fail("empty prompt reached the engine");
  for (int32_t t : s.prompt)
    if (t < 0 || t >= n_vocab) fail("prompt token outside the vocabulary reached the engine");
  if (s.max_tokens < 1) fail("max_tokens < 1 reached the engine");
  if (static_cast<int64_t>(s.prompt.size()) + s.max_tokens > kNCtx) fail("request larger than the slot reached the engine");
  if (s.logprobs > 20) fail("logprobs > 20 reached the engine");
  try {
    s.sampling.validate(n_vocab);  // refused here = 400 from the handler (RejectError kInvalid)
  } catch (const Error&) {
  }
}

// The OpenAI handlers report unknown fields in a response header: it must stay a short, valid header value.
void check_ignored_header(const std::vector<std::string>& ignored) {
  const std::string h = ignored_fields_header(ignored);
  if (h.size() > kMaxIgnoredHeader + 32) fail("X-Peregrine-Ignored-Fields is too long");
  for (unsigned char c : h)
    if (c < 0x20 || c >= 0x7F) fail("X-Peregrine-Ignored-Fields holds a byte a header may not");
}

// A lazy grammar's armed phase over text the request itself supplies (its trigger values, then its
// grammar text, token by token): the watch and the firing (Pike VM start) must not crash or hang, and
// a start must lie inside the text.
void watch_lazy(const engine::ConstraintSpec* c, const GenParams& g) {
  if (!c || !c->lazy) return;
  grammar::TriggerWatch w(c->lazy);
  std::string text;
  for (const auto& t : g.grammar_triggers) text += t.value;
  text += g.grammar;
  for (size_t i = 0; i < text.size() && i < 4096; i += 3) {
    const size_t at = w.push(static_cast<int32_t>(i), std::string_view(text).substr(i, 3));
    if (at != grammar::TriggerWatch::npos) {
      if (at > w.text().size()) fail("a trigger's start lies past the watched text");
      break;
    }
  }
}

// ChatRun's constructor without the engine: render, the output parser fed the forced prefix, the spec.
void run_chat(const Fixture& fx, const ServerOptions& opt, const ChatRequest& req) {
  const RenderedPrompt rp = fx.prompt->render(req);
  if (g_verbose)
    std::fprintf(stderr, "--- prompt (%zu tokens, forced %zu bytes):\n%s\n---\n", rp.tokens.size(), rp.forced.size(),
                 rp.text.c_str());
  if (rp.text.size() < rp.forced.size() || rp.text.compare(rp.text.size() - rp.forced.size(), std::string::npos, rp.forced) != 0)
    fail("the forced prefix is not the end of the prompt");
  if (rp.tokens.empty()) fail("a rendered prompt tokenized to nothing");
  chat::OutputParser parser(rp.format, rp.parser);
  chat::Delta d;
  if (!rp.forced.empty()) d = parser.push(rp.forced);
  chat::Delta last = parser.finish();
  sink(d.content);
  sink(last.content);
  reply(parser.message().to_openai_json());
  engine::RequestSpec spec = make_spec(opt, kNCtx, req.gen, rp.tokens);
  spec.special_text = ChatPrompt::special_text(rp.format);
  // The grammar of structured output / forced tool calls, and the reasoning budget (ChatRun does this).
  spec.constraint = chat_constraint(opt, *fx.tok, req, rp);
  watch_lazy(spec.constraint.get(), req.gen);
  check_spec(spec, fx.tok->n_vocab());
  if (g_verbose)
    std::fprintf(stderr, "spec: max_tokens %d, %zu stop strings, logprobs %d\n", spec.max_tokens, spec.stop.size(),
                 spec.logprobs);
}

void run(const Fixture& fx, uint8_t selector, std::string_view body) {
  ServerOptions opt;
  opt.clamp_max_tokens = selector & 8;
  opt.default_max_tokens = selector & 16 ? 64 : 0;
  opt.timeout_s = 0;
  const tok::Tokenizer& tok = *fx.tok;
  switch (static_cast<Route>(selector & 7)) {
    case kChatCompletions: {
      const ChatRequest req = parse_openai_chat(parse_body(body));
      run_chat(fx, opt, req);
      check_ignored_header(req.ignored);
      break;
    }
    case kResponses: {
      const json b = parse_body(body);
      run_chat(fx, opt, parse_responses(b));
      reply(b);  // the response object echoes fields of the request
      break;
    }
    case kMessages:
      run_chat(fx, opt, parse_anthropic(parse_body(body)));
      break;
    case kCountTokens: {
      const RenderedPrompt rp = fx.prompt->render(parse_anthropic(parse_body(body), true));
      reply(json{{"input_tokens", rp.tokens.size()}});
      break;
    }
    case kApplyTemplate: {
      const RenderedPrompt rp = fx.prompt->render(parse_openai_chat(parse_body(body)));
      reply(json{{"prompt", rp.text}, {"n_tokens", rp.tokens.size()}});
      break;
    }
    case kCompletions: {
      const CompletionRequest req = parse_completion(parse_body(body));
      std::string prompt_text;
      std::vector<int32_t> ids = completion_prompt(tok, req, prompt_text);
      sink(prompt_text);
      engine::RequestSpec spec = make_spec(opt, kNCtx, req.gen, std::move(ids));
      spec.constraint = completion_constraint(tok, req.gen);  // the grammar and lazy triggers (token ids checked)
      watch_lazy(spec.constraint.get(), req.gen);
      check_spec(spec, tok.n_vocab());
      check_ignored_header(req.ignored);
      break;
    }
    case kTokenize: {
      const TokenizeRequest r = parse_tokenize(parse_body(body));
      json tokens = json::array();
      for (int32_t id : tok.encode(r.content, r.add_special, r.parse_special)) {
        if (r.with_pieces)
          tokens.push_back(json{{"id", id}, {"piece", tok::utf8_sanitize(tok.token_to_piece(id, true))}});
        else
          tokens.push_back(id);
      }
      reply(json{{"tokens", tokens}});
      break;
    }
    case kDetokenize:
      reply(json{{"content", tok.detokenize(parse_detokenize(parse_body(body), tok.n_vocab()), true)}});
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto* fx = new Fixture;
  gguf::Writer w;
  w.set_string("general.architecture", "qwen3");
  gguf::synth_bpe_vocab(w, "qwen", 1024);
  fx->vocab_bytes = w.write_to_memory();
  fx->vocab = gguf::File::from_memory(fx->vocab_bytes, "synthetic-qwen-vocab");
  fx->tok = tok::Tokenizer::from_gguf(*fx->vocab);
  fx->prompt = std::make_unique<ChatPrompt>(read_file(PG_FUZZ_CHATML), *fx->tok, read_file(PG_FUZZ_CHATML_THINK_TOOLS));
  g_fx = fx;
  const char* v = std::getenv("FUZZ_SERVER_VERBOSE");
  g_verbose = v && *v && std::string(v) != "0";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    run(*g_fx, data[0], body);
  } catch (const ApiError& e) {
    if (g_verbose) std::fprintf(stderr, "ApiError %d (%s): %s\n", e.status(), e.param().c_str(), e.what());
    if (e.status() < 400 || e.status() > 499) fail("a request was refused with a status other than 4xx");
    if (std::string_view(e.what()).empty()) fail("an ApiError without a message");
    reply(error_body(ApiFlavor::kOpenAI, e));
    reply(error_body(ApiFlavor::kAnthropic, e));
  }
  // Any other exception escapes to libFuzzer, which reports it as a crash (the handler would answer 500).
  return 0;
}
