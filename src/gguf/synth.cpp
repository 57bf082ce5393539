// Random-weight model writer. How the data is made fast:
//
// * Every matmul weight is a sequence of "tiles" of 256 elements (or of one block when a tensor is not
//   a multiple of 256). A tensor of at most kPoolTiles tiles is drawn and quantized in full. A larger
//   tensor is assembled from a pool of kPoolTiles distinct tiles drawn from N(0, sigma²) and quantized
//   once: tile i of the tensor is pool tile hash(tensor, i) mod kPoolTiles. Pools are shared by tensors
//   with the same type and sigma, so a 32B model quantizes a few dozen MB of floats instead of 32G, and
//   writing is a parallel gather of small memcpys plus the disk write. Row statistics (mean 0, standard
//   deviation sigma, the type's rounding) are those of fully random data; only the tile-level
//   repetition differs, which does not matter for shapes, speed or numerical range.
// * Tensor data is streamed through Writer::add_tensor_stream in chunks of ~32 MB, filled by the
//   thread pool while the previous chunk is being written, so memory stays small for any model size.
// * Norm weights, biases and the MoE router are small and always drawn in full, in F32.
// * Random numbers come from splitmix64 streams keyed by (seed, tensor name, segment), so the output
//   depends on the seed only, not on the thread count.
#include "gguf/synth.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <tuple>

#include "core/error.h"
#include "core/quant.h"
#include "core/threadpool.h"

namespace pg::gguf {
namespace {

constexpr int64_t kTileElems = 256;
constexpr int64_t kPoolTiles = 4096;
constexpr int64_t kSegment = 65536;  // elements per independent random stream

// ---- random numbers ------------------------------------------------------------------------------

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_str(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return mix64(h);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() { return mix64(s_++); }
  // Uniform in (0, 1].
  double uniform() { return (static_cast<double>(next() >> 11) + 1.0) * (1.0 / 9007199254740992.0); }
  // Box-Muller; the second value of each pair is kept for the next call.
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double a = 6.283185307179586 * uniform();
    spare_ = r * std::sin(a);
    have_spare_ = true;
    return r * std::cos(a);
  }

 private:
  uint64_t s_;
  double spare_ = 0;
  bool have_spare_ = false;
};

// n values of mean + sigma·N(0,1), in independent segments so threads can share the work.
void fill_normal(ThreadPool& pool, float* out, int64_t n, uint64_t seed, float mean, float sigma) {
  const int64_t segments = (n + kSegment - 1) / kSegment;
  pool.parallel_for(segments, 1, [&](int64_t s0, int64_t s1, int) {
    for (int64_t s = s0; s < s1; ++s) {
      Rng rng(mix64(seed ^ mix64(static_cast<uint64_t>(s))));
      const int64_t end = std::min(n, (s + 1) * kSegment);
      for (int64_t i = s * kSegment; i < end; ++i) out[i] = mean + sigma * static_cast<float>(rng.normal());
    }
  });
}

// Converts n floats (a multiple of tile_elems) to type t with llama-quantize's rounding, tiles in parallel.
void encode(ThreadPool& pool, DType t, const float* src, uint8_t* dst, int64_t n, int64_t tile_elems) {
  const size_t tile_bytes = row_bytes(t, tile_elems);
  pool.parallel_for(n / tile_elems, 16, [&](int64_t a, int64_t b, int) {
    quantize_weights(t, src + a * tile_elems, dst + static_cast<size_t>(a) * tile_bytes, (b - a) * tile_elems);
  });
}

// ---- file types and the llama-quantize type rules -------------------------------------------------

struct FtypeEntry {
  const char* name;
  uint32_t ftype;
  DType base;
  bool mixture;
};
// LLAMA_FTYPE_* ids from llama.h. Plain K-type names map to the mixture's id with the rules off, as
// `llama-quantize --pure` writes them.
const FtypeEntry kFtypes[] = {
    {"F32", 0, DType::F32, true},        {"F16", 1, DType::F16, true},      {"BF16", 32, DType::BF16, true},
    {"Q4_0", 2, DType::Q4_0, true},      {"Q4_1", 3, DType::Q4_1, true},    {"Q5_0", 8, DType::Q5_0, true},
    {"Q5_1", 9, DType::Q5_1, true},      {"Q8_0", 7, DType::Q8_0, true},    {"Q2_K", 10, DType::Q2_K, true},
    {"Q3_K_S", 11, DType::Q3_K, true},   {"Q3_K_M", 12, DType::Q3_K, true}, {"Q3_K_L", 13, DType::Q3_K, true},
    {"Q4_K_S", 14, DType::Q4_K, true},   {"Q4_K_M", 15, DType::Q4_K, true}, {"Q5_K_S", 16, DType::Q5_K, true},
    {"Q5_K_M", 17, DType::Q5_K, true},   {"Q6_K", 18, DType::Q6_K, true},   {"Q3_K", 12, DType::Q3_K, false},
    {"Q4_K", 15, DType::Q4_K, false},    {"Q5_K", 17, DType::Q5_K, false},  {"IQ4_NL", 25, DType::IQ4_NL, true},
    {"IQ4_XS", 30, DType::IQ4_XS, true},
};

bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// llama-quantize's fallback when a row is not a multiple of the chosen type's block.
DType fallback_type(DType t, int64_t ne0) {
  if (ne0 % traits(t).block_size == 0) return t;
  DType f = t;
  switch (t) {
    case DType::Q2_K:
    case DType::Q3_K:
      f = DType::Q4_0;
      break;
    case DType::Q4_K:
      f = DType::Q5_0;
      break;
    case DType::Q5_K:
      f = DType::Q5_1;
      break;
    case DType::Q6_K:
      f = DType::Q8_0;
      break;
    case DType::IQ4_XS:
      f = DType::IQ4_NL;
      break;
    default:
      break;
  }
  return ne0 % traits(f).block_size == 0 ? f : DType::F16;
}

int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::atoi(name.c_str() + 4);
}

// Applies llama.cpp's llama_tensor_get_type_impl (src/llama-quant.cpp) for the file types offered here,
// in file order (the attn_v / ffn_down counters depend on it). Covered: the output / tied-embedding
// rule (Q6_K unless the row is not a multiple of 256: Q8_0; Q8_0 files keep Q8_0), attn_v
// (Q4_K_M/Q5_K_M: Q6_K on the use_more_bits layers; Q4_K_S: Q5_K on the first 4; Q3_K_M/L: Q5_K/Q4_K;
// Q2_K: Q3_K or Q4_K with GQA >= 4; the 70B llama bump; 8-expert models Q8_0), attn_k (8 experts:
// Q8_0), ffn_down (Q4_K_M/Q5_K_M: Q6_K on use_more_bits layers; Q4_K_S: Q5_K on the first 1/8;
// Q3_K_M: Q5_K/Q4_K; Q3_K_L: Q5_K; Q2_K: Q3_K; IQ4_*: Q5_K on the first 1/8), attn_output (8 experts:
// Q5_K for the K mixtures; Q2_K: Q3_K; Q3_K_M: Q4_K; Q3_K_L: Q5_K), then the row-length fallback.
// Not covered: imatrix-dependent choices and the IQ1/IQ2/IQ3 mixtures (not offered).
class TypeChooser {
 public:
  TypeChooser(const SynthConfig& cfg, const SynthFileType& ft, int64_t n_attn_v) : cfg_(cfg), ft_(ft), n_attn_v_(n_attn_v) {}

  DType choose(const std::string& name, const std::vector<int64_t>& shape) {
    const bool quantizable = shape.size() >= 2 && ends_with(name, "weight") && name.find("_norm.weight") == std::string::npos &&
                             name.find("ffn_gate_inp.weight") == std::string::npos;
    if (!quantizable) return DType::F32;
    const DType base = ft_.base;
    if (base == DType::F32 || base == DType::F16 || base == DType::BF16) return base;
    DType t = base;
    if (ft_.mixture) t = mixture_type(name, shape, base);
    return fallback_type(t, shape[0]);
  }

 private:
  DType mixture_type(const std::string& name, const std::vector<int64_t>& shape, DType base) {
    const std::string& f = ft_.name;
    const bool eight_experts = cfg_.n_expert == 8;
    const int64_t n_layer = cfg_.n_layer;
    const bool is_output = name == "output.weight" || (cfg_.tied && name == "token_embd.weight");
    if (is_output) {
      if (shape[0] % 256 != 0) return DType::Q8_0;
      return base == DType::Q8_0 ? DType::Q8_0 : DType::Q6_K;
    }
    if (name == "token_embd.weight") return base;
    DType t = base;
    if (name.find("attn_v.weight") != std::string::npos || name.find("attn_qkv.weight") != std::string::npos) {
      const int64_t i = i_attn_v_++;
      const int64_t gqa = cfg_.n_head_kv ? cfg_.n_head / cfg_.n_head_kv : 1;
      if (f == "Q2_K")
        t = gqa >= 4 ? DType::Q4_K : DType::Q3_K;
      else if (f == "Q3_K_M")
        t = i < 2 ? DType::Q5_K : DType::Q4_K;
      else if (f == "Q3_K_L")
        t = DType::Q5_K;
      else if ((f == "IQ4_NL" || f == "IQ4_XS") && gqa >= 4)
        t = DType::Q5_K;
      else if ((f == "Q4_K_M" || f == "Q5_K_M") && use_more_bits(i, n_attn_v_))
        t = DType::Q6_K;
      else if (f == "Q4_K_S" && i < 4)
        t = DType::Q5_K;
      // llama.cpp's LLM_TYPE_70B: an 80-layer GQA llama.
      if (cfg_.arch == "llama" && n_layer == 80 && cfg_.n_head != cfg_.n_head_kv && (t == DType::Q3_K || t == DType::Q4_K))
        t = DType::Q5_K;
      if (eight_experts) t = DType::Q8_0;
      return t;
    }
    if (name.find("attn_k.weight") != std::string::npos) return eight_experts ? DType::Q8_0 : t;
    if (name.find("ffn_down") != std::string::npos) {
      // Dense models count ffn_down tensors; MoE models read the layer from the name (llama.cpp's
      // layer_info), so ffn_down_exps and ffn_down_shexp of one layer share its index.
      const int64_t i = cfg_.n_expert > 1 ? layer_of(name) : i_ffn_down_++;
      if (f == "Q2_K")
        t = DType::Q3_K;
      else if (f == "Q3_K_M")
        t = i < n_layer / 16 ? DType::Q5_K : DType::Q4_K;
      else if (f == "Q3_K_L")
        t = DType::Q5_K;
      else if (f == "Q4_K_M" && use_more_bits(i, n_layer))
        t = DType::Q6_K;
      else if ((f == "IQ4_NL" || f == "IQ4_XS") && i < n_layer / 8)
        t = DType::Q5_K;
      else if (f == "Q5_K_M" && use_more_bits(i, n_layer))
        t = DType::Q6_K;
      else if (f == "Q4_K_S" && i < n_layer / 8)
        t = DType::Q5_K;
      return t;
    }
    if (name.find("attn_output.weight") != std::string::npos) {
      if (eight_experts) {
        if (f == "Q2_K" || f == "Q3_K_S" || f == "Q3_K_M" || f == "IQ4_NL" || f == "Q4_K_S" || f == "Q4_K_M" || f == "IQ4_XS")
          t = DType::Q5_K;
      } else if (f == "Q2_K") {
        t = DType::Q3_K;
      } else if (f == "Q3_K_M") {
        t = DType::Q4_K;
      } else if (f == "Q3_K_L") {
        t = DType::Q5_K;
      }
      return t;
    }
    return t;
  }

  const SynthConfig& cfg_;
  const SynthFileType& ft_;
  int64_t n_attn_v_;
  int64_t i_attn_v_ = 0;
  int64_t i_ffn_down_ = 0;
};

// ---- vocabulary ---------------------------------------------------------------------------------

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    s.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return s;
}

// GPT-2's byte-to-unicode table in its id order: printable bytes map to themselves, the others to
// U+0100 onwards. Returns (byte, text) pairs for ids 0..255.
std::vector<std::pair<int, std::string>> byte_tokens() {
  std::vector<int> bs;
  for (int b = 33; b <= 126; ++b) bs.push_back(b);
  for (int b = 161; b <= 172; ++b) bs.push_back(b);
  for (int b = 174; b <= 255; ++b) bs.push_back(b);
  std::vector<std::pair<int, std::string>> out;
  for (int b : bs) out.emplace_back(b, utf8(static_cast<uint32_t>(b)));
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) out.emplace_back(b, utf8(256 + n++));
  return out;
}

struct SpecialToken {
  std::string text;
  int32_t type;  // 3 control, 4 user-defined, 5 unused
};

// The family's special tokens for n ids, at the end of the vocabulary, named as in the real
// tokenizers (Qwen3's added tokens; Llama 3's reserved range).
std::vector<SpecialToken> special_tokens(const std::string& family, int64_t n, int64_t first_id) {
  std::vector<SpecialToken> out;
  if (family == "qwen") {
    const char* named[] = {"<|endoftext|>",  "<|im_start|>",   "<|im_end|>",      "<|object_ref_start|>", "<|object_ref_end|>",
                           "<|box_start|>",  "<|box_end|>",    "<|quad_start|>",  "<|quad_end|>",         "<|vision_start|>",
                           "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",   "<|video_pad|>",        "<tool_call>",
                           "</tool_call>",   "<|fim_prefix|>", "<|fim_middle|>",  "<|fim_suffix|>",       "<|fim_pad|>",
                           "<|repo_name|>",  "<|file_sep|>",   "<tool_response>", "</tool_response>",     "<think>",
                           "</think>"};
    for (int64_t i = 0; i < n; ++i) {
      if (i < static_cast<int64_t>(std::size(named))) {
        const std::string t = named[i];
        out.push_back({t, t.rfind("<|", 0) == 0 ? 3 : 4});
      } else {
        out.push_back({"[PAD" + std::to_string(first_id + i) + "]", 5});
      }
    }
  } else {
    int reserved = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::string t;
      switch (i) {
        case 0:
          t = "<|begin_of_text|>";
          break;
        case 1:
          t = "<|end_of_text|>";
          break;
        case 6:
          t = "<|start_header_id|>";
          break;
        case 7:
          t = "<|end_header_id|>";
          break;
        case 9:
          t = "<|eot_id|>";
          break;
        default:
          t = "<|reserved_special_token_" + std::to_string(reserved++) + "|>";
      }
      out.push_back({t, 3});
    }
  }
  return out;
}

// Characters in the order merges use them: space (Ġ), lowercase, uppercase, digits, then the rest, so
// that the first merges are the plausible ones.
std::vector<int> merge_char_order(const std::vector<std::pair<int, std::string>>& bytes) {
  auto rank = [](int b) {
    if (b == ' ') return 0;
    if (b >= 'a' && b <= 'z') return 1;
    if (b >= 'A' && b <= 'Z') return 2;
    if (b >= '0' && b <= '9') return 3;
    if (b == '\n' || b == '.' || b == ',') return 4;
    if (b < 128) return 5;
    return 6;
  };
  std::vector<int> ids(bytes.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return rank(bytes[a].first) < rank(bytes[b].first); });
  return ids;
}

std::string size_label(uint64_t params) {
  const double p = static_cast<double>(params);
  char buf[32];
  if (p >= 1e9)
    std::snprintf(buf, sizeof buf, "%.*fB", p >= 1e10 ? 0 : 1, p / 1e9);
  else if (p >= 1e6)
    std::snprintf(buf, sizeof buf, "%.*fM", p >= 1e7 ? 0 : 1, p / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1fK", p / 1e3);
  return buf;
}

// ---- tensor data ---------------------------------------------------------------------------------

struct PoolKey {
  DType type;
  uint32_t mean_bits, sigma_bits;
  int64_t tile_elems;
  bool operator<(const PoolKey& o) const {
    return std::tie(type, mean_bits, sigma_bits, tile_elems) < std::tie(o.type, o.mean_bits, o.sigma_bits, o.tile_elems);
  }
};

class DataMaker {
 public:
  DataMaker(int threads, uint64_t seed, size_t chunk_bytes) : pool_(threads), seed_(seed), chunk_bytes_(chunk_bytes) {}

  // Streams one tensor's bytes to emit.
  void produce(const SynthTensor& t, const Writer::Emit& emit) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const uint64_t tseed = mix64(seed_ ^ hash_str(t.name));
    const int64_t block = traits(t.type).block_size;
    const int64_t tile = n % kTileElems == 0 ? kTileElems : block;
    const int64_t n_tiles = n / tile;
    if (n_tiles <= kPoolTiles) {
      // Small: draw every value.
      std::vector<float> values(static_cast<size_t>(n));  // [n]
      fill_normal(pool_, values.data(), n, tseed, t.mean, t.sigma);
      std::vector<uint8_t> bytes(row_bytes(t.type, n));  // [n / block][type_size]
      encode(pool_, t.type, values.data(), bytes.data(), n, tile);
      emit(bytes.data(), bytes.size());
      return;
    }
    const auto& pool = tile_pool(t.type, t.mean, t.sigma, tile);
    const size_t tile_bytes = row_bytes(t.type, tile);
    const int64_t chunk_tiles = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes_ / tile_bytes));
    const int64_t n_chunks = (n_tiles + chunk_tiles - 1) / chunk_tiles;
    auto& buf = buf_;
    auto fill = [&](int64_t c) {
      const int64_t first = c * chunk_tiles;
      const int64_t count = std::min(chunk_tiles, n_tiles - first);
      auto& b = buf[c % 2];
      // Never shrinks: the buffers are reused by every tensor, so their pages are faulted in once.
      if (b.size() < static_cast<size_t>(count) * tile_bytes) b.resize(static_cast<size_t>(count) * tile_bytes);
      pool_.parallel_for(count, 4096, [&](int64_t a, int64_t e, int) {
        for (int64_t k = a; k < e; ++k) {
          const uint64_t pick = mix64(tseed ^ static_cast<uint64_t>(first + k)) % kPoolTiles;
          std::memcpy(b.data() + static_cast<size_t>(k) * tile_bytes, pool.data() + pick * tile_bytes, tile_bytes);
        }
      });
    };
    fill(0);
    for (int64_t c = 0; c < n_chunks; ++c) {
      // Fill the next chunk on the thread pool while this one goes to disk. The future's destructor
      // waits, so an exception from emit cannot leave the fill running on a freed buffer.
      std::future<void> next;
      if (c + 1 < n_chunks) next = std::async(std::launch::async, fill, c + 1);
      const size_t bytes = static_cast<size_t>(std::min(chunk_tiles, n_tiles - c * chunk_tiles)) * tile_bytes;
      emit(buf[c % 2].data(), bytes);
      if (next.valid()) next.get();
    }
  }

 private:
  const std::vector<uint8_t>& tile_pool(DType type, float mean, float sigma, int64_t tile) {
    uint32_t mean_bits, sigma_bits;
    std::memcpy(&mean_bits, &mean, 4);
    std::memcpy(&sigma_bits, &sigma, 4);
    const PoolKey key{type, mean_bits, sigma_bits, tile};
    auto it = pools_.find(key);
    if (it != pools_.end()) return it->second;
    const int64_t n = kPoolTiles * tile;
    std::vector<float> values(static_cast<size_t>(n));  // [kPoolTiles][tile]
    const uint64_t pseed = mix64(seed_ ^ 0x5eed ^ (static_cast<uint64_t>(type) << 40) ^ sigma_bits ^ mix64(tile) ^
                                 (static_cast<uint64_t>(mean_bits) << 20));
    fill_normal(pool_, values.data(), n, pseed, mean, sigma);
    std::vector<uint8_t> bytes(row_bytes(type, n));  // [kPoolTiles][tile_bytes]
    encode(pool_, type, values.data(), bytes.data(), n, tile);
    return pools_.emplace(key, std::move(bytes)).first->second;
  }

  ThreadPool pool_;
  uint64_t seed_;
  size_t chunk_bytes_;
  std::vector<uint8_t> buf_[2];  // double buffer for streamed tensors, up to chunk_bytes_ each
  std::map<PoolKey, std::vector<uint8_t>> pools_;
};

}  // namespace

// ---- presets -------------------------------------------------------------------------------------

namespace {
struct Preset {
  const char* name;
  SynthConfig cfg;
};

SynthConfig qwen3(const char* name, const char* label, int64_t layers, int64_t embd, int64_t ff, int64_t heads, int64_t kv,
                  bool tied) {
  SynthConfig c;
  c.arch = "qwen3";
  c.name = name;
  c.size_label = label;
  c.vocab_family = "qwen";
  c.n_layer = layers;
  c.n_embd = embd;
  c.n_ff = ff;
  c.n_head = heads;
  c.n_head_kv = kv;
  c.head_dim = 128;
  c.n_vocab = 151936;
  c.n_ctx = 40960;
  c.rope_base = 1000000.0;
  c.rms_eps = 1e-6;
  c.tied = tied;
  return c;
}

// Published hyperparameters (the models' Hugging Face config.json).
std::vector<Preset> presets() {
  std::vector<Preset> p;
  {
    SynthConfig c;
    c.arch = "llama";
    c.name = "Meta Llama 3 8B";
    c.size_label = "8B";
    c.vocab_family = "llama3";
    c.n_layer = 32;
    c.n_embd = 4096;
    c.n_ff = 14336;
    c.n_head = 32;
    c.n_head_kv = 8;
    c.n_vocab = 128256;
    c.n_ctx = 8192;
    c.rope_base = 500000.0;
    c.rms_eps = 1e-5;
    p.push_back({"llama3-8b", c});
  }
  p.push_back({"qwen3-0.6b", qwen3("Qwen3 0.6B", "0.6B", 28, 1024, 3072, 16, 8, true)});
  p.push_back({"qwen3-1.7b", qwen3("Qwen3 1.7B", "1.7B", 28, 2048, 6144, 16, 8, true)});
  p.push_back({"qwen3-4b", qwen3("Qwen3 4B", "4B", 36, 2560, 9728, 32, 8, true)});
  p.push_back({"qwen3-8b", qwen3("Qwen3 8B", "8B", 36, 4096, 12288, 32, 8, false)});
  p.push_back({"qwen3-14b", qwen3("Qwen3 14B", "14B", 40, 5120, 17408, 40, 8, false)});
  p.push_back({"qwen3-32b", qwen3("Qwen3 32B", "32B", 64, 5120, 25600, 64, 8, false)});
  {
    SynthConfig c = qwen3("Qwen3 30B A3B", "30B-A3B", 48, 2048, 6144, 32, 4, false);
    c.arch = "qwen3moe";
    c.n_expert = 128;
    c.n_expert_used = 8;
    c.n_ff_exp = 768;
    p.push_back({"qwen3-30b-a3b", c});
  }
  {
    SynthConfig c;
    c.arch = "qwen2";
    c.name = "Qwen2.5 7B";
    c.size_label = "7B";
    c.vocab_family = "qwen";
    c.n_layer = 28;
    c.n_embd = 3584;
    c.n_ff = 18944;
    c.n_head = 28;
    c.n_head_kv = 4;
    c.n_vocab = 152064;
    c.n_ctx = 32768;
    c.rope_base = 1000000.0;
    c.rms_eps = 1e-6;
    p.push_back({"qwen2.5-7b", c});
  }
  return p;
}

// A Qwen3.5 hybrid preset in SynthConfig form: the common fields copied out, the rest kept in hybrid.
SynthConfig from_hybrid(const Qwen35SynthConfig& h) {
  SynthConfig c;
  c.arch = h.arch;
  c.name = h.name;
  c.size_label = h.size_label;
  c.vocab_family = "qwen35";
  c.n_layer = h.n_layer;
  c.n_embd = h.n_embd;
  c.n_ff = h.n_ff;
  c.n_head = h.n_head;
  c.n_head_kv = h.n_head_kv;
  c.head_dim = h.head_dim;
  c.n_vocab = h.n_vocab;
  c.n_ctx = h.n_ctx;
  c.n_expert = h.n_expert;
  c.n_expert_used = h.n_expert_used;
  c.n_ff_exp = h.n_ff_exp;
  c.rope_base = h.rope_base;
  c.rms_eps = h.rms_eps;
  c.tied = h.tied;
  c.hybrid = h;
  return c;
}
}  // namespace

Qwen35SynthConfig hybrid_config(const SynthConfig& c) {
  if (!c.is_hybrid()) throw Error("synth: " + c.arch + " is not a Qwen3.5 hybrid");
  Qwen35SynthConfig h;
  if (c.hybrid) {
    h = *c.hybrid;
  } else {
    // --arch qwen35 / qwen35moe without a preset: the published models' hybrid layout.
    h = *qwen35_synth_preset(c.arch == "qwen35" ? "qwen35-9b" : "qwen35moe-35b-a3b");
  }
  h.arch = c.arch;
  h.name = c.name;
  h.size_label = c.size_label;
  h.n_layer = c.n_layer;
  h.n_embd = c.n_embd;
  h.n_ff = c.n_ff;
  h.n_head = c.n_head;
  h.n_head_kv = c.n_head_kv;
  h.head_dim = c.head_dim_or_default();
  h.n_vocab = c.n_vocab;
  h.n_ctx = c.n_ctx;
  h.n_expert = c.n_expert;
  h.n_expert_used = c.n_expert_used;
  h.n_ff_exp = c.n_ff_exp;
  h.rope_base = c.rope_base;
  h.rms_eps = c.rms_eps;
  h.tied = c.tied;
  return h;
}

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.push_back(p.name);
  for (const auto& n : qwen35_synth_preset_names()) out.push_back(n);
  return out;
}

SynthConfig synth_preset(const std::string& name) {
  for (const auto& p : presets())
    if (name == p.name) return p.cfg;
  if (auto h = qwen35_synth_preset(name)) return from_hybrid(*h);
  std::string list;
  for (const auto& n : synth_preset_names()) list += (list.empty() ? "" : ", ") + n;
  throw Error("unknown preset '" + name + "' (known: " + list + ")");
}

void validate_synth_config(const SynthConfig& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("synth: " + what);
  };
  need(c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "qwen3moe" || c.is_hybrid(),
       "unknown architecture '" + c.arch + "' (known: llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe)");
  // Upper bounds far above any real model keep shapes, element counts and the in-memory vocabulary
  // from overflowing or exhausting memory.
  need(c.n_layer >= 1 && c.n_layer <= 1024, "--layers must be 1..1024");
  need(c.n_embd >= 1 && c.n_embd <= (1 << 20), "--dim must be 1..1048576");
  need(c.n_head >= 1 && c.n_head <= 4096 && c.n_head_kv >= 1, "--heads must be 1..4096 and --kv-heads positive");
  need(c.n_head % c.n_head_kv == 0, "--heads must be a multiple of --kv-heads");
  need(c.head_dim >= 0 && c.head_dim <= 65536, "--head-dim must be 1..65536");
  need(c.head_dim != 0 || c.n_embd % c.n_head == 0, "--dim must be a multiple of --heads (or give --head-dim)");
  need(c.head_dim_or_default() >= 2 && c.head_dim_or_default() % 2 == 0, "the head dimension must be even (rope rotates pairs)");
  need(c.n_vocab >= 1 && c.n_vocab <= (1 << 22), "--vocab must be 1..4194304");
  need(c.n_ctx >= 1 && c.n_ctx <= UINT32_MAX, "--ctx must be 1..4294967295");
  need(c.vocab_family == "qwen" || c.vocab_family == "qwen35" || c.vocab_family == "llama3",
       "vocabulary family must be qwen, qwen35 or llama3");
  if (c.is_moe()) {
    need(c.n_expert >= 1 && c.n_expert <= 4096 && c.n_expert_used >= 1 && c.n_expert_used <= c.n_expert,
         c.arch + " needs 1 <= --experts <= 4096 and 1 <= --experts-used <= --experts");
    need(c.n_ff_exp >= 1 && c.n_ff_exp <= (1 << 22), c.arch + " needs --expert-ffn (1..4194304)");
    need(c.n_ff >= 0 && c.n_ff <= (1 << 22), "--ffn must be 0..4194304");
  } else {
    need(c.n_expert == 0, "--experts is only valid for qwen3moe and qwen35moe");
    need(c.n_ff >= 1 && c.n_ff <= (1 << 22), "--ffn must be 1..4194304");
  }
  if (c.is_hybrid()) validate_qwen35_synth_config(hybrid_config(c));
}

SynthFileType synth_file_type(const std::string& name) {
  std::string up;
  for (char ch : name) up.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  for (const auto& e : kFtypes)
    if (up == e.name) return SynthFileType{e.name, e.ftype, e.base, e.mixture};
  std::string list;
  for (const auto& n : synth_file_type_names()) list += (list.empty() ? "" : ", ") + n;
  throw Error("unknown --type '" + name + "' (known: " + list + ")");
}

std::vector<std::string> synth_file_type_names() {
  std::vector<std::string> out;
  for (const auto& e : kFtypes) out.push_back(e.name);
  return out;
}

std::vector<SynthTensor> synth_tensors(const SynthConfig& c, const SynthFileType& ft) {
  validate_synth_config(c);
  std::vector<SynthTensor> t;
  if (c.is_hybrid()) {
    for (auto& h : qwen35_synth_tensors(hybrid_config(c)))
      t.push_back({std::move(h.name), std::move(h.shape), DType::F32, h.mean, h.sigma, h.keep_f32});
  } else {
    const int64_t hd = c.head_dim_or_default();
    const int64_t q_dim = hd * c.n_head, kv_dim = hd * c.n_head_kv;
    auto sig = [](int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))); };
    constexpr float kNormSpread = 0.05f;
    // A weight matrix: N(0, 1/fan_in) keeps activations at unit scale through random layers.
    auto weight = [&](std::string name, std::vector<int64_t> shape, bool keep_f32 = false) {
      const float s = sig(shape[0]);
      t.push_back({std::move(name), std::move(shape), DType::F32, 0.0f, s, keep_f32});
    };
    auto norm = [&](std::string name, int64_t n) { t.push_back({std::move(name), {n}, DType::F32, 1.0f, kNormSpread, true}); };
    auto bias = [&](std::string name, int64_t n) { t.push_back({std::move(name), {n}, DType::F32, 0.0f, 0.02f, true}); };

    weight("token_embd.weight", {c.n_embd, c.n_vocab});
    norm("output_norm.weight", c.n_embd);
    if (!c.tied) weight("output.weight", {c.n_embd, c.n_vocab});
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      norm(p + "attn_norm.weight", c.n_embd);
      weight(p + "attn_q.weight", {c.n_embd, q_dim});
      weight(p + "attn_k.weight", {c.n_embd, kv_dim});
      weight(p + "attn_v.weight", {c.n_embd, kv_dim});
      if (c.arch == "qwen2") {
        bias(p + "attn_q.bias", q_dim);
        bias(p + "attn_k.bias", kv_dim);
        bias(p + "attn_v.bias", kv_dim);
      }
      weight(p + "attn_output.weight", {q_dim, c.n_embd});
      if (c.arch == "qwen3" || c.arch == "qwen3moe") {
        norm(p + "attn_q_norm.weight", hd);
        norm(p + "attn_k_norm.weight", hd);
      }
      norm(p + "ffn_norm.weight", c.n_embd);
      if (c.arch == "qwen3moe") {
        // The router stays F32 in every file type (the converter and llama-quantize both keep it).
        weight(p + "ffn_gate_inp.weight", {c.n_embd, c.n_expert}, /*keep_f32=*/true);
        weight(p + "ffn_gate_exps.weight", {c.n_embd, c.n_ff_exp, c.n_expert});
        weight(p + "ffn_up_exps.weight", {c.n_embd, c.n_ff_exp, c.n_expert});
        weight(p + "ffn_down_exps.weight", {c.n_ff_exp, c.n_embd, c.n_expert});
      } else {
        weight(p + "ffn_gate.weight", {c.n_embd, c.n_ff});
        weight(p + "ffn_up.weight", {c.n_embd, c.n_ff});
        weight(p + "ffn_down.weight", {c.n_ff, c.n_embd});
      }
    }
  }
  // llama-quantize counts attn_v and fused attn_qkv tensors together for its attn_v rule.
  int64_t n_attn_v = 0;
  for (const auto& x : t)
    if (x.name.find("attn_v.weight") != std::string::npos || x.name.find("attn_qkv.weight") != std::string::npos) ++n_attn_v;
  TypeChooser chooser(c, ft, n_attn_v);
  for (auto& x : t) {
    // choose() also advances the per-category counters, so it runs for every tensor in file order.
    const DType chosen = chooser.choose(x.name, x.shape);
    x.type = x.keep_f32 ? DType::F32 : chosen;
  }
  return t;
}

void synth_bpe_vocab(Writer& w, const std::string& family, int64_t n_vocab) {
  // Regular tokens end where the real tokenizer's special range starts; smaller vocabularies keep the
  // named specials and shrink the regular part.
  // Qwen3.5's padded 248320-token layout is not reproduced: its named specials simply close the vocabulary.
  const bool qwen = family == "qwen" || family == "qwen35";
  const int64_t real_first_special = family == "qwen" ? 151643 : family == "qwen35" ? INT64_MAX : 128000;
  const int64_t n_named = qwen ? 26 : 10;
  if (n_vocab < 256 + n_named)
    throw Error("synth: a byte-level BPE vocabulary needs at least " + std::to_string(256 + n_named) + " tokens");
  const int64_t n_regular = std::min(real_first_special, n_vocab - n_named);
  const auto bytes = byte_tokens();
  const auto order = merge_char_order(bytes);

  std::vector<std::string> tokens;
  tokens.reserve(static_cast<size_t>(n_vocab));
  std::vector<std::string> merges;
  merges.reserve(static_cast<size_t>(n_regular - 256));
  for (const auto& b : bytes) tokens.push_back(b.second);
  // Longer tokens: each new token is an existing token followed by one character, so every merge
  // "left right" joins two tokens that exist. Round r appends characters to the tokens made in
  // round r-1; within a round, common characters come first.
  std::vector<size_t> frontier;
  for (int id : order) frontier.push_back(static_cast<size_t>(id));
  for (bool first_round = true; static_cast<int64_t>(tokens.size()) < n_regular; first_round = false) {
    std::vector<size_t> next;
    // The 2-character round pairs every character; later rounds extend by the 64 most common ones.
    const size_t width = first_round ? order.size() : 64;
    for (size_t ci = 0; ci < width && static_cast<int64_t>(tokens.size()) < n_regular; ++ci) {
      for (size_t left : frontier) {
        if (static_cast<int64_t>(tokens.size()) >= n_regular) break;
        const std::string& right = bytes[static_cast<size_t>(order[ci])].second;
        merges.push_back(tokens[left] + " " + right);
        next.push_back(tokens.size());
        tokens.push_back(tokens[left] + right);
      }
    }
    frontier = std::move(next);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  const auto specials = special_tokens(qwen ? "qwen" : family, n_vocab - n_regular, n_regular);
  for (const auto& s : specials) {
    tokens.push_back(s.text);
    types.push_back(s.type);
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", family == "qwen" ? "qwen2" : family == "qwen35" ? "qwen35" : "llama-bpe");
  w.set("tokenizer.ggml.tokens", make_string_array(tokens));
  w.set("tokenizer.ggml.token_type", make_i32_array(types));
  w.set("tokenizer.ggml.merges", make_string_array(merges));
  const auto first = static_cast<uint32_t>(n_regular);
  if (qwen) {
    w.set_u32("tokenizer.ggml.eos_token_id", first + 2);  // <|im_end|>
    w.set_u32("tokenizer.ggml.padding_token_id", first);  // <|endoftext|>
    w.set_u32("tokenizer.ggml.bos_token_id", first);
    w.set_bool("tokenizer.ggml.add_bos_token", false);
  } else {
    w.set_u32("tokenizer.ggml.bos_token_id", first);      // <|begin_of_text|>
    w.set_u32("tokenizer.ggml.eos_token_id", first + 1);  // <|end_of_text|>
    w.set_bool("tokenizer.ggml.add_bos_token", true);
  }
}

namespace {
// The converter's keys for llama / qwen2 / qwen3 / qwen3moe, in its order.
void plain_arch_metadata(Writer& w, const SynthConfig& c, const SynthFileType& ft) {
  const std::string& a = c.arch;
  const int64_t hd = c.head_dim_or_default();
  w.set_u32(a + ".block_count", static_cast<uint32_t>(c.n_layer));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(c.n_ctx));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(c.n_embd));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(c.arch == "qwen3moe" && c.n_ff == 0 ? c.n_ff_exp : c.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(c.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
  w.set_f32(a + ".rope.freq_base", static_cast<float>(c.rope_base));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_eps));
  if (c.arch == "qwen3moe") {
    w.set_u32(a + ".expert_count", static_cast<uint32_t>(c.n_expert));
    w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(c.n_expert_used));
  }
  // The converter writes key/value_length when config.json has head_dim (every Qwen3), otherwise
  // llama.cpp derives n_embd / n_head.
  if (c.arch == "qwen3" || c.arch == "qwen3moe" || hd != c.n_embd / c.n_head || c.n_embd % c.n_head != 0) {
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(hd));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(hd));
  }
  w.set_u32("general.file_type", ft.ftype);
  if (c.arch == "llama") {
    w.set_u32("llama.vocab_size", static_cast<uint32_t>(c.n_vocab));
    w.set_u32("llama.rope.dimension_count", static_cast<uint32_t>(hd));
  }
  if (c.arch == "qwen3moe") w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_exp));
  w.set_u32("general.quantization_version", 2);
}
}  // namespace

void synth_metadata(Writer& w, SynthConfig& c, const SynthFileType& ft, const std::string& vocab_from, uint64_t seed) {
  std::unique_ptr<File> vocab;
  if (!vocab_from.empty()) {
    vocab = File::open(vocab_from);
    const Value* toks = vocab->find("tokenizer.ggml.tokens");
    if (!toks || toks->type != ValueType::ARRAY || toks->as_array().elem_type != ValueType::STRING)
      throw Error(vocab_from + ": no tokenizer.ggml.tokens string array to take the vocabulary from");
    c.n_vocab = static_cast<int64_t>(toks->as_array().items.size());
  }
  validate_synth_config(c);
  const std::string& a = c.arch;

  uint64_t params = 0;
  for (const auto& t : synth_tensors(c, ft)) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    params += n;
  }
  w.set_string("general.architecture", a);
  w.set_string("general.type", "model");
  w.set_string("general.name", (c.name.empty() ? a : c.name) + " (synthetic)");
  w.set_string("general.description", "random weights written by peregrine gguf synth (seed " + std::to_string(seed) +
                                          "); real shapes, not a trained model");
  w.set_string("general.size_label", c.size_label.empty() ? size_label(params) : c.size_label);
  if (c.is_hybrid()) {
    qwen35_synth_metadata(w, hybrid_config(c));
    w.set_u32("general.file_type", ft.ftype);
    w.set_u32("general.quantization_version", 2);
  } else {
    plain_arch_metadata(w, c, ft);
  }
  if (vocab) {
    for (const auto& [key, v] : vocab->metadata())
      if (key.rfind("tokenizer.", 0) == 0) w.set(key, v);
  } else {
    synth_bpe_vocab(w, c.vocab_family, c.n_vocab);
  }
}

SynthResult synth_write(SynthOptions opt, const std::string& path) {
  Writer w;
  synth_metadata(w, opt.cfg, opt.file_type, opt.vocab_from, opt.seed);
  const auto plan = synth_tensors(opt.cfg, opt.file_type);
  for (const auto& t : plan)
    if (!can_quantize(t.type))
      throw Error("synth: tensor " + t.name + " needs type " + std::string(dtype_name(t.type)) +
                  ", which cannot be quantized yet");

  uint64_t total = 0;
  for (const auto& t : plan) total += Writer::tensor_bytes(t.type, t.shape);
  auto maker = std::make_shared<DataMaker>(opt.threads, opt.seed, std::max<size_t>(opt.chunk_bytes, 1));
  uint64_t done = 0;
  auto last_report = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  for (const auto& t : plan) {
    w.add_tensor_stream(t.name, t.type, t.shape, [&, maker, t](const Writer::Emit& emit) {
      maker->produce(t, [&](const void* data, size_t n) {
        emit(data, n);
        done += n;
        const auto now = std::chrono::steady_clock::now();
        if (opt.progress && (now - last_report > std::chrono::milliseconds(200) || done == total)) {
          last_report = now;
          opt.progress(done, total);
        }
      });
    });
  }
  w.write(path);  // the progress callback has seen done == total from the last chunk
  return SynthResult{w.file_size(), opt.cfg, plan};
}

}  // namespace pg::gguf
