#include "chat/chat_template.h"

#include "core/error.h"
#include "gguf/gguf.h"

namespace pg::chat {

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token)
    : source_(source), bos_(std::move(bos_token)), eos_(std::move(eos_token)), tpl_(source) {}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra_vars,
                                 std::optional<jinja::DateTime> now) const {
  if (!messages.is_array()) throw pg::Error("chat template: messages must be a JSON array");
  if (!extra_vars.is_null() && !extra_vars.is_object()) throw pg::Error("chat template: extra variables must be a JSON object");
  // The same keyword arguments transformers passes to Template.render().
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = messages;
  vars["tools"] = tools;  // null -> None
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  vars["bos_token"] = bos_;
  vars["eos_token"] = eos_;
  if (extra_vars.is_object()) {
    for (auto it = extra_vars.begin(); it != extra_vars.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
        throw pg::Error("chat template: extra variable '" + k + "' would override a render argument");
      vars[k] = it.value();
    }
  }
  jinja::RenderOptions opts;
  opts.limits = limits_;
  opts.now = now;
  return tpl_.render(vars, opts);
}

std::optional<std::string> gguf_chat_template(const gguf::File& f, const std::string& name) {
  return f.get_string_opt(name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name);
}

std::vector<std::string> gguf_chat_template_names(const gguf::File& f) {
  std::vector<std::string> names;
  const std::string prefix = "tokenizer.chat_template";
  for (const auto& kv : f.metadata()) {
    if (kv.first == prefix) {
      names.insert(names.begin(), "");
    } else if (kv.first.size() > prefix.size() + 1 && kv.first.compare(0, prefix.size() + 1, prefix + ".") == 0) {
      names.push_back(kv.first.substr(prefix.size() + 1));
    }
  }
  return names;
}

std::string select_gguf_chat_template(const gguf::File& f, const std::string& name, bool has_tools) {
  if (!name.empty()) {
    auto t = gguf_chat_template(f, name);
    if (!t) throw pg::Error(f.path() + ": no chat template named '" + name + "' (key tokenizer.chat_template." + name + ")");
    return *t;
  }
  if (has_tools) {
    if (auto t = gguf_chat_template(f, "tool_use")) return *t;
  }
  if (auto t = gguf_chat_template(f, "")) return *t;
  throw pg::Error(f.path() + ": the file has no chat template (tokenizer.chat_template)");
}

std::string gguf_token_text(const gguf::File& f, const std::string& id_key) {
  auto id = f.get_int_opt(id_key);
  const gguf::Value* tokens = f.find("tokenizer.ggml.tokens");
  if (!id || !tokens || tokens->type != gguf::ValueType::ARRAY) return "";
  const auto& arr = tokens->as_array();
  if (*id < 0 || static_cast<uint64_t>(*id) >= arr.items.size()) return "";
  const auto& v = arr.items[static_cast<size_t>(*id)];
  return v.type == gguf::ValueType::STRING ? v.as_string() : "";
}

ChatTemplate chat_template_from_gguf(const gguf::File& f, const std::string& name, bool has_tools) {
  return ChatTemplate(select_gguf_chat_template(f, name, has_tools), gguf_token_text(f, "tokenizer.ggml.bos_token_id"),
                      gguf_token_text(f, "tokenizer.ggml.eos_token_id"));
}

}  // namespace pg::chat
