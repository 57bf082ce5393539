// Which markup a model's chat template teaches it to emit for reasoning and tool calls, so generated text can be split
// back into content / reasoning_content / tool_calls (see output_parser.h).
#pragma once
#include <string>
#include <string_view>

namespace pg::chat {

enum class ChatFamily {
  kContentOnly,  // no tool-call markup; reasoning tags (if any) still apply
  kHermes,       // <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen2.5/Qwen3, QwQ, Hermes 2/3, Granite 4)
  kQwen3Coder,   // <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call> (Qwen3-Coder,
                 // Qwen3.5, Nemotron 3 Nano, Step-3.5; Seed-OSS with <seed:...> tags)
  kLlama3,       // the whole message is {"name": ..., "parameters": {...}}, optionally after <|python_tag|>;
                 // builtin tools as <|python_tag|>name.call(k="v")
  kMistral,      // [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or [TOOL_CALLS]NAME[ARGS]{...} (+ [CALL_ID]id)
  kDeepSeek,  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>...
              // (R1) or <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1)
  kGptOss,    // harmony channels: <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...
};

std::string_view chat_family_name(ChatFamily family);

struct ChatFormat {
  ChatFamily family = ChatFamily::kContentOnly;
  // Tags around a reasoning block; empty when the family has none (GPT-OSS carries reasoning in its analysis channel).
  std::string think_open;
  std::string think_close;
  // Wrapper around one tool call for kHermes / kQwen3Coder.
  std::string tool_open = "<tool_call>";
  std::string tool_close = "</tool_call>";

  // The family's usual tags: <think> for Hermes / Qwen3-Coder / DeepSeek, [THINK] for Mistral, none for the others
  // (GPT-OSS reasons in its analysis channel).
  static ChatFormat of(ChatFamily family);
  std::string_view name() const { return chat_family_name(family); }
};

// Picks the family from a Jinja chat template's source text (markers the template writes into prompts).
ChatFormat detect_chat_format(std::string_view template_source);

// True when the rendered prompt (ending with the generation prompt) leaves a reasoning block open, as templates with
// thinking enabled do ("<|im_start|>assistant\n<think>\n"): the output then starts inside the reasoning block and the
// parser must be created with starts_in_reasoning.
bool prompt_opens_reasoning(const ChatFormat& format, std::string_view rendered_prompt);

}  // namespace pg::chat
