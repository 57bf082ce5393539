#include "server/chat_prompt.h"

#include "core/log.h"

namespace pg::server {

namespace {

std::string token_text_of(const tok::Tokenizer& tok, int32_t id) {
  if (id < 0 || id >= tok.n_vocab()) return {};
  return tok.token_text(id);
}

}  // namespace

std::vector<int32_t> tokenize_prompt(const tok::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.encode(text, false, true);
  if (tok.add_bos() && tok.bos() >= 0 && (ids.empty() || ids.front() != tok.bos())) ids.insert(ids.begin(), tok.bos());
  return ids;
}

ChatPrompt::ChatPrompt(const std::string& source, const tok::Tokenizer& tok, const std::string& tool_use_source)
    : tok_(tok),
      main_{chat::ChatTemplate(source, token_text_of(tok, tok.bos()), token_text_of(tok, tok.eos())), chat::detect_chat_format(source)} {
  if (!tool_use_source.empty())
    tool_use_ = std::make_unique<Variant>(Variant{
        chat::ChatTemplate(tool_use_source, token_text_of(tok, tok.bos()), token_text_of(tok, tok.eos())),
        chat::detect_chat_format(tool_use_source)});
}

const ChatPrompt::Variant& ChatPrompt::pick(const ChatRequest& r) const {
  // As apply_chat_template: the tool_use variant when tools are passed and it exists.
  return tool_use_ && !r.tools.empty() && r.tool_choice != ToolChoice::kNone ? *tool_use_ : main_;
}

std::string ChatPrompt::render_with(const Variant& v, const ChatRequest& r) const {
  const bool tools = !r.tools.empty() && r.tool_choice != ToolChoice::kNone;
  json extra = r.template_kwargs;
  if (r.enable_thinking) extra["enable_thinking"] = *r.enable_thinking;
  try {
    return v.tmpl.render(r.messages, tools ? r.tools : json(nullptr), true, extra);
  } catch (const Error& e) {
    // The template's own raise_exception() messages ("roles must alternate", ...) are about the request.
    throw ApiError(400, std::string("the chat template rejected the conversation: ") + e.what(), "messages");
  }
}

std::string ChatPrompt::render_text(const ChatRequest& r) const { return render_with(pick(r), r); }

RenderedPrompt ChatPrompt::render(const ChatRequest& r) const {
  RenderedPrompt out;
  const Variant& v = pick(r);
  const chat::ChatFormat& fmt = v.format;
  out.format = v.format;
  out.text = render_with(v, r);
  const bool parse_tools = !r.tools.empty() && r.tool_choice != ToolChoice::kNone;
  out.parser.tools = parse_tools ? r.tools : json::array();
  out.parser.parse_tool_calls = parse_tools;
  out.parser.reasoning = true;
  out.parser.starts_in_reasoning = chat::prompt_opens_reasoning(fmt, out.text);

  if (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) {
    std::string f;
    // A reasoning block the prompt opened is closed first: the call is the whole answer.
    if (out.parser.starts_in_reasoning && !fmt.think_close.empty()) f += fmt.think_close + "\n\n";
    const bool named = r.tool_choice == ToolChoice::kNamed;
    switch (fmt.family) {
      case chat::ChatFamily::kHermes:
        f += fmt.tool_open + "\n";
        if (named) f += "{\"name\": " + json(r.tool_name).dump() + ", \"arguments\": {";
        break;
      case chat::ChatFamily::kQwen3Coder:
        f += fmt.tool_open + "\n";
        if (named) f += "<function=" + r.tool_name + ">\n";
        break;
      case chat::ChatFamily::kLlama3:
        f += named ? "{\"name\": " + json(r.tool_name).dump() + ", \"parameters\": {" : "{\"name\": \"";
        break;
      case chat::ChatFamily::kMistral:
      case chat::ChatFamily::kDeepSeek:
      case chat::ChatFamily::kGptOss:
        // The call grammar (structured.cpp) starts with the format's call opener: nothing more is forced.
        break;
      default:
        throw ApiError(400,
                       "tool_choice \"" + std::string(r.tool_choice == ToolChoice::kNamed ? "named function" : "required") +
                           "\" is not supported with this model's chat format (" + std::string(fmt.name()) +
                           "); use \"auto\"",
                       "tool_choice");
    }
    out.forced = f;
    out.text += f;
  }
  out.tokens = tokenize_prompt(tok_, out.text);
  return out;
}

}  // namespace pg::server
