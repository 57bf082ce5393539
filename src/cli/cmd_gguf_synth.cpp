// `peregrine gguf synth`: write a random-weight model with real shapes (see gguf/synth.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "gguf/inspect.h"
#include "gguf/synth.h"

namespace pg::cli {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string clock_text(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

}  // namespace

int cmd_gguf_synth(int argc, char** argv) {
  std::string preset, type, out, arch, vocab_from, name;
  int64_t seed = 0, layers = 0, dim = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, experts = 0,
          experts_used = 0, expert_ffn = 0, ctx = 0;
  double rope_base = 0, eps = 0;
  int threads = 0;
  bool tied = false, untied = false;
  Args args("gguf synth",
            "Write a random-weight model with a real architecture's shapes, metadata keys and tensor names (as llama.cpp's "
            "converter writes them), in any llama.cpp file type. Start from a preset and override fields, or give every shape "
            "flag with --arch.");
  args.opt("--preset", &preset, "model preset: " + join(gguf::synth_preset_names()), "NAME")
      .opt("--type", &type, "file type: mixtures like Q4_K_M (llama-quantize's per-tensor rules) or plain types like Q4_K "
                            "(every matmul that type); one of " + join(gguf::synth_file_type_names()), "TYPE")
      .opt("-o,--output", &out, "output GGUF file", "FILE")
      .opt("--vocab-from", &vocab_from, "copy every tokenizer.* key from this GGUF (sets the vocabulary size)", "GGUF")
      .opt("--seed", &seed, "random seed")
      .opt("--arch", &arch, "architecture: llama, qwen2, qwen3, qwen3moe", "ARCH")
      .opt("--layers", &layers, "number of blocks")
      .opt("--dim", &dim, "embedding width")
      .opt("--ffn", &ffn, "feed-forward width")
      .opt("--heads", &heads, "attention heads")
      .opt("--kv-heads", &kv_heads, "key/value heads (GQA)")
      .opt("--head-dim", &head_dim, "head dimension (default dim / heads)")
      .opt("--vocab", &vocab, "vocabulary size")
      .opt("--experts", &experts, "experts (qwen3moe)")
      .opt("--experts-used", &experts_used, "experts used per token (qwen3moe)")
      .opt("--expert-ffn", &expert_ffn, "expert feed-forward width (qwen3moe)")
      .opt("--ctx", &ctx, "training context length")
      .opt("--rope-base", &rope_base, "rope frequency base")
      .opt("--eps", &eps, "RMS norm epsilon")
      .flag("--tied", &tied, "no output.weight: the output reuses token_embd")
      .flag("--untied", &untied, "write a separate output.weight")
      .opt("--name", &name, "general.name", "TEXT")
      .opt("-t,--threads", &threads, "threads (default: all cores)")
      .footer("Weights are N(0, 1/fan_in) (norms near 1), written from a pool of quantized random tiles, so even a 32B model "
              "takes minutes. Example:\n  peregrine gguf synth --preset qwen3-8b --type Q4_K_M -o qwen3-8b-synth.gguf \\\n"
              "      --vocab-from shared/testdata/tokenizer/ggml-vocab-qwen3.gguf");
  if (!args.parse(argc, argv)) return 0;
  if (out.empty()) throw Error("gguf synth: -o FILE is required");
  if (type.empty()) throw Error("gguf synth: --type is required (e.g. Q4_K_M, Q8_0, F16)");
  if (tied && untied) throw Error("gguf synth: --tied and --untied exclude each other");
  if (threads < 0) throw Error("gguf synth: --threads must not be negative");

  gguf::SynthOptions opt;
  if (!preset.empty()) {
    opt.cfg = gguf::synth_preset(preset);
  } else {
    if (arch.empty()) throw Error("gguf synth: give --preset NAME, or --arch with the shape flags");
    opt.cfg.arch = arch;
    opt.cfg.vocab_family = arch == "llama" ? "llama3" : "qwen";
    opt.cfg.n_ctx = 4096;
    opt.cfg.rope_base = arch == "llama" ? 500000.0 : 1000000.0;
    opt.cfg.rms_eps = arch == "llama" ? 1e-5 : 1e-6;
    opt.cfg.n_vocab = arch == "llama" ? 128256 : 151936;
  }
  auto& c = opt.cfg;
  if (args.given("arch")) {
    if (!preset.empty() && arch != c.arch) throw Error("gguf synth: --arch " + arch + " contradicts preset " + preset);
  }
  if (args.given("layers")) c.n_layer = layers;
  if (args.given("dim")) c.n_embd = dim;
  if (args.given("ffn")) c.n_ff = ffn;
  if (args.given("heads")) c.n_head = heads;
  if (args.given("kv-heads")) c.n_head_kv = kv_heads;
  if (!args.given("kv-heads") && preset.empty() && args.given("heads")) c.n_head_kv = heads;
  if (args.given("head-dim")) c.head_dim = head_dim;
  if (args.given("vocab")) c.n_vocab = vocab;
  if (args.given("experts")) c.n_expert = experts;
  if (args.given("experts-used")) c.n_expert_used = experts_used;
  if (args.given("expert-ffn")) c.n_ff_exp = expert_ffn;
  if (args.given("ctx")) c.n_ctx = ctx;
  if (args.given("rope-base")) c.rope_base = rope_base;
  if (args.given("eps")) c.rms_eps = eps;
  if (tied) c.tied = true;
  if (untied) c.tied = false;
  if (args.given("name")) c.name = name;
  if (!vocab_from.empty() && args.given("vocab")) throw Error("gguf synth: --vocab and --vocab-from exclude each other");
  if (seed < 0) throw Error("gguf synth: --seed must not be negative");
  gguf::validate_synth_config(c);

  opt.file_type = gguf::synth_file_type(type);
  opt.seed = static_cast<uint64_t>(seed);
  opt.vocab_from = vocab_from;
  opt.threads = threads ? threads : default_thread_count();

  const bool tty = isatty(STDERR_FILENO) == 1;
  const auto t0 = std::chrono::steady_clock::now();
  if (tty) {
    opt.progress = [t0](uint64_t done, uint64_t total) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
      constexpr int kWidth = 30;
      const int fill = static_cast<int>(frac * kWidth);
      std::string bar(static_cast<size_t>(fill), '=');
      if (fill < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - fill - 1), ' ');
      const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
      const std::string eta = rate > 0 && done < total ? "ETA " + clock_text(static_cast<double>(total - done) / rate) : "";
      std::fprintf(stderr, "\r[%s] %5.1f%%  %s / %s  %s/s  %s   ", bar.c_str(), 100 * frac, gguf::human_bytes(done).c_str(),
                   gguf::human_bytes(total).c_str(), gguf::human_bytes(static_cast<uint64_t>(rate)).c_str(), eta.c_str());
      std::fflush(stderr);
    };
  }
  gguf::SynthResult result;
  try {
    result = gguf::synth_write(opt, out);
  } catch (...) {
    if (tty) std::fputc('\n', stderr);
    throw;
  }
  if (tty) std::fputc('\n', stderr);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::map<DType, int> by_type;
  uint64_t params = 0;
  for (const auto& t : result.tensors) {
    by_type[t.type]++;
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    params += n;
  }
  std::string mix;
  for (const auto& [t, n] : by_type) mix += (mix.empty() ? "" : ", ") + std::string(dtype_name(t)) + " x" + std::to_string(n);
  std::printf("wrote %s: %s %s, %zu tensors (%s), %s parameters, vocabulary %lld, %s in %.1f s\n", out.c_str(), c.arch.c_str(),
              opt.file_type.name.c_str(), result.tensors.size(), mix.c_str(), gguf::human_count(params).c_str(),
              static_cast<long long>(result.cfg.n_vocab), gguf::human_bytes(result.file_size).c_str(), secs);
  return 0;
}

}  // namespace pg::cli
