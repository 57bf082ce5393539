// Loading a tokenizer from GGUF metadata, special-token handling, encode/decode dispatch. The rules
// (defaults per tokenizer model, special-token detection by text, end-of-generation set, token
// attributes) follow llama.cpp's llama_vocab so that both produce the same ids and text.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "gguf/gguf.h"
#include "tokenizer/impl.h"

namespace pg::tok {

namespace {

// A string from a file, quoted and safe to print in one line.
std::string quoted(std::string_view s) {
  std::string o = "'";
  for (char c : utf8_sanitize(s.substr(0, 200))) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      o += buf;
    } else {
      o += c;
    }
  }
  return o + (s.size() > 200 ? "...'" : "'");
}

const gguf::Array* find_array(const gguf::File& f, const std::string& key, std::initializer_list<gguf::ValueType> elem) {
  const gguf::Value* v = f.find(key);
  if (!v) return nullptr;
  PG_CHECK(v->type == gguf::ValueType::ARRAY, f.path() + ": " + key + " is not an array");
  const gguf::Array& a = v->as_array();
  PG_CHECK(std::find(elem.begin(), elem.end(), a.elem_type) != elem.end(),
           f.path() + ": " + key + " is an array of " + gguf::value_type_name(a.elem_type) + ", which is not supported");
  return &a;
}

uint32_t attr_of_type(int64_t t) {
  switch (static_cast<TokenType>(t)) {
    case TokenType::UNKNOWN:
      return ATTR_UNKNOWN;
    case TokenType::UNUSED:
      return ATTR_UNUSED;
    case TokenType::NORMAL:
      return ATTR_NORMAL;
    case TokenType::CONTROL:
      return ATTR_CONTROL;
    case TokenType::USER_DEFINED:
      return ATTR_USER_DEFINED;
    case TokenType::BYTE:
      return ATTR_BYTE;
    default:
      return ATTR_UNDEFINED;
  }
}

// Texts llama.cpp treats as end-of-generation markers (llama_vocab::load).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>",    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>",      "</s>",       "<|eom_id|>", "<EOT>",      "_<EOT>",   "[EOT]",     "[EOS]",     "<|end_of_text|>",
    "<end_of_utterance>", "<eos>",      "<turn|>",
};
// Candidates for the EOT id when the file names none, in the order of preference used here.
constexpr const char* kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",         "<|endoftext|>",      "<|end_of_text|>",
    "<EOT>",      "_<EOT>",     "[EOT]",   "<｜end▁of▁sentence｜>", "<end_of_utterance>",
};
constexpr const char* kEomTexts[] = {"<|eom_id|>"};
constexpr const char* kFimPreTexts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",    "<｜fim▁begin｜>",
                                        "<PRE>",          "▁<PRE>",       "<|code_prefix|>", "<|prefix|>"};
constexpr const char* kFimSufTexts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",    "<｜fim▁hole｜>",
                                        "<SUF>",          "▁<SUF>",       "<|code_suffix|>", "<|suffix|>"};
constexpr const char* kFimMidTexts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",    "<｜fim▁end｜>",
                                        "<MID>",          "▁<MID>",       "<|code_middle|>", "<|middle|>"};
constexpr const char* kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr const char* kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr const char* kFimSepTexts[] = {"<|file_sep|>", "<|file_separator|>", "<file_sep>",
                                        "<filename>",   "<|filename|>",       "<|code_file|>"};

bool c_isspace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (s.find(from) == std::string::npos) return;
  std::string o;
  o.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    o.append(s, pos, hit - pos);
    o += to;
  }
  o.append(s, pos, std::string::npos);
  s.swap(o);
}

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

// ---- loading -------------------------------------------------------------------------------------

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f, const LoadOptions& options) {
  auto im = std::make_unique<Impl>();
  Impl& v = *im;
  const std::string& path = f.path();

  const auto model = f.get_string_opt("tokenizer.ggml.model");
  PG_CHECK(model.has_value(), path + ": no tokenizer in this file (tokenizer.ggml.model is missing)");
  v.model = *model;
  auto pre = f.get_string_opt("tokenizer.ggml.pre");
  if (!options.pre_override.empty()) pre = options.pre_override;

  if (v.model == "llama") {
    v.type = VocabType::SPM;
    v.sp.bos = 1, v.sp.eos = 2, v.sp.unk = 0;
  } else if (v.model == "bert") {
    v.type = VocabType::WPM;
    v.sp.bos = 101, v.sp.unk = 100, v.sp.sep = 102, v.sp.pad = 0, v.sp.mask = 103;
  } else if (v.model == "gpt2") {
    v.type = VocabType::BPE;
    v.sp.bos = 11, v.sp.eos = 11;
  } else {
    throw Error(path + ": unsupported tokenizer model " + quoted(v.model) +
                " (tokenizer.ggml.model); supported: gpt2 (byte-level BPE), llama (SentencePiece), bert (WordPiece)");
  }

  PreConfig pre_cfg;
  if (v.type == VocabType::BPE) {
    v.pre = pre.value_or("default");
    if (!pre) PG_WARN("%s: tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer", path.c_str());
    try {
      pre_cfg = pre_config(v.pre);
    } catch (const Error& e) {
      throw Error(path + ": " + e.what());
    }
    v.add_space_prefix = false;
    v.clean_spaces = pre_cfg.clean_spaces;
    v.add_bos = pre_cfg.add_bos == 1;
    if (pre_cfg.no_bos) v.sp.bos = kNoToken;
  } else if (v.type == VocabType::SPM) {
    v.pre = pre.value_or("default");
    v.add_space_prefix = true, v.clean_spaces = false, v.add_bos = true, v.add_eos = false;
  } else {
    v.pre = pre.value_or("default");
    v.add_space_prefix = false, v.clean_spaces = true, v.add_bos = true, v.add_eos = false, v.add_sep = true;
  }
  if (auto b = f.get_bool_opt("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;
  if (auto b = f.get_bool_opt("tokenizer.ggml.remove_extra_whitespaces")) v.remove_extra_ws = *b;

  // Vocabulary.
  const gguf::Array* toks = find_array(f, "tokenizer.ggml.tokens", {gguf::ValueType::STRING});
  PG_CHECK(toks != nullptr, path + ": tokenizer.ggml.tokens is missing");
  const size_t n = toks->items.size();
  PG_CHECK(n > 0, path + ": tokenizer.ggml.tokens is empty");
  PG_CHECK(n < static_cast<size_t>(std::numeric_limits<int32_t>::max()), path + ": too many tokens");
  const gguf::Array* scores = find_array(f, "tokenizer.ggml.scores", {gguf::ValueType::FLOAT32, gguf::ValueType::INT32});
  if (scores) PG_CHECK(scores->items.size() >= n, path + ": tokenizer.ggml.scores has fewer entries than there are tokens");
  const gguf::Array* types = find_array(f, "tokenizer.ggml.token_type", {gguf::ValueType::INT32});
  if (types) PG_CHECK(types->items.size() >= n, path + ": tokenizer.ggml.token_type has fewer entries than there are tokens");

  v.tokens.resize(n);
  v.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v.tokens[i];
    t.text = toks->items[i].as_string();
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    v.text_to_id[t.text] = static_cast<int32_t>(i);  // a later duplicate wins, as in llama.cpp
    v.max_token_len = std::max(v.max_token_len, t.text.size());
    t.score = scores ? static_cast<float>(scores->items[i].as_float()) : 0.0f;
    t.attr = types ? attr_of_type(types->items[i].as_int()) : ATTR_NORMAL;
  }

  if (v.type == VocabType::BPE) {
    const gguf::Array* merges = find_array(f, "tokenizer.ggml.merges", {gguf::ValueType::STRING});
    PG_CHECK(merges != nullptr, path + ": tokenizer.ggml.merges is missing (needed by the gpt2 tokenizer)");
    std::vector<std::string_view> mv;
    mv.reserve(merges->items.size());
    for (const auto& m : merges->items) mv.emplace_back(m.as_string());
    std::vector<std::string> texts(n);
    for (size_t i = 0; i < n; ++i) texts[i] = v.tokens[i].text;
    v.bpe = std::make_unique<BpeModel>(texts, v.text_to_id, mv, std::move(pre_cfg));
  }

  // Special token ids from the file. Out-of-range defaults are dropped; out-of-range values in the
  // file are ignored with a warning (stories260K stores 0xFFFFFFFF for "none").
  {
    const std::pair<const char*, int32_t*> keys[] = {
        {"tokenizer.ggml.bos_token_id", &v.sp.bos},         {"tokenizer.ggml.eos_token_id", &v.sp.eos},
        {"tokenizer.ggml.eot_token_id", &v.sp.eot},         {"tokenizer.ggml.eom_token_id", &v.sp.eom},
        {"tokenizer.ggml.unknown_token_id", &v.sp.unk},     {"tokenizer.ggml.seperator_token_id", &v.sp.sep},
        {"tokenizer.ggml.padding_token_id", &v.sp.pad},     {"tokenizer.ggml.mask_token_id", &v.sp.mask},
        {"tokenizer.ggml.fim_pre_token_id", &v.sp.fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &v.sp.fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &v.sp.fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &v.sp.fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &v.sp.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &v.sp.fim_sep},
        {"tokenizer.ggml.prefix_token_id", &v.sp.fim_pre},  {"tokenizer.ggml.suffix_token_id", &v.sp.fim_suf},
        {"tokenizer.ggml.middle_token_id", &v.sp.fim_mid},
    };
    for (const auto& [key, id] : keys) {
      if (*id >= 0 && static_cast<size_t>(*id) >= n) *id = kNoToken;
      const gguf::Value* val = f.find(key);
      if (!val) continue;
      PG_CHECK(val->is_integer(), path + ": " + key + " is not an integer");
      const int64_t x = val->type == gguf::ValueType::UINT64 || val->type == gguf::ValueType::UINT32 ||
                                val->type == gguf::ValueType::UINT16 || val->type == gguf::ValueType::UINT8
                            ? static_cast<int64_t>(std::min<uint64_t>(val->as_uint(), std::numeric_limits<int64_t>::max()))
                            : val->as_int();
      if (x < 0 || static_cast<uint64_t>(x) >= n) {
        PG_DEBUG("%s: %s = %lld is outside the vocabulary; keeping %d", path.c_str(), key, static_cast<long long>(x), *id);
      } else {
        *id = static_cast<int32_t>(x);
      }
    }
    if (auto b = f.get_bool_opt("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
    if (auto b = f.get_bool_opt("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
    if (auto b = f.get_bool_opt("tokenizer.ggml.add_sep_token")) v.add_sep = *b;
    if (auto b = f.get_bool_opt("tokenizer.ggml.normalizer.lowercase")) v.wpm_lowercase = *b;
    v.wpm_strip_accents = v.wpm_lowercase;
    if (auto b = f.get_bool_opt("tokenizer.ggml.normalizer.strip_accents")) v.wpm_strip_accents = *b;
  }

  // Special tokens found by their text; a token so found is made a control token.
  const auto find_text = [&](std::string_view t) -> int32_t {
    auto it = v.text_to_id.find(t);
    return it == v.text_to_id.end() ? kNoToken : it->second;
  };
  const auto detect = [&](int32_t& slot, const auto& texts) {
    if (slot != kNoToken) return;
    for (const char* t : texts) {
      const int32_t id = find_text(t);
      if (id == kNoToken) continue;
      slot = id;
      v.tokens[id].attr |= ATTR_CONTROL;
      return;
    }
  };
  detect(v.sp.eot, kEotTexts);
  detect(v.sp.eom, kEomTexts);
  detect(v.sp.fim_pre, kFimPreTexts);
  detect(v.sp.fim_suf, kFimSufTexts);
  detect(v.sp.fim_mid, kFimMidTexts);
  detect(v.sp.fim_pad, kFimPadTexts);
  detect(v.sp.fim_rep, kFimRepTexts);
  detect(v.sp.fim_sep, kFimSepTexts);

  // Control tokens named "...unused..." are unused.
  for (auto& t : v.tokens) {
    if ((t.attr & ATTR_CONTROL) && t.text.find("unused") != std::string::npos) t.attr |= ATTR_UNUSED;
  }

  // End-of-generation set.
  {
    std::vector<int32_t> eog;
    for (int32_t id : {v.sp.fim_pad, v.sp.fim_rep, v.sp.fim_sep}) {
      if (id != kNoToken) eog.push_back(id);
    }
    for (const char* t : kEogTexts) {
      const int32_t id = find_text(t);
      if (id == kNoToken) continue;
      eog.push_back(id);
      v.tokens[id].attr |= ATTR_CONTROL;
    }
    // gpt-oss renders these in its output, so they must not be swallowed as control tokens.
    for (const char* t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
      const int32_t id = find_text(t);
      if (id != kNoToken) v.tokens[id].attr = ATTR_USER_DEFINED;
    }
    for (int32_t id : {v.sp.eos, v.sp.eot, v.sp.eom}) {
      if (id != kNoToken) eog.push_back(id);
    }
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    const auto has = [&](const char* t) {
      const int32_t id = find_text(t);
      return id != kNoToken && std::binary_search(eog.begin(), eog.end(), id);
    };
    // Harmony (gpt-oss) and solar-open end a message with <|end|> but keep generating after it.
    if ((has("<|return|>") && has("<|call|>") && has("<|end|>")) || (has("<|calls|>") && has("<|flush|>") && has("<|end|>"))) {
      const int32_t id = find_text("<|end|>");
      eog.erase(std::find(eog.begin(), eog.end(), id));
      v.tokens[id].attr = ATTR_USER_DEFINED;
    }
    // Gemma 4 uses </s> inside tool responses.
    if (has("<|tool_response>") && has("</s>")) {
      const int32_t id = find_text("</s>");
      eog.erase(std::find(eog.begin(), eog.end(), id));
      v.tokens[id].attr = ATTR_NORMAL;
    }
    v.eog = std::move(eog);
  }

  // Tokens matched in the text before tokenization, longest first.
  for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) {
    if (v.tokens[id].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) v.special_cache.push_back(id);
  }
  std::stable_sort(v.special_cache.begin(), v.special_cache.end(),
                   [&](int32_t a, int32_t b) { return v.tokens[a].text.size() > v.tokens[b].text.size(); });

  // Per-model token attributes llama.cpp sets by name.
  {
    std::string name = f.get_string_opt("general.name").value_or("");
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const std::string arch = f.architecture();
    const auto set_attr = [&](int32_t id, uint32_t a, bool on) {
      if (id == kNoToken) return;
      v.tokens[id].attr = on ? (v.tokens[id].attr | a) : (v.tokens[id].attr & ~a);
    };
    const bool jina = v.pre == "jina-v2-de" || v.pre == "jina-v2-es" || v.pre == "jina-v2-code" ||
                      arch.find("nomic-bert-moe") != std::string::npos || arch.find("jina-bert-v3") != std::string::npos;
    if (jina) {
      set_attr(find_text("<mask>"), ATTR_LSTRIP, true);
    } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
      for (int32_t id : v.special_cache) set_attr(id, ATTR_RSTRIP, true);
      set_attr(find_text("</s>"), ATTR_RSTRIP, true);
      for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(find_text(t), ATTR_RSTRIP, false);
    } else if (name.find("modern-bert") != std::string::npos) {
      set_attr(find_text("[MASK]"), ATTR_LSTRIP, true);
    }
  }

  v.piece.resize(n);
  for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) v.piece[id] = v.make_piece(id);

  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer(std::move(im)));
  // The newline token: <0x0A> for SPM, the token of "\n" for BPE, the padding token for WordPiece.
  Impl& w = *tok->impl_;
  if (w.type == VocabType::SPM) {
    w.sp.nl = find_text("<0x0A>");
    if (w.sp.nl == kNoToken) w.sp.nl = find_text("\n");
    if (w.sp.nl == kNoToken) w.sp.nl = w.sp.pad;
  } else if (w.type == VocabType::WPM) {
    w.sp.nl = w.sp.pad;
  } else {
    const auto ids = tok->encode("\n", false, false);
    w.sp.nl = ids.empty() ? w.sp.pad : ids[0];
  }
  return tok;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

// ---- pieces --------------------------------------------------------------------------------------

std::string Tokenizer::Impl::make_piece(int32_t id) const {
  const TokenData& t = tokens[id];
  if (t.attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) return t.text;
  if (t.attr & ATTR_NORMAL) {
    if (type != VocabType::BPE) {
      std::string s = t.text;
      replace_all(s, kSpaceMark, " ");
      return s;
    }
    // Byte-level BPE: each character stands for one byte.
    std::string out;
    const std::string text = utf8_sanitize(t.text);
    for (size_t i = 0; i < text.size();) {
      const size_t start = i;
      const uint32_t cp = utf8_next(text, i);
      const int b = gpt2_char_to_byte(cp);
      if (b >= 0) {
        out += static_cast<char>(b);
      } else {
        // Same marker llama.cpp writes for a character outside the byte alphabet.
        char buf[8];
        out += "[UNK_BYTE_0x";
        for (size_t k = start; k < i; ++k) {
          std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(text[k]));
          out += buf;
        }
        out += t.text + "]";
      }
    }
    return out;
  }
  if (t.attr & ATTR_BYTE) {
    // "<0xAB>"
    if (t.text.size() >= 5) {
      const std::string hex = t.text.substr(3, 2);
      return std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
    }
    return std::string(1, '\0');
  }
  return {};
}

void Tokenizer::Impl::check_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens.size()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(tokens.size() - 1) + ")");
  }
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  impl_->check_id(id);
  if (!special && (impl_->tokens[id].attr & (ATTR_UNKNOWN | ATTR_CONTROL))) return {};
  return impl_->piece[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool special, bool clean) const {
  std::string out;
  bool remove_space = impl_->add_space_prefix;
  for (int32_t id : ids) {
    const std::string p = token_to_piece(id, special);
    out.append(p, remove_space && !p.empty() && p[0] == ' ' ? 1 : 0, std::string::npos);
    remove_space = false;
  }
  if (clean && impl_->clean_spaces) clean_spaces_inplace(out);
  return out;
}

std::string Tokenizer::detokenize(std::span<const int32_t> ids, bool special, bool clean) const {
  return utf8_sanitize(decode(ids, special, clean));
}

// ---- encoding ------------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& v = *impl_;
  // Split out special tokens: a fragment is either raw text [a, b) or a token (a == b, id >= 0).
  struct Frag {
    size_t a, b;
    int32_t id;
  };
  std::vector<Frag> frags;
  if (!text.empty()) frags.push_back(Frag{0, text.size(), kNoToken});
  std::vector<Frag> next;
  for (int32_t sid : v.special_cache) {
    const TokenData& st = v.tokens[sid];
    if (!parse_special && (st.attr & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
    const std::string_view pat = st.text;
    bool any = false;
    for (const Frag& fr : frags) {
      if (fr.id == kNoToken && text.substr(fr.a, fr.b - fr.a).find(pat) != std::string_view::npos) {
        any = true;
        break;
      }
    }
    if (!any) continue;
    next.clear();
    for (const Frag& fr : frags) {
      if (fr.id != kNoToken) {
        next.push_back(fr);
        continue;
      }
      size_t a = fr.a;
      const size_t b = fr.b;
      while (a < b) {
        const size_t hit = text.substr(0, b).find(pat, a);
        if (hit == std::string_view::npos) break;
        size_t left_end = hit;
        if (st.attr & ATTR_LSTRIP) {
          while (left_end > a && c_isspace(text[left_end - 1])) --left_end;
        }
        if (left_end > a) next.push_back(Frag{a, left_end, kNoToken});
        next.push_back(Frag{hit, hit, sid});
        a = hit + pat.size();
        if (st.attr & ATTR_RSTRIP) {
          while (a < b && c_isspace(text[a])) ++a;
        }
      }
      if (a < b) next.push_back(Frag{a, b, kNoToken});
    }
    frags.swap(next);
  }

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  const auto need = [&](int32_t id, const char* what) {
    PG_CHECK(id != kNoToken, std::string("the vocabulary asks for a ") + what + " token but has none");
    return id;
  };
  switch (v.type) {
    case VocabType::SPM: {
      bool prev_special = true;  // the dummy prefix space goes before the first text
      if (add_special && v.add_bos) out.push_back(need(v.sp.bos, "BOS"));
      for (const Frag& fr : frags) {
        if (fr.id != kNoToken) {
          out.push_back(fr.id);
          prev_special = true;
          continue;
        }
        std::string s;
        if (v.add_space_prefix && prev_special) s = " ";
        s.append(text.substr(fr.a, fr.b - fr.a));
        replace_all(s, " ", kSpaceMark);
        v.spm_encode(s, out);
        prev_special = false;
      }
      if (add_special && v.add_eos) out.push_back(need(v.sp.eos, "EOS"));
      break;
    }
    case VocabType::BPE: {
      if (add_special && v.add_bos) out.push_back(need(v.sp.bos, "BOS"));
      for (const Frag& fr : frags) {
        if (fr.id != kNoToken) {
          out.push_back(fr.id);
          continue;
        }
        const std::string_view raw = text.substr(fr.a, fr.b - fr.a);
        // The regexes need valid UTF-8; invalid bytes are tokenized as U+FFFD, as in llama.cpp.
        if (utf8_is_valid(raw)) {
          v.bpe->encode(raw, out);
        } else {
          v.bpe->encode(utf8_sanitize(raw), out);
        }
      }
      if (add_special && v.add_eos) out.push_back(need(v.sp.eos, "EOS"));
      break;
    }
    case VocabType::WPM: {
      if (add_special) out.push_back(need(v.sp.bos, "CLS"));
      for (const Frag& fr : frags) {
        if (fr.id != kNoToken) {
          out.push_back(fr.id);
          continue;
        }
        v.wpm_encode(text.substr(fr.a, fr.b - fr.a), out);
      }
      if (add_special) out.push_back(need(v.sp.sep, "SEP"));
      break;
    }
  }
  return out;
}

// ---- accessors -----------------------------------------------------------------------------------

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->tokens.size()); }
VocabType Tokenizer::type() const { return impl_->type; }
const std::string& Tokenizer::model_name() const { return impl_->model; }
const std::string& Tokenizer::pre_name() const { return impl_->pre; }
const SpecialTokens& Tokenizer::special() const { return impl_->sp; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
bool Tokenizer::add_sep() const { return impl_->add_sep; }
bool Tokenizer::add_space_prefix() const { return impl_->add_space_prefix; }
bool Tokenizer::clean_spaces() const { return impl_->clean_spaces; }
bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id); }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return impl_->eog; }
uint32_t Tokenizer::attr(int32_t id) const {
  impl_->check_id(id);
  return impl_->tokens[id].attr;
}
const std::string& Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return impl_->tokens[id].text;
}
float Tokenizer::score(int32_t id) const {
  impl_->check_id(id);
  return impl_->tokens[id].score;
}
int32_t Tokenizer::text_to_token(std::string_view text) const {
  auto it = impl_->text_to_id.find(text);
  return it == impl_->text_to_id.end() ? kNoToken : it->second;
}

}  // namespace pg::tok
