// Every subcommand of the peregrine executable. Each returns the process exit code; errors are
// thrown as pg::Error and printed by main as one line.
#pragma once

namespace pg::cli {

int cmd_run(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_detokenize(int argc, char** argv);
int cmd_chat_template(int argc, char** argv);
int cmd_gguf(int argc, char** argv);  // gguf inspect | synth | import-tokenizer

// Sub-subcommands of `gguf`, each in its own file.
int cmd_gguf_inspect(int argc, char** argv);
int cmd_gguf_synth(int argc, char** argv);
int cmd_gguf_import_tokenizer(int argc, char** argv);

}  // namespace pg::cli
