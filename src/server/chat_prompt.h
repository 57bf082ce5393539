// Turns a parsed chat request into prompt tokens with the model's Jinja chat template, and sets up
// the output parser that splits the answer back into content / reasoning / tool calls.
//
// tool_choice "required" or a named function is honoured by writing the opening of a tool call at
// the end of the prompt (the model continues inside the call): this needs a format whose calls
// start with known markup (Hermes, Qwen3-Coder XML, Llama 3 JSON); others answer 400.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/parse/chat_format.h"
#include "chat/parse/output_parser.h"
#include "server/chat_request.h"
#include "tokenizer/tokenizer.h"

namespace pg::server {

struct RenderedPrompt {
  std::string text;             // the rendered prompt, forced prefix included
  std::vector<int32_t> tokens;  // its tokens (BOS once)
  std::string forced;           // model output written into the prompt (fed to the parser first)
  chat::ChatFormat format;      // markup of the template that rendered it
  chat::ParserOptions parser;
};

class ChatPrompt {
 public:
  // Throws pg::Error when a template does not parse. tool_use_source: the template variant for
  // requests with tools (GGUF tokenizer.chat_template.tool_use), or empty.
  ChatPrompt(const std::string& source, const tok::Tokenizer& tok, const std::string& tool_use_source = {});

  const std::string& source() const { return main_.tmpl.source(); }
  bool has_tool_use_variant() const { return tool_use_ != nullptr; }
  const chat::ChatFormat& format() const { return main_.format; }
  // Control tokens carry the format's markup (GPT-OSS channels): detokenize them as text.
  static bool special_text(const chat::ChatFormat& f) { return f.family == chat::ChatFamily::kGptOss; }

  // Renders, forces the tool choice and tokenizes. Throws ApiError 400 when the template rejects the
  // conversation (raise_exception) or the tool choice cannot be forced for this format.
  RenderedPrompt render(const ChatRequest& r) const;
  // The template output only (no forced prefix, no tokens).
  std::string render_text(const ChatRequest& r) const;

 private:
  struct Variant {
    chat::ChatTemplate tmpl;
    chat::ChatFormat format;
  };
  const Variant& pick(const ChatRequest& r) const;
  std::string render_with(const Variant& v, const ChatRequest& r) const;

  const tok::Tokenizer& tok_;
  Variant main_;
  std::unique_ptr<Variant> tool_use_;
};

// Prompt text → tokens: special-token text is parsed, and BOS is added once when the vocabulary
// asks for it and the text did not already start with it.
std::vector<int32_t> tokenize_prompt(const tok::Tokenizer& tok, const std::string& text);

}  // namespace pg::server
