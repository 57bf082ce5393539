// `peregrine chat-template --template FILE --messages CONV.json`: renders a chat template with a
// conversation exactly as transformers' apply_chat_template would, and prints the text with no
// newline added. External parity checks call this form; keep the flags stable.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error("cannot read " + path);
  return s;
}

nlohmann::ordered_json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what + " is not valid JSON: " + e.what());
  }
}

}  // namespace

int cmd_chat_template(int argc, char** argv) {
  std::string template_path, messages_path, vars_text, now_text;
  bool no_gen = false;
  Args args("chat-template",
            "Render a Jinja chat template with a conversation, like transformers' apply_chat_template, and print the "
            "text exactly (no newline added).");
  args.opt("--template", &template_path, "chat template file (Jinja)", "FILE")
      .opt("--messages", &messages_path, "conversation: {\"messages\": [...], \"tools\": [...]} (tools optional)", "CONV.json")
      .flag("--no-generation-prompt", &no_gen, "render with add_generation_prompt=false")
      .opt("--now", &now_text, "fix strftime_now() to this time (default: current local time)", "ISO8601")
      .opt("--vars", &vars_text,
           "extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'; may set bos_token "
           "(default <s>) and eos_token (default </s>)",
           "JSON");
  if (!args.parse(argc, argv)) return 0;
  if (template_path.empty()) throw Error("--template is required (see --help)");
  if (messages_path.empty()) throw Error("--messages is required (see --help)");

  const std::string source = read_file(template_path);
  nlohmann::ordered_json conv = parse_json(read_file(messages_path), messages_path);
  nlohmann::ordered_json messages, tools;
  if (conv.is_array()) {
    messages = conv;
  } else if (conv.is_object()) {
    if (!conv.contains("messages")) throw Error(messages_path + ": missing \"messages\"");
    messages = conv["messages"];
    if (conv.contains("tools")) tools = conv["tools"];
  } else {
    throw Error(messages_path + ": expected an object with \"messages\" (and optionally \"tools\")");
  }
  if (!messages.is_array()) throw Error(messages_path + ": \"messages\" must be an array");

  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (args.given("vars")) {
    vars = parse_json(vars_text, "--vars");
    if (!vars.is_object()) throw Error("--vars must be a JSON object");
  }
  std::string bos = "<s>", eos = "</s>";
  if (vars.contains("bos_token") && vars["bos_token"].is_string()) bos = vars["bos_token"].get<std::string>();
  if (vars.contains("eos_token") && vars["eos_token"].is_string()) eos = vars["eos_token"].get<std::string>();

  std::optional<jinja::DateTime> now;
  if (args.given("now")) now = jinja::parse_iso8601(now_text);

  chat::ChatTemplate tpl(source, bos, eos);
  const std::string out = tpl.render(messages, tools, !no_gen, vars, now);
  if (!out.empty() && std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) throw Error("write to stdout failed");
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace pg::cli
