// `gguf synth`: tensor sets, shapes and metadata keys per architecture, checked against the golden
// models llama.cpp's tools wrote; llama-quantize's type mixes (against the golden quantized files and
// the use_more_bits pattern at real depth); weight statistics; determinism; vocabularies; the CLI.
#include "gguf/synth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/quant.h"
#include "gguf/gguf.h"
#include "gguf/inspect.h"
#include "testutil.h"

namespace pg::gguf {
namespace {

// The golden tiny models' hyperparameters (shared/golden/README.md §4).
SynthConfig tiny(const std::string& arch) {
  SynthConfig c;
  c.arch = arch;
  c.name = "tiny " + arch;
  c.vocab_family = arch == "llama" ? "llama3" : "qwen";
  c.n_layer = 2;
  c.n_embd = 256;
  c.n_ff = 512;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 64;
  c.n_vocab = 512;
  c.n_ctx = 4096;
  c.rope_base = arch == "llama" ? 10000.0 : 1e6;
  c.rms_eps = arch == "llama" ? 1e-5 : 1e-6;
  c.tied = arch != "llama";
  if (arch == "qwen3moe") {
    c.n_expert = 8;
    c.n_expert_used = 2;
    c.n_ff_exp = 32;
  }
  if (arch == "qwen35" || arch == "qwen35moe") {
    // shared/golden/README.md §4.5 and §4.7.
    c = synth_preset(arch == "qwen35" ? "qwen35-0.8b" : "qwen35moe-35b-a3b");
    c.n_layer = 4;
    c.n_embd = 256;
    c.n_ff = 256;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.head_dim = 64;
    c.n_vocab = 512;
    c.n_ctx = 4096;
    c.tied = true;
    auto& h = *c.hybrid;
    h.n_rot = 16;
    h.rope_sections[0] = 3;
    h.rope_sections[1] = 3;
    h.rope_sections[2] = 2;
    h.rope_sections[3] = 0;
    h.ssm_state = 64;
    h.ssm_groups = 2;
    h.ssm_dt_rank = 4;
    if (arch == "qwen35moe") {
      c.n_expert = 8;
      c.n_expert_used = 2;
      c.n_ff_exp = 16;
      h.n_ff_shexp = 32;
    }
  }
  return c;
}

std::unique_ptr<File> synth_file(const test::TempDir& dir, const SynthConfig& cfg, const std::string& type, uint64_t seed = 1,
                                 const std::string& vocab_from = "", int threads = 2, size_t chunk_bytes = size_t{32} << 20) {
  SynthOptions opt;
  opt.chunk_bytes = chunk_bytes;
  opt.cfg = cfg;
  opt.file_type = synth_file_type(type);
  opt.seed = seed;
  opt.vocab_from = vocab_from;
  opt.threads = threads;
  const auto path = (dir.path() / (cfg.arch + "-" + type + "-" + std::to_string(seed) + "-" + std::to_string(threads) + "-" +
                                   std::to_string(chunk_bytes) + ".gguf"))
                        .string();
  const SynthResult r = synth_write(opt, path);
  EXPECT_EQ(r.file_size, std::filesystem::file_size(path));
  EXPECT_EQ(r.tensors.size(), synth_tensors(r.cfg, opt.file_type).size());
  return File::open(path);
}

std::map<std::string, std::string> type_map(const File& f) {
  std::map<std::string, std::string> m;
  for (const auto& t : f.tensors()) m[t.name] = std::string(dtype_name(t.type));
  return m;
}

std::set<std::string> arch_keys(const File& f) {
  std::set<std::string> keys;
  const std::string prefix = f.architecture() + ".";
  for (const auto& [k, v] : f.metadata())
    if (k.rfind(prefix, 0) == 0) keys.insert(k);
  return keys;
}

std::vector<float> dequant(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  dequantize_row(t.type, t.data, out.data(), t.n_elements());
  return out;
}

// For each architecture, an F16 synth of the golden hyperparameters has exactly the golden F16
// model's tensors (names, shapes, types) and architecture keys, and the values the golden keys hold.
TEST(GgufSynth, MatchesGoldenTensorSetsAndKeys) {
  test::TempDir dir;
  const std::map<std::string, std::string> golden = {
      {"llama", "tiny-llama-f16.gguf"},       {"qwen2", "tiny-qwen2-f16.gguf"},   {"qwen3", "tiny-qwen3-f16.gguf"},
      {"qwen3moe", "tiny-qwen3moe-f16.gguf"}, {"qwen35", "tiny-qwen35-f16.gguf"}, {"qwen35moe", "tiny-qwen35moe-f16.gguf"}};
  for (const auto& [arch, file] : golden) {
    SCOPED_TRACE(arch);
    const auto g = File::open(test::shared_path("golden/models/" + file).string());
    const auto s = synth_file(dir, tiny(arch), "F16");
    ASSERT_EQ(s->tensors().size(), g->tensors().size());
    for (const auto& gt : g->tensors()) {
      const auto* st = s->find_tensor(gt.name);
      ASSERT_NE(st, nullptr) << gt.name;
      // The golden generator stored the hybrids' small ssm_alpha / ssm_beta projections in F32;
      // llama.cpp's converter writes them in the file type like any matrix, and so does synth.
      const bool converter_differs =
          gt.name.find("ssm_alpha") != std::string::npos || gt.name.find("ssm_beta") != std::string::npos;
      EXPECT_EQ(st->type, converter_differs ? DType::F16 : gt.type) << gt.name;
      EXPECT_EQ(st->shape_string(), gt.shape_string()) << gt.name;
    }
    std::set<std::string> gk = arch_keys(*g), sk = arch_keys(*s);
    // key/value_length are optional for the dense archs; the converter also writes the hybrids'
    // per-layer recurrent flags, which the golden generator did not.
    for (const char* optional : {".attention.key_length", ".attention.value_length", ".attention.recurrent_layers"}) {
      gk.erase(arch + optional);
      sk.erase(arch + optional);
    }
    EXPECT_EQ(sk, gk);
    for (const auto& k : gk) {
      const Value& gv = g->get(k);
      const Value& sv = s->get(k);
      EXPECT_EQ(sv.type, gv.type) << k;
      if (gv.is_integer()) {
        EXPECT_EQ(sv.as_int(), gv.as_int()) << k;
      }
      if (gv.is_float()) {
        EXPECT_FLOAT_EQ(static_cast<float>(sv.as_float()), static_cast<float>(gv.as_float())) << k;
      }
      if (gv.type == ValueType::ARRAY) {
        EXPECT_EQ(format_value(sv, {}), format_value(gv, {})) << k;
      }
    }
    EXPECT_EQ(s->get_int("general.file_type"), 1);
    EXPECT_EQ(s->get_string("general.architecture"), arch);
    EXPECT_EQ(s->get_int("general.quantization_version"), 2);
    EXPECT_EQ(s->get_string_array("tokenizer.ggml.tokens").size(), 512u);
  }
}

// llama-quantize's per-tensor choices, as recorded in the golden quantized files (2 layers).
TEST(GgufSynth, TypeMixesMatchLlamaQuantize) {
  test::TempDir dir;
  for (const char* arch_c : {"llama", "qwen3"}) {
    const std::string arch = arch_c;
    for (const char* type : {"Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "IQ4_XS"}) {
      SCOPED_TRACE(arch + " " + type);
      const auto g = File::open(test::shared_path("golden/models/tiny-" + arch + "-" + type + ".gguf").string());
      const auto s = synth_file(dir, tiny(arch), type);
      EXPECT_EQ(type_map(*s), type_map(*g));
      EXPECT_EQ(s->get_int("general.file_type"), g->get_int("general.file_type"));
    }
  }
}

// At real depth, Q4_K_M gives Q6_K to attn_v and ffn_down on llama.cpp's use_more_bits layers:
// the first and last eighth and every third layer between. For 32 layers: 0-3, 6, 9, ..., 27, 28-31.
TEST(GgufSynth, Q4KMUsesQ6KOnTheUseMoreBitsLayers) {
  SynthConfig c = synth_preset("llama3-8b");
  const auto plan = synth_tensors(c, synth_file_type("Q4_K_M"));
  std::set<int> v6, d6;
  std::map<std::string, int> counts;
  for (const auto& t : plan) {
    counts[std::string(dtype_name(t.type))]++;
    const int layer = t.name.rfind("blk.", 0) == 0 ? std::atoi(t.name.c_str() + 4) : -1;
    if (t.name.find("attn_v.weight") != std::string::npos && t.type == DType::Q6_K) v6.insert(layer);
    if (t.name.find("ffn_down.weight") != std::string::npos && t.type == DType::Q6_K) d6.insert(layer);
  }
  const std::set<int> want = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  EXPECT_EQ(v6, want);
  EXPECT_EQ(d6, want);
  // 32 attn_v + 32 ffn_down, 16 each Q6_K, + output Q6_K; token_embd Q4_K; norms F32.
  EXPECT_EQ(counts["Q6_K"], 33);
  EXPECT_EQ(counts["F32"], 65);
  EXPECT_EQ(counts["Q4_K"], 32 * 7 - 32 + 1);
  for (const auto& t : plan) {
    if (t.name == "output.weight") {
      EXPECT_EQ(t.type, DType::Q6_K);
    }
    if (t.name == "token_embd.weight") {
      EXPECT_EQ(t.type, DType::Q4_K);
    }
    if (t.name.find("norm") != std::string::npos) {
      EXPECT_EQ(t.type, DType::F32);
    }
  }

  // MoE: the experts' ffn_down follows the layer; the router stays F32; 128 experts get no 8-expert bumps.
  const auto moe = synth_tensors(synth_preset("qwen3-30b-a3b"), synth_file_type("Q4_K_M"));
  for (const auto& t : moe) {
    if (t.name.find("ffn_gate_inp") != std::string::npos) {
      EXPECT_EQ(t.type, DType::F32);
    }
    if (t.name == "blk.0.ffn_down_exps.weight" || t.name == "blk.47.ffn_down_exps.weight") {
      EXPECT_EQ(t.type, DType::Q6_K);
    }
    if (t.name == "blk.7.ffn_down_exps.weight") {
      EXPECT_EQ(t.type, DType::Q4_K);
    }
    if (t.name.find("attn_k.weight") != std::string::npos) {
      EXPECT_EQ(t.type, DType::Q4_K);
    }
  }
  // Plain types are pure: every matmul gets the type.
  for (const auto& t : synth_tensors(synth_preset("qwen3-8b"), synth_file_type("q4_k")))
    EXPECT_EQ(t.type, t.shape.size() >= 2 ? DType::Q4_K : DType::F32) << t.name;
  // A row that is not a multiple of 256 falls back like llama-quantize (Q4_K -> Q5_0, Q6_K -> Q8_0).
  SynthConfig odd = tiny("llama");
  odd.n_embd = 96;
  odd.head_dim = 24;
  for (const auto& t : synth_tensors(odd, synth_file_type("Q4_K_M"))) {
    if (t.name == "blk.0.attn_q.weight") {
      EXPECT_EQ(t.type, DType::Q5_0);
    }
    if (t.name == "output.weight") {
      EXPECT_EQ(t.type, DType::Q8_0);
    }
    if (t.name == "blk.0.ffn_down.weight") {
      EXPECT_EQ(t.type, DType::Q4_K);  // rows of 512
    }
  }
}

// The Qwen3.5 hybrids: presets come from gguf/synth_qwen35.h, data and types from synth. llama-quantize
// counts the Gated DeltaNet layers' fused attn_qkv with the attention layers' attn_v, so Q4_K_M's Q6_K
// pattern runs over both (checked against llama-quantize itself when this was written).
TEST(GgufSynth, HybridPresetsAndTypes) {
  for (const auto& name : qwen35_synth_preset_names()) {
    EXPECT_NO_THROW(synth_preset(name)) << name;
    EXPECT_TRUE(synth_preset(name).is_hybrid());
  }
  const auto plan = synth_tensors(synth_preset("qwen35-9b"), synth_file_type("Q4_K_M"));
  std::vector<int> six;  // layers whose attn_v / attn_qkv is Q6_K
  for (const auto& t : plan) {
    const bool v = t.name.find("attn_v.weight") != std::string::npos || t.name.find("attn_qkv.weight") != std::string::npos;
    if (v && t.type == DType::Q6_K) six.push_back(std::atoi(t.name.c_str() + 4));
    const bool ssm_a = t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".ssm_a") == 0;
    if (t.name.find("ssm_conv1d") != std::string::npos || ssm_a || t.name.find("norm") != std::string::npos) {
      EXPECT_EQ(t.type, DType::F32) << t.name;
    }
    if (ssm_a) {
      EXPECT_LT(t.mean + 6 * t.sigma, 0.0f);
    }
  }
  const std::vector<int> want = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};  // use_more_bits of 32
  EXPECT_EQ(six, want);

  test::TempDir dir;
  const auto f = synth_file(dir, tiny("qwen35moe"), "Q4_K_M");
  for (const auto& t : f->tensors()) {
    const auto v = dequant(t);
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << t.name;
    if (t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".ssm_a") == 0) {
      for (float x : v) EXPECT_LT(x, 0.0f) << t.name;
    }
  }
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate_inp_shexp.weight")->type, DType::F32);
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "qwen35");
}

TEST(GgufSynth, PresetsHaveTheirPublishedSizes) {
  const std::map<std::string, double> billions = {{"llama3-8b", 8.03},      {"qwen3-8b", 8.19},    {"qwen3-32b", 32.76},
                                                  {"qwen3-30b-a3b", 30.53}, {"qwen3-0.6b", 0.596}, {"qwen3-14b", 14.77}};
  for (const auto& [name, want] : billions) {
    uint64_t params = 0;
    for (const auto& t : synth_tensors(synth_preset(name), synth_file_type("F16"))) {
      uint64_t n = 1;
      for (auto d : t.shape) n *= static_cast<uint64_t>(d);
      params += n;
    }
    EXPECT_NEAR(static_cast<double>(params) / 1e9, want, want * 0.01) << name;
  }
  EXPECT_EQ(synth_preset("qwen3-8b").n_vocab, 151936);
  EXPECT_EQ(synth_preset("llama3-8b").n_vocab, 128256);
  EXPECT_THROW(synth_preset("gpt-5"), Error);
  EXPECT_THROW(synth_file_type("Q9_K"), Error);
  EXPECT_EQ(synth_file_type("q4_k_m").ftype, 15u);
  EXPECT_EQ(synth_file_type("BF16").ftype, 32u);
}

TEST(GgufSynth, WeightsAreRandomWithTheRightScale) {
  test::TempDir dir;
  SynthConfig c = tiny("qwen3");
  c.n_embd = 512;
  c.n_ff = 2048;  // ffn_gate {512, 2048}: 4096 tiles, drawn in full; token_embd uses the pool
  c.n_vocab = 8192;
  for (const char* type : {"F16", "BF16", "Q8_0", "Q4_K_M", "F32"}) {
    SCOPED_TRACE(type);
    const auto f = synth_file(dir, c, type);
    for (const auto& t : f->tensors()) {
      const auto v = dequant(t);
      double sum = 0, sq = 0;
      size_t zeros = 0;
      for (float x : v) {
        ASSERT_TRUE(std::isfinite(x)) << t.name;
        sum += x;
        sq += double(x) * x;
        zeros += x == 0.0f;
      }
      const double mean = sum / v.size(), sd = std::sqrt(sq / v.size() - mean * mean);
      if (t.name.find("norm") != std::string::npos) {
        EXPECT_NEAR(mean, 1.0, 0.02) << t.name;
        EXPECT_GT(sd, 0.02) << t.name;
        EXPECT_LT(sd, 0.1) << t.name;
      } else {
        const double want = 1.0 / std::sqrt(double(t.ne[0]));
        EXPECT_NEAR(sd, want, want * 0.1) << t.name;
        EXPECT_NEAR(mean, 0.0, want * 0.05) << t.name;
        EXPECT_LT(zeros, v.size() / 5) << t.name;
      }
    }
  }
}

TEST(GgufSynth, DeterministicForASeedAndAnyThreadCount) {
  test::TempDir dir;
  SynthConfig c = tiny("qwen3moe");
  c.n_vocab = 70000;  // token_embd {256, 70000}: pool path, several chunks
  const auto a = synth_file(dir, c, "Q4_K_M", 7, "", 1);
  const auto b = synth_file(dir, c, "Q4_K_M", 7, "", 3);
  // Small chunks: many double-buffer rounds, buffers reused across tensors of different tile sizes.
  const auto e = synth_file(dir, c, "Q4_K_M", 7, "", 2, 5000);
  EXPECT_EQ(test::read_bytes(a->path()), test::read_bytes(e->path()));
  const auto d = synth_file(dir, c, "Q4_K_M", 8, "", 2);
  EXPECT_EQ(test::read_bytes(a->path()), test::read_bytes(b->path()));
  const auto* ta = a->find_tensor("token_embd.weight");
  const auto* td = d->find_tensor("token_embd.weight");
  EXPECT_NE(std::memcmp(ta->data, td->data, ta->nbytes), 0);
  // Different tensors of one file differ.
  EXPECT_NE(std::memcmp(a->find_tensor("blk.0.attn_q.weight")->data, a->find_tensor("blk.1.attn_q.weight")->data,
                        a->find_tensor("blk.0.attn_q.weight")->nbytes),
            0);
}

TEST(GgufSynth, SyntheticVocabularyIsAValidBpe) {
  for (const std::string family : {"qwen", "llama3"}) {
    SCOPED_TRACE(family);
    const int64_t n = family == "qwen" ? 151936 : 128256;
    Writer w;
    synth_bpe_vocab(w, family, n);
    const auto f = File::from_memory(w.write_to_memory());
    const auto tokens = f->get_string_array("tokenizer.ggml.tokens");
    const auto types = f->get_int_array("tokenizer.ggml.token_type");
    const auto merges = f->get_string_array("tokenizer.ggml.merges");
    ASSERT_EQ(tokens.size(), static_cast<size_t>(n));
    ASSERT_EQ(types.size(), tokens.size());
    std::set<std::string> seen(tokens.begin(), tokens.end());
    EXPECT_EQ(seen.size(), tokens.size()) << "duplicate tokens";
    const int64_t first_special = family == "qwen" ? 151643 : 128000;
    EXPECT_EQ(merges.size(), static_cast<size_t>(first_special - 256));
    for (const auto& m : merges) {
      const auto sp = m.find(' ');
      ASSERT_NE(sp, std::string::npos);
      ASSERT_TRUE(seen.count(m.substr(0, sp)) && seen.count(m.substr(sp + 1))) << m;
      ASSERT_TRUE(seen.count(m.substr(0, sp) + m.substr(sp + 1))) << m;
    }
    EXPECT_EQ(tokens[0], "!");
    EXPECT_EQ(tokens[255], "\xc5\x83");  // byte 0xad -> U+0143
    for (int64_t i = 0; i < first_special; ++i) ASSERT_EQ(types[i], 1);
    if (family == "qwen") {
      EXPECT_EQ(tokens[151643], "<|endoftext|>");
      EXPECT_EQ(tokens[151645], "<|im_end|>");
      EXPECT_EQ(tokens[151667], "<think>");
      EXPECT_EQ(types[151667], 4);
      EXPECT_EQ(tokens[151935], "[PAD151935]");
      EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 151645);
      EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "qwen2");
      EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token"));
    } else {
      EXPECT_EQ(tokens[128000], "<|begin_of_text|>");
      EXPECT_EQ(tokens[128009], "<|eot_id|>");
      EXPECT_EQ(tokens[128255], "<|reserved_special_token_250|>");
      EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 128000);
      EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "llama-bpe");
    }
  }
  Writer small;
  EXPECT_THROW(synth_bpe_vocab(small, "qwen", 100), Error);
}

TEST(GgufSynth, VocabFromCopiesEveryTokenizerKey) {
  test::TempDir dir;
  const auto vocab_path = test::shared_path("testdata/tokenizer/ggml-vocab-qwen3.gguf").string();
  const auto vocab = File::open(vocab_path);
  SynthConfig c = tiny("qwen3");
  c.n_vocab = 1000;  // replaced by the vocabulary's size
  const auto f = synth_file(dir, c, "Q8_0", 1, vocab_path);
  size_t copied = 0;
  for (const auto& [k, v] : vocab->metadata()) {
    if (k.rfind("tokenizer.", 0) != 0) continue;
    ++copied;
    const Value* got = f->find(k);
    ASSERT_NE(got, nullptr) << k;
    EXPECT_EQ(format_value(*got, {}), format_value(v, {})) << k;
    if (v.type == ValueType::ARRAY) {
      EXPECT_EQ(got->as_array().items.size(), v.as_array().items.size());
    }
  }
  EXPECT_EQ(copied, 10u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"), vocab->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(f->find_tensor("token_embd.weight")->ne[1], 151936);
  EXPECT_EQ(f->get_string("tokenizer.chat_template"), vocab->get_string("tokenizer.chat_template"));
}

TEST(GgufSynthCli, WritesAModelAndReportsBadFlags) {
  test::TempDir dir;
  const auto exe = test::peregrine_exe().string();
  const auto out = (dir.path() / "m.gguf").string();
  const auto r = test::run_command({exe,   "gguf",      "synth",  "--arch",         "qwen3moe", "--layers",     "2",   "--dim",
                                    "256", "--heads",   "4",      "--kv-heads",     "2",        "--head-dim",   "64",  "--vocab",
                                    "600", "--experts", "4",      "--experts-used", "2",        "--expert-ffn", "256", "--ffn",
                                    "512", "--type",    "Q4_K_M", "--seed",         "3",        "-o",           out},
                                   "", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + out), std::string::npos) << r.out;
  const auto f = File::open(out);
  EXPECT_EQ(f->architecture(), "qwen3moe");
  EXPECT_EQ(f->get_int("qwen3moe.expert_count"), 4);
  EXPECT_EQ(f->find_tensor("blk.1.ffn_down_exps.weight")->type, DType::Q6_K);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate_exps.weight")->shape_string(), "{256, 256, 4}");

  const auto preset = test::run_command(
      {exe, "gguf", "synth", "--preset", "qwen3-0.6b", "--layers", "1", "--vocab", "512", "--type", "q8_0", "-o", out}, "", 120);
  ASSERT_EQ(preset.exit_code, 0) << preset.err;
  const auto p = File::open(out);
  EXPECT_EQ(p->get_int("qwen3.embedding_length"), 1024);
  EXPECT_EQ(p->get_int("qwen3.block_count"), 1);
  EXPECT_EQ(p->find_tensor("output.weight"), nullptr);  // qwen3-0.6b is tied

  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--preset", "nope", "--type", "Q4_K_M", "-o", out},
        {"--preset", "qwen3-8b", "--type", "Q9", "-o", out},
        {"--preset", "qwen3-8b", "--type", "Q4_K_M"},
        {"--arch", "qwen3", "--layers", "2", "--type", "F16", "-o", out},
        {"--preset", "qwen3-8b", "--heads", "5", "--type", "F16", "-o", out},
        {"--preset", "qwen3-8b", "--type", "F16", "--vocab-from", "/nonexistent.gguf", "-o", out}}) {
    std::vector<std::string> argv = {exe, "gguf", "synth"};
    argv.insert(argv.end(), bad.begin(), bad.end());
    const auto e = test::run_command(argv, "", 60);
    EXPECT_EQ(e.exit_code, 1) << bad[1];
    EXPECT_EQ(e.err.rfind("error: ", 0), 0u) << e.err;
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
  }
}

}  // namespace
}  // namespace pg::gguf
