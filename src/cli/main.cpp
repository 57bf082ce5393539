#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"serve", pg::cli::cmd_serve, "OpenAI- and Anthropic-compatible HTTP server"},
    {"run", pg::cli::cmd_run, "generate a continuation of a raw prompt"},
    {"chat", pg::cli::cmd_chat, "interactive chat in the terminal using the model's chat template"},
    {"bench", pg::cli::cmd_bench, "measure prompt and generation speed (tok/s, GB/s)"},
    {"perplexity", pg::cli::cmd_perplexity, "perplexity of a text file (llama-perplexity compatible)"},
    {"logits", pg::cli::cmd_logits, "write the logits of every position of a token list"},
    {"tokenize", pg::cli::cmd_tokenize, "tokenize text with a model's vocabulary"},
    {"detokenize", pg::cli::cmd_detokenize, "turn token ids back into text"},
    {"chat-template", pg::cli::cmd_chat_template, "render a chat template with a conversation"},
    {"gguf", pg::cli::cmd_gguf, "GGUF tools: inspect, synth, import-tokenizer"},
};

void usage(FILE* f) {
  std::fprintf(f, "usage: peregrine <command> [options]\n\nPeregrine: fast local LLM inference.\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-15s %s\n", c.name, c.help);
  std::fprintf(f, "\nRun 'peregrine <command> --help' for the options of a command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("peregrine %s\n", PEREGRINE_VERSION);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (cmd != c.name) continue;
    try {
      return c.fn(argc - 1, argv + 1);
    } catch (const pg::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "error: out of memory\n");
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "error: unknown command '%s'\n\n", cmd.c_str());
  usage(stderr);
  return 2;
}
