// `peregrine gguf synth`: write a random-weight model with real shapes (see gguf/synth.h).
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "gguf/inspect.h"
#include "gguf/synth.h"
#include "gguf/synth_dflash.h"

namespace pg::cli {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

int64_t parse_int_flag(const std::string& v, const char* flag) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno) throw Error("invalid integer '" + v + "' for " + flag);
  return x;
}

double parse_float_flag(const std::string& v, const char* flag) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || errno || !std::isfinite(x)) throw Error("invalid number '" + v + "' for " + flag);
  return x;
}

std::string clock_text(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

}  // namespace

int cmd_gguf_synth(int argc, char** argv) {
  std::string preset, type, out, arch, vocab_from;
  int64_t seed = 0;
  bool tied = false, untied = false;
  bool dflash = false;  // --dflash: a DFlash draft for the target shape instead of the target
  std::optional<std::string> dflash_layers, block_size, target_layers, mask_token;
  // Shape overrides are optional strings so that --help shows no misleading "default: 0": their
  // defaults come from the preset.
  std::optional<std::string> layers, dim, ffn, heads, kv_heads, head_dim, vocab, experts, experts_used, expert_ffn, ctx,
      rope_base, eps, name, threads;
  Args args("gguf synth",
            "Write a random-weight model with a real architecture's shapes, metadata keys and tensor names (as llama.cpp's "
            "converter writes them), in any llama.cpp file type. Start from a preset and override fields, or give every shape "
            "flag with --arch.");
  args.opt("--preset", &preset, "model preset: " + join(gguf::synth_preset_names()), "NAME")
      .opt("--type", &type,
           "file type: mixtures like Q4_K_M (llama-quantize's per-tensor rules) or plain types like Q4_K "
           "(every matmul that type); one of " +
               join(gguf::synth_file_type_names()),
           "TYPE")
      .opt("-o,--output", &out, "output GGUF file", "FILE")
      .opt("--vocab-from", &vocab_from, "copy every tokenizer.* key from this GGUF (sets the vocabulary size)", "GGUF")
      .opt("--seed", &seed, "random seed")
      .opt("--arch", &arch,
           "architecture: llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe (the hybrids take their Gated "
           "DeltaNet sizes from the published models)",
           "ARCH")
      .opt("--layers", &layers, "number of blocks", "N")
      .opt("--dim", &dim, "embedding width", "N")
      .opt("--ffn", &ffn, "feed-forward width", "N")
      .opt("--heads", &heads, "attention heads", "N")
      .opt("--kv-heads", &kv_heads, "key/value heads (GQA; default --heads with --arch)", "N")
      .opt("--head-dim", &head_dim, "head dimension (default dim / heads)", "N")
      .opt("--vocab", &vocab, "vocabulary size", "N")
      .opt("--experts", &experts, "experts (MoE architectures)", "N")
      .opt("--experts-used", &experts_used, "experts used per token (MoE architectures)", "N")
      .opt("--expert-ffn", &expert_ffn, "expert feed-forward width (MoE architectures)", "N")
      .opt("--ctx", &ctx, "training context length", "N")
      .opt("--rope-base", &rope_base, "rope frequency base", "X")
      .opt("--eps", &eps, "RMS norm epsilon", "X")
      .flag("--tied", &tied, "no output.weight: the output reuses token_embd")
      .flag("--untied", &untied, "write a separate output.weight")
      .opt("--name", &name, "general.name", "TEXT")
      .opt("-t,--threads", &threads, "threads (default: all cores)", "N")
      .flag("--dflash", &dflash, "write a DFlash draft (llama.cpp's dflash layout) shaped for this target instead")
      .opt("--dflash-layers", &dflash_layers, "--dflash: draft layers (default 5)", "N")
      .opt("--block-size", &block_size, "--dflash: block size (default 16)", "N")
      .opt("--target-layers", &target_layers, "--dflash: 0-based target layers read, comma-separated (default: the published rule)", "IDS")
      .opt("--mask-token", &mask_token, "--dflash: mask token id (default: the Qwen families' ids, else the last id)", "ID")
      .footer(
          "Weights are N(0, 1/fan_in) (norms near 1), assembled from a pool of quantized random tiles and streamed to the "
          "file, so a 32B Q4_K_M model takes about 15 s on 16 cores (at disk speed). Example:\n"
          "  peregrine gguf synth --preset qwen3-8b --type Q4_K_M -o qwen3-8b-synth.gguf \\\n"
          "      --vocab-from shared/testdata/tokenizer/ggml-vocab-qwen3.gguf");
  if (!args.parse(argc, argv)) return 0;
  if (out.empty()) throw Error("gguf synth: -o FILE is required");
  if (type.empty()) throw Error("gguf synth: --type is required (e.g. Q4_K_M, Q8_0, F16)");
  if (tied && untied) throw Error("gguf synth: --tied and --untied exclude each other");
  if (seed < 0) throw Error("gguf synth: --seed must not be negative");

  gguf::SynthOptions opt;
  if (!preset.empty()) {
    opt.cfg = gguf::synth_preset(preset);
    if (!arch.empty() && arch != opt.cfg.arch) throw Error("gguf synth: --arch " + arch + " contradicts preset " + preset);
  } else {
    if (arch.empty()) throw Error("gguf synth: give --preset NAME, or --arch with the shape flags");
    const bool hybrid = arch == "qwen35" || arch == "qwen35moe";
    opt.cfg.arch = arch;
    opt.cfg.vocab_family = arch == "llama" ? "llama3" : hybrid ? "qwen35" : "qwen";
    opt.cfg.n_ctx = 4096;
    opt.cfg.rope_base = arch == "llama" ? 500000.0 : hybrid ? 1e7 : 1e6;
    opt.cfg.rms_eps = arch == "llama" ? 1e-5 : 1e-6;
    opt.cfg.n_vocab = arch == "llama" ? 128256 : hybrid ? 248320 : 151936;
  }
  auto& c = opt.cfg;
  auto set_int = [](const std::optional<std::string>& v, const char* flag, int64_t& dst) {
    if (v) dst = parse_int_flag(*v, flag);
  };
  set_int(layers, "--layers", c.n_layer);
  set_int(dim, "--dim", c.n_embd);
  set_int(ffn, "--ffn", c.n_ff);
  set_int(heads, "--heads", c.n_head);
  set_int(kv_heads, "--kv-heads", c.n_head_kv);
  if (!kv_heads && preset.empty() && heads) c.n_head_kv = c.n_head;
  set_int(head_dim, "--head-dim", c.head_dim);
  set_int(vocab, "--vocab", c.n_vocab);
  set_int(experts, "--experts", c.n_expert);
  set_int(experts_used, "--experts-used", c.n_expert_used);
  set_int(expert_ffn, "--expert-ffn", c.n_ff_exp);
  set_int(ctx, "--ctx", c.n_ctx);
  if (rope_base) c.rope_base = parse_float_flag(*rope_base, "--rope-base");
  if (eps) c.rms_eps = parse_float_flag(*eps, "--eps");
  if (!(c.rope_base > 0) || !(c.rms_eps > 0)) throw Error("gguf synth: --rope-base and --eps must be positive");
  if (tied) c.tied = true;
  if (untied) c.tied = false;
  if (name) c.name = *name;
  if (!vocab_from.empty() && vocab) throw Error("gguf synth: --vocab and --vocab-from exclude each other");
  int64_t n_threads = default_thread_count();
  if (threads) n_threads = parse_int_flag(*threads, "--threads");
  if (n_threads < 1 || n_threads > 1024) throw Error("gguf synth: --threads must be 1..1024");
  gguf::validate_synth_config(c);

  opt.file_type = gguf::synth_file_type(type);
  opt.seed = static_cast<uint64_t>(seed);
  opt.vocab_from = vocab_from;
  opt.threads = static_cast<int>(n_threads);

  if (dflash) {
    gguf::DFlashSynthOptions d;
    if (dflash_layers) d.n_layer = static_cast<int>(parse_int_flag(*dflash_layers, "--dflash-layers"));
    if (block_size) d.block_size = static_cast<int>(parse_int_flag(*block_size, "--block-size"));
    if (mask_token) d.mask_token = parse_int_flag(*mask_token, "--mask-token");
    if (target_layers) {
      std::string cur;
      for (char ch : *target_layers + ",") {
        if (ch != ',') {
          cur += ch;
        } else if (!cur.empty()) {
          d.target_layers.push_back(static_cast<int>(parse_int_flag(cur, "--target-layers")));
          cur.clear();
        }
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t size = gguf::synth_dflash_write(c, d, opt.file_type, opt.seed, out);
    std::printf("wrote %s: DFlash draft for %s (%d layers, block %d), %s in %.1f s\n", out.c_str(), c.arch.c_str(), d.n_layer, d.block_size,
                gguf::human_bytes(size).c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return 0;
  }
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
