#include "server/prepare.h"

#include <algorithm>
#include <chrono>
#include <variant>

#include "server/chat_prompt.h"

namespace pg::server {

engine::RequestSpec make_spec(const ServerOptions& opt, int n_ctx, const GenParams& g, std::vector<int32_t> prompt) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t room = n_ctx - n_prompt;
  if (room <= 0)
    throw ApiError(400,
                   "the prompt has " + std::to_string(n_prompt) + " tokens but a slot holds " + std::to_string(n_ctx) +
                       " tokens (prompt and answer together); shorten the conversation or restart with a larger -c",
                   "messages", "context_length_exceeded");
  engine::RequestSpec s;
  s.prompt = std::move(prompt);
  s.sampling = g.resolve(opt.sampling, opt.seed);
  int64_t max_tokens;
  if (g.max_tokens) {
    max_tokens = *g.max_tokens;
    if (max_tokens > room) {
      if (!opt.clamp_max_tokens)
        throw ApiError(400,
                       "the request needs " + std::to_string(n_prompt + max_tokens) + " tokens (" + std::to_string(n_prompt) +
                           " in the prompt + " + std::to_string(max_tokens) + " max tokens) but a slot holds " +
                           std::to_string(n_ctx) +
                           "; lower max_tokens, or restart the server with --clamp-max-tokens to shorten it automatically",
                       "max_tokens", "context_length_exceeded");
      max_tokens = room;
    }
  } else {
    max_tokens = opt.default_max_tokens > 0 ? std::min<int64_t>(opt.default_max_tokens, room) : room;
  }
  // --hard-limit-reply-budget caps every reply (the reasoning budget leaves room to close it).
  if (opt.hard_limit_reply_budget > 0) max_tokens = std::min<int64_t>(max_tokens, opt.hard_limit_reply_budget);
  s.max_tokens = static_cast<int>(max_tokens);
  s.stop = g.stop;
  s.stop_at_eog = !g.ignore_eos;
  s.logprobs = g.logprobs;
  if (opt.timeout_s > 0)
    s.deadline =
        engine::Clock::now() + std::chrono::duration_cast<engine::Clock::duration>(std::chrono::duration<double>(opt.timeout_s));
  return s;
}

std::vector<int32_t> completion_prompt(const tok::Tokenizer& tok, const CompletionRequest& r, std::string& prompt_text) {
  std::vector<int32_t> ids;
  prompt_text.clear();
  if (const auto* s = std::get_if<std::string>(&r.prompt)) {
    prompt_text = *s;
    ids = tokenize_prompt(tok, *s);
  } else {
    ids = std::get<std::vector<int32_t>>(r.prompt);
    for (int32_t t : ids)
      if (t >= tok.n_vocab())
        throw ApiError(400, "token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(tok.n_vocab()),
                       "prompt");
    if (r.echo) prompt_text = tok.detokenize(ids);
  }
  if (ids.empty()) throw ApiError(400, "the prompt is empty", "prompt");
  return ids;
}

std::string ignored_fields_header(const std::vector<std::string>& ignored) {
  std::string v;
  for (size_t i = 0; i < ignored.size(); ++i) {
    const std::string& k = ignored[i];
    if (v.size() + k.size() + 2 > kMaxIgnoredHeader) {
      v += (v.empty() ? "" : ", ") + std::string("... (") + std::to_string(ignored.size() - i) + " more)";
      break;
    }
    if (!v.empty()) v += ", ";
    for (unsigned char c : k) v += c >= 0x20 && c < 0x7F ? static_cast<char>(c) : '?';
  }
  return v;
}

TokenizeRequest parse_tokenize(const json& b) {
  TokenizeRequest r;
  auto c = b.find("content");
  if (c == b.end() || c->is_null()) throw bad_request("'content' is required", "content");
  if (!c->is_string()) throw bad_request("'content' must be a string, not " + type_name(*c), "content");
  r.content = c->get<std::string>();
  r.add_special = opt_bool(b, "add_special").value_or(false);
  r.parse_special = opt_bool(b, "parse_special").value_or(true);
  r.with_pieces = opt_bool(b, "with_pieces").value_or(false);
  return r;
}

std::vector<int32_t> parse_detokenize(const json& b, int n_vocab) {
  const json* t = opt_array(b, "tokens");
  if (!t) throw bad_request("'tokens' is required", "tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t->size(); ++i) {
    const json& v = (*t)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab)
      throw bad_request("'tokens[" + std::to_string(i) + "]' must be a token id in [0, " + std::to_string(n_vocab) + ")",
                        "tokens");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace pg::server
