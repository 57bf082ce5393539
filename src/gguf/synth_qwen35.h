// `peregrine gguf synth` presets for the Qwen3.5 / Qwen3.6 hybrids (llama.cpp architectures "qwen35" and
// "qwen35moe"): the published shapes, the metadata keys llama.cpp's converter writes and the tensor set
// llama.cpp's loader requires, so a synthesized file loads in both Peregrine and llama.cpp.
//
// Self-contained on purpose (only the GGUF Writer): gguf/synth.cpp owns file types, vocabularies and the
// data streaming; it calls these functions for the hybrid presets. Every tensor comes with the mean and
// spread of its random values — the hybrids need a few that are not "norm ≈ 1, weight ≈ 0": ssm_a is
// −exp(A_log) < 0 (a positive value would make the recurrent state grow without bound over long
// prompts), and the decay/gate biases sit near zero.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/writer.h"

namespace pg::gguf {

struct Qwen35SynthConfig {
  std::string arch;        // "qwen35" | "qwen35moe"
  std::string name;        // general.name
  std::string size_label;  // "27B", "35B-A3B"
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;  // dense FFN width (MoE: written as feed_forward_length, unused)
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // full-attention key/value head size
  int64_t n_rot = 0;     // rotary dims (partial_rotary_factor · head_dim)
  int64_t rope_sections[4] = {0, 0, 0, 0};
  double rope_base = 1e7;
  double rms_eps = 1e-6;
  int64_t n_vocab = 0;
  int64_t n_ctx = 0;
  bool tied = false;
  int64_t full_attention_interval = 4;
  // Gated DeltaNet
  int64_t ssm_conv_kernel = 4;
  int64_t ssm_state = 0;    // head_k_dim = head_v_dim
  int64_t ssm_groups = 0;   // key/query heads
  int64_t ssm_dt_rank = 0;  // value heads
  // MoE (qwen35moe)
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;
  bool fused_gate_up_exps = false;  // one ffn_gate_up_exps tensor instead of ffn_gate_exps + ffn_up_exps

  int64_t ssm_inner() const { return ssm_dt_rank * ssm_state; }
  bool recurrent(int64_t il) const { return (il + 1) % full_attention_interval != 0; }
};

// "qwen35-27b", "qwen35-9b", "qwen35-0.8b", "qwen35moe-35b-a3b".
std::vector<std::string> qwen35_synth_preset_names();
// nullopt for a name that is not one of these presets.
std::optional<Qwen35SynthConfig> qwen35_synth_preset(const std::string& name);
// Throws pg::Error naming the first missing or inconsistent field.
void validate_qwen35_synth_config(const Qwen35SynthConfig& c);

// The "<arch>.*" keys (block_count … ssm.*, expert counts). general.* (architecture, name, file_type,
// ...) and tokenizer.* are the caller's.
void qwen35_synth_metadata(Writer& w, const Qwen35SynthConfig& c);

struct Qwen35SynthTensor {
  std::string name;
  std::vector<int64_t> shape;  // ggml order
  float mean, sigma;           // values mean + sigma·N(0,1)
  bool keep_f32;               // stays F32 in every file type (1-D tensors, ssm_conv1d, routers)
};
// All tensors in file order. Types are the caller's choice (llama-quantize rules) except keep_f32.
std::vector<Qwen35SynthTensor> qwen35_synth_tensors(const Qwen35SynthConfig& c);

}  // namespace pg::gguf
