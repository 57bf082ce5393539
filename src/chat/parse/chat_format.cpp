#include "chat/parse/chat_format.h"

namespace pg::chat {

std::string_view chat_family_name(ChatFamily family) {
  switch (family) {
    case ChatFamily::kContentOnly:
      return "content-only";
    case ChatFamily::kHermes:
      return "hermes";
    case ChatFamily::kQwen3Coder:
      return "qwen3-coder";
    case ChatFamily::kLlama3:
      return "llama3";
    case ChatFamily::kMistral:
      return "mistral";
    case ChatFamily::kDeepSeek:
      return "deepseek";
    case ChatFamily::kGptOss:
      return "gpt-oss";
  }
  return "unknown";
}

ChatFormat ChatFormat::of(ChatFamily family) {
  ChatFormat f;
  f.family = family;
  switch (family) {
    case ChatFamily::kGptOss:
    case ChatFamily::kContentOnly:
    case ChatFamily::kLlama3:
      break;
    case ChatFamily::kMistral:
      f.think_open = "[THINK]";
      f.think_close = "[/THINK]";
      break;
    default:
      f.think_open = "<think>";
      f.think_close = "</think>";
      break;
  }
  return f;
}

namespace {

bool has(std::string_view src, std::string_view needle) { return src.find(needle) != std::string_view::npos; }

}  // namespace

ChatFormat detect_chat_format(std::string_view src) {
  ChatFormat f;
  // Order matters: the most specific markers first. GPT-OSS and DeepSeek templates also contain words that the later,
  // looser checks look for.
  if (has(src, "<|channel|>") && has(src, "<|message|>")) {
    f = ChatFormat::of(ChatFamily::kGptOss);
  } else if (has(src, "[TOOL_CALLS]")) {
    f = ChatFormat::of(ChatFamily::kMistral);
  } else if (has(src,
                 "tool\xE2\x96\x81"
                 "calls\xE2\x96\x81"
                 "begin") ||
             has(src,
                 "tool\xE2\x96\x81"
                 "call\xE2\x96\x81"
                 "begin")) {
    f = ChatFormat::of(ChatFamily::kDeepSeek);
  } else if (has(src, "<seed:tool_call>")) {
    f = ChatFormat::of(ChatFamily::kQwen3Coder);
    f.tool_open = "<seed:tool_call>";
    f.tool_close = "</seed:tool_call>";
    f.think_open = "<seed:think>";
    f.think_close = "</seed:think>";
  } else if (has(src, "<tool_call>") && has(src, "<function=") && has(src, "<parameter=")) {
    f = ChatFormat::of(ChatFamily::kQwen3Coder);
  } else if (has(src, "<tool_call>") && !has(src, "<arg_key>") && !has(src, "<invoke")) {
    // GLM (<arg_key>) and MiniMax (<invoke name=) wrap different bodies in <tool_call>; they are not Hermes.
    f = ChatFormat::of(ChatFamily::kHermes);
  } else if (has(src, "<|python_tag|>") || (has(src, "<|start_header_id|>") && has(src, "\"parameters\""))) {
    f = ChatFormat::of(ChatFamily::kLlama3);
  } else {
    f = ChatFormat::of(ChatFamily::kContentOnly);
  }
  // Reasoning tags only where the template mentions them, so a literal "<think>" written by a model that has no
  // reasoning mode stays content. DeepSeek keeps <think> regardless (its R1 templates all use it).
  if (f.family == ChatFamily::kGptOss || f.think_open.starts_with("<seed:")) return f;
  f.think_open.clear();
  f.think_close.clear();
  if (f.family == ChatFamily::kMistral) {
    if (has(src, "[THINK]")) {
      f.think_open = "[THINK]";
      f.think_close = "[/THINK]";
    }
  } else if (f.family == ChatFamily::kDeepSeek || has(src, "<think>")) {
    f.think_open = "<think>";
    f.think_close = "</think>";
  }
  return f;
}

bool prompt_opens_reasoning(const ChatFormat& format, std::string_view prompt) {
  while (!prompt.empty() && (prompt.back() == ' ' || prompt.back() == '\n' || prompt.back() == '\t' || prompt.back() == '\r')) {
    prompt.remove_suffix(1);
  }
  if (format.family == ChatFamily::kGptOss) {
    return prompt.ends_with("<|channel|>analysis<|message|>");
  }
  return !format.think_open.empty() && prompt.ends_with(format.think_open);
}

}  // namespace pg::chat
