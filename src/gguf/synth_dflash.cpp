#include "gguf/synth_dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"
#include "gguf/writer.h"

namespace pg::gguf {

std::vector<int> dflash_default_layers(int target_layers, int n) {
  PG_CHECK(n >= 1 && target_layers >= 2, "DFlash draft: need at least one feature layer and a target of two layers");
  std::vector<int> ids;
  if (n == 1) return {target_layers / 2};
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int>(std::lround(1.0 + i * (target_layers - 4.0) / (n - 1))));
  if (std::set<int>(ids.begin(), ids.end()).size() != ids.size() || ids.back() >= target_layers || ids.front() < 0) {
    ids.clear();
    for (int i = 0; i < n; ++i) ids.push_back(std::min(target_layers - 1, 1 + i));
  }
  return ids;
}

namespace {

// N(0, 1) from a splitmix64 stream (Box–Muller); deterministic per seed.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float normal() {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = static_cast<double>(next() >> 11) / 9007199254740992.0;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

}  // namespace

uint64_t synth_dflash_write(const SynthConfig& t, const DFlashSynthOptions& d, const SynthFileType& ft, uint64_t seed,
                            const std::string& path) {
  validate_synth_config(t);
  PG_CHECK(d.n_layer >= 1 && d.n_layer <= 64, "gguf synth --dflash: --dflash-layers must be in [1, 64]");
  PG_CHECK(d.block_size >= 2 && d.block_size <= 64, "gguf synth --dflash: --block-size must be in [2, 64]");
  const std::vector<int> layers = d.target_layers.empty() ? dflash_default_layers(static_cast<int>(t.n_layer), 5) : d.target_layers;
  for (int id : layers)
    PG_CHECK(id >= 0 && id < t.n_layer, "gguf synth --dflash: target layer " + std::to_string(id) + " is not a layer of the " +
                                            std::to_string(t.n_layer) + "-layer target");
  int64_t mask = d.mask_token;
  if (mask < 0) mask = t.vocab_family == "qwen35" && t.n_vocab > 248070 ? 248070 : t.vocab_family == "qwen" && t.n_vocab > 151669 ? 151669 : t.n_vocab - 1;
  PG_CHECK(mask >= 0 && mask < t.n_vocab, "gguf synth --dflash: --mask-token is outside the vocabulary");
  const int64_t e = t.n_embd, hd = t.head_dim_or_default(), q = t.n_head * hd, kv = t.n_head_kv * hd, ff = t.n_ff;
  Writer w;
  const std::string a = "dflash";
  w.set_string("general.architecture", a);
  w.set_string("general.name", (t.name.empty() ? t.arch : t.name) + "-dflash-synth");
  w.set_u32("general.file_type", ft.ftype);
  w.set_u32(a + ".block_count", static_cast<uint32_t>(d.n_layer));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(t.n_ctx));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(e));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(t.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(t.n_head_kv));
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(hd));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(hd));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(t.rms_eps));
  w.set_f32(a + ".rope.freq_base", static_cast<float>(t.rope_base));
  w.set_u32(a + ".block_size", static_cast<uint32_t>(d.block_size));
  std::vector<int32_t> stored;
  for (int id : layers) stored.push_back(id + 1);  // llama.cpp stores layer inputs
  w.set(a + ".target_layers", make_i32_array(stored));
  w.set_u32("tokenizer.ggml.mask_token_id", static_cast<uint32_t>(mask));
  uint64_t tensor_seed = seed * 1000003ull + 17;
  auto matrix = [&](const std::string& name, int64_t in, int64_t out) {
    DType ty = ft.base;
    const uint32_t bs = traits(ty).block_size;
    if (ty != DType::F32 && ty != DType::F16 && (!can_quantize(ty) || in % bs != 0)) ty = DType::F16;
    const uint64_t s0 = tensor_seed++;
    w.add_tensor_stream(name, ty, {in, out}, [=](const Writer::Emit& emit) {
      Rng r{s0};
      const float sigma = 1.0f / std::sqrt(static_cast<float>(in));
      std::vector<float> row(static_cast<size_t>(in));
      std::vector<uint8_t> bytes(row_bytes(ty, in));
      for (int64_t o = 0; o < out; ++o) {
        for (auto& x : row) x = sigma * r.normal();
        if (ty == DType::F32) {
          emit(row.data(), row.size() * 4);
          continue;
        }
        if (ty == DType::F16) {
          auto* h = reinterpret_cast<uint16_t*>(bytes.data());
          for (int64_t i = 0; i < in; ++i) h[i] = f32_to_fp16(row[static_cast<size_t>(i)]);
        } else {
          quantize_weights(ty, row.data(), bytes.data(), in);
        }
        emit(bytes.data(), bytes.size());
      }
    });
  };
  auto norm = [&](const std::string& name, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    Rng r{tensor_seed++};
    for (auto& x : v) x = 1.0f + 0.02f * r.normal();
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    w.add_tensor(name, DType::F32, {n}, std::move(b));
  };
  matrix("fc.weight", static_cast<int64_t>(layers.size()) * e, e);
  norm("enc.output_norm.weight", e);
  norm("output_norm.weight", e);
  for (int il = 0; il < d.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    norm(p + "attn_norm.weight", e);
    matrix(p + "attn_q.weight", e, q);
    matrix(p + "attn_k.weight", e, kv);
    matrix(p + "attn_v.weight", e, kv);
    matrix(p + "attn_output.weight", q, e);
    norm(p + "attn_q_norm.weight", hd);
    norm(p + "attn_k_norm.weight", hd);
    norm(p + "ffn_norm.weight", e);
    matrix(p + "ffn_gate.weight", e, ff);
    matrix(p + "ffn_up.weight", e, ff);
    matrix(p + "ffn_down.weight", ff, e);
  }
  w.write(path);
  return w.file_size();
}

}  // namespace pg::gguf
