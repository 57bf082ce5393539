// The HTTP- and engine-independent first half of the request handlers: from a parsed request to the
// engine's RequestSpec, and the small utility routes' request parsing. Pure functions (a tokenizer
// and the server's options are all they read), so that the handlers and the request fuzzer
// (fuzz/fuzz_server_request.cpp) run exactly the same checks. Every refusal is an ApiError 400.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/chat_request.h"
#include "server/json_util.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace pg::server {

// Generation limits and sampling for a request whose prompt is `prompt`, checked against a slot of
// n_ctx tokens: max_tokens is refused (or, with opt.clamp_max_tokens, shortened) when prompt and
// answer do not fit; without max_tokens the answer may fill the slot (or opt.default_max_tokens).
engine::RequestSpec make_spec(const ServerOptions& opt, int n_ctx, const GenParams& g, std::vector<int32_t> prompt);

// The prompt of a legacy completion as token ids: text is tokenized like a chat prompt, ids are
// checked against the vocabulary. prompt_text: what echo writes back (the text, or the ids
// detokenized when echo is set). Refuses an empty prompt.
std::vector<int32_t> completion_prompt(const tok::Tokenizer& tok, const CompletionRequest& r, std::string& prompt_text);

// X-Peregrine-Ignored-Fields: the unknown top-level fields of a request, comma-separated. Field
// names come from the client: bytes outside printable ASCII become '?' (cpp-httplib drops a header
// holding CR or LF altogether) and the list stops after about kMaxIgnoredHeader bytes with a count of
// the rest (a body of 300,000 unknown keys gave a 3 MB header line that clients refuse to read).
constexpr size_t kMaxIgnoredHeader = 1024;
std::string ignored_fields_header(const std::vector<std::string>& ignored);

// POST /tokenize
struct TokenizeRequest {
  std::string content;
  bool add_special = false, parse_special = true, with_pieces = false;
};
TokenizeRequest parse_tokenize(const json& body);

// POST /detokenize: the token ids, each within [0, n_vocab).
std::vector<int32_t> parse_detokenize(const json& body, int n_vocab);

}  // namespace pg::server
