// `peregrine gguf synth`: random-weight models with the real shapes, metadata keys and tensor names of
// llama.cpp's converter (src/llama-arch.cpp is the authority), in any of llama.cpp's file types, fast
// enough to write a 32B Q4_K_M model in ~15 s on 16 cores (measured; the disk is the limit). Used to
// benchmark and test the engine at real sizes without downloading weights.
//
// Architectures: llama, qwen2, qwen3, qwen3moe, and the Qwen3.5 hybrids qwen35 / qwen35moe (their keys
// and tensor table come from gguf/synth_qwen35.h). Presets carry the published hyperparameters of
// llama3-8b, qwen3-8b, qwen3-32b, qwen3-30b-a3b, the Qwen3.5 models and a few more; the common fields
// can be overridden.
//
// Tensor types follow llama-quantize's rules (llama_tensor_get_type_impl in src/llama-quant.cpp) for
// the file type; norms, biases and the MoE router stay F32. For Q4_K_M that is: Q4_K for every matmul
// including an untied token_embd; Q6_K for output.weight (or the tied token_embd); Q6_K for attn_v and
// ffn_down (ffn_down_exps too) on the "use_more_bits" layers i < n/8, i >= 7n/8 and (i - n/8) % 3 == 2
// (16 of 32 layers for Llama 3 8B); with exactly 8 experts attn_v/attn_k become Q8_0 and attn_output
// Q5_K. The hybrids' fused attn_qkv counts with attn_v. Q5_K_M is the same with Q5_K as the base. A row that is not a multiple of
// the type's block falls back like llama-quantize (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, else F16). The golden quantized
// models in shared/golden were made by llama-quantize and the tests check these choices against them.
// "Plain" type names (Q4_K, Q5_K, ...) give every matmul that type, like `llama-quantize --pure`.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/synth_qwen35.h"
#include "gguf/writer.h"

namespace pg::gguf {

struct SynthConfig {
  std::string arch;          // llama | qwen2 | qwen3 | qwen3moe | qwen35 | qwen35moe
  std::string name;          // general.name
  std::string size_label;    // general.size_label ("8B", "30B-A3B"); empty: computed
  std::string vocab_family;  // tokenizer layout without --vocab-from: "qwen" | "qwen35" | "llama3"
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;  // dense FFN width (MoE: the converter still writes intermediate_size)
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // 0: n_embd / n_head
  int64_t n_vocab = 0;
  int64_t n_ctx = 0;
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;  // expert FFN width
  double rope_base = 10000.0;
  double rms_eps = 1e-5;
  bool tied = false;  // no output.weight: token_embd is the output matrix
  // qwen35 / qwen35moe: the rest of the hybrid's shape (rotary sections, Gated DeltaNet sizes, shared
  // expert). The fields above override the same fields in it.
  std::optional<Qwen35SynthConfig> hybrid;

  bool is_hybrid() const { return arch == "qwen35" || arch == "qwen35moe"; }
  bool is_moe() const { return arch == "qwen3moe" || arch == "qwen35moe"; }
  int64_t head_dim_or_default() const { return head_dim ? head_dim : (n_head ? n_embd / n_head : 0); }
};
// The hybrid configuration with the common fields of c applied (c must be qwen35 / qwen35moe).
Qwen35SynthConfig hybrid_config(const SynthConfig& c);

std::vector<std::string> synth_preset_names();
// Throws pg::Error listing the presets for an unknown name.
SynthConfig synth_preset(const std::string& name);
// Throws pg::Error naming the first field that is missing or inconsistent.
void validate_synth_config(const SynthConfig& cfg);

// A file type: llama.cpp's ftype id (general.file_type), the default matmul type and whether the
// llama-quantize mixture rules apply (false for plain type names, like --pure).
struct SynthFileType {
  std::string name;  // canonical: "Q4_K_M", "Q4_K", "F16", ...
  uint32_t ftype;    // LLAMA_FTYPE_*
  DType base;
  bool mixture;
};
// Accepts mixture names (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S/M/L, Q4_K_S/M,
// Q5_K_S/M, Q6_K) and plain type names (Q4_K, Q5_K, Q3_K, ...), case-insensitively. Throws pg::Error
// listing the accepted names.
SynthFileType synth_file_type(const std::string& name);
std::vector<std::string> synth_file_type_names();

struct SynthTensor {
  std::string name;
  std::vector<int64_t> shape;  // ggml order
  DType type;
  float mean, sigma;  // values are mean + sigma·N(0,1): weights N(0, 1/fan_in), norms near 1
  bool keep_f32;      // F32 in every file type (1-D tensors, routers, conv kernels)
};
// The tensor plan of a model in file order, with llama-quantize's per-tensor type choice.
std::vector<SynthTensor> synth_tensors(const SynthConfig& cfg, const SynthFileType& ft);

struct SynthOptions {
  SynthConfig cfg;
  SynthFileType file_type;
  uint64_t seed = 0;
  std::string vocab_from;                 // a GGUF whose tokenizer.* keys are copied (sets n_vocab); empty: synthetic BPE
  int threads = 0;                        // 0: all cores
  size_t chunk_bytes = size_t{32} << 20;  // streaming chunk of large tensors (output does not depend on it)
  // Called from the writing thread with bytes written so far and the total, a few times per second.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Builds the metadata (and, for vocab_from, adjusts cfg.n_vocab). Exposed for tests.
void synth_metadata(Writer& w, SynthConfig& cfg, const SynthFileType& ft, const std::string& vocab_from, uint64_t seed);
// A minimal valid byte-level BPE vocabulary: 256 byte tokens in GPT-2 byte-to-unicode order, merges
// building longer tokens from existing ones, then the family's special tokens at their real ids.
void synth_bpe_vocab(Writer& w, const std::string& family, int64_t n_vocab);

struct SynthResult {
  uint64_t file_size = 0;
  SynthConfig cfg;                   // as written (n_vocab from --vocab-from)
  std::vector<SynthTensor> tensors;  // the plan, in file order
};
// Writes the whole model to path (see Writer::write for atomicity; /dev/null works for timing).
SynthResult synth_write(SynthOptions opt, const std::string& path);

}  // namespace pg::gguf
