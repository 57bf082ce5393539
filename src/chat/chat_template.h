// Chat templates: turn an OpenAI-style conversation into the prompt text a model was trained on,
// exactly as Hugging Face's tokenizer.apply_chat_template renders it (see chat/jinja/jinja.h).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/jinja/jinja.h"

namespace pg::gguf {
class File;
}

namespace pg::chat {

class ChatTemplate {
 public:
  // Parses the template once (throws pg::jinja::Error on a syntax error).
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token);

  // Renders like apply_chat_template(messages, tools=tools, add_generation_prompt=...,
  // **extra_vars): the template sees messages, tools (None when tools is null), documents (None),
  // add_generation_prompt, bos_token, eos_token and every member of extra_vars (which may
  // override bos_token/eos_token, and carries flags such as enable_thinking). `now` fixes
  // strftime_now(); by default it is the current local time.
  // Throws pg::jinja::Error when the template raises or fails; for raise_exception() the error's
  // message is the template's text.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra_vars = nlohmann::ordered_json::object(),
                     std::optional<jinja::DateTime> now = std::nullopt) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }
  void set_limits(const jinja::Limits& l) { limits_ = l; }

 private:
  std::string source_, bos_, eos_;
  jinja::Template tpl_;
  jinja::Limits limits_;
};

// The chat template stored in a GGUF file. name "" selects `tokenizer.chat_template`; any other
// name selects the variant `tokenizer.chat_template.<name>` (e.g. "tool_use", "rag"). nullopt
// when the file has no such key.
std::optional<std::string> gguf_chat_template(const gguf::File& f, const std::string& name = "");
// Names of the variants present: "" for the default template, then each named variant.
std::vector<std::string> gguf_chat_template_names(const gguf::File& f);
// What apply_chat_template picks: the named variant when name is given (error if absent);
// otherwise "tool_use" when tools are passed and that variant exists, else the default.
// Throws pg::Error when the file has no usable template.
std::string select_gguf_chat_template(const gguf::File& f, const std::string& name, bool has_tools);
// Text of the BOS / EOS tokens from the GGUF vocabulary ("" when the file does not define them).
std::string gguf_token_text(const gguf::File& f, const std::string& id_key);
// Convenience: selected template + the file's bos/eos token text.
ChatTemplate chat_template_from_gguf(const gguf::File& f, const std::string& name = "", bool has_tools = false);

}  // namespace pg::chat
