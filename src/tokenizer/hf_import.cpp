// tokenizer.json (+ tokenizer_config.json) -> tokenizer.ggml.* metadata, following what llama.cpp's
// converter (convert_hf_to_gguf.py get_vocab_base / LlamaHfVocab / BertModel.set_vocab and gguf-py's
// SpecialVocab) writes:
//   - byte-level BPE ("gpt2"): tokens by id ([PAD<id>] unused fillers), added tokens CONTROL when
//     special or "<|...|>"-looking, USER_DEFINED otherwise; merges; pre-tokenizer name;
//   - SentencePiece-style BPE with byte fallback ("llama"): <0xXX> BYTE tokens, the model's unknown
//     token UNKNOWN; scores are minus the rank of the merge that makes each token (llama.cpp's
//     LlamaHfVocab writes -1000 everywhere, which turns its score-ordered merging into left-to-right
//     merging; ranks keep the model's merge order);
//   - WordPiece ("bert"): "##" continuation pieces bare, word-initial pieces with U+2581 prepended;
//   - special token ids, add_bos/add_eos/add_sep, normaliser flags and the chat template.
#include "tokenizer/hf_import.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "gguf/writer.h"
#include "tokenizer/impl.h"

namespace pg::tok {

using json = nlohmann::json;

namespace {

constexpr const char* kOrigContractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
constexpr const char* kAdaptedContractions = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
constexpr const char* kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

// Regex text in one canonical form: \x{HHHH} escapes decoded, the case-insensitive contraction group
// in llama.cpp's explicit-class spelling.
std::string canonical_regex(const std::string& re) {
  std::string out;
  for (size_t i = 0; i < re.size(); ++i) {
    if (re.compare(i, 3, "\\x{") == 0) {
      const size_t close = re.find('}', i);
      if (close != std::string::npos && close > i + 3 && close - i <= 10) {
        const uint32_t cp = static_cast<uint32_t>(std::strtoul(re.substr(i + 3, close - i - 3).c_str(), nullptr, 16));
        utf8_append(out, cp);
        i = close;
        continue;
      }
    }
    if (re[i] == '\\' && i + 1 < re.size()) {
      out += re[i];
      out += re[++i];
      continue;
    }
    out += re[i];
  }
  for (size_t p; (p = out.find(kOrigContractions)) != std::string::npos;) {
    out.replace(p, std::strlen(kOrigContractions), kAdaptedContractions);
  }
  return out;
}

// tokenizer.json regexes that llama.cpp rewrote for its own engine (lookaheads instead of classes).
const std::map<std::string, std::vector<std::string>> kOriginalForms = {
    {"gpt-4o",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^"
      "\\r\\n\\p{L}"
      "\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
      "?[^\\s\\p{L}"
      "\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"tekken",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}"
      "\\p{Lt}\\p{Lm}"
      "\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
};

// Pre-tokenizer regexes of tokenizer.json, in application order; "" entries stand for steps with no
// regex equivalent (they make detection fail, which asks the user for --pre).
void collect_regexes(const json& pt, std::vector<std::string>& out) {
  if (!pt.is_object()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : pt.value("pretokenizers", json::array())) collect_regexes(p, out);
  } else if (type == "Split") {
    const json& pat = pt.value("pattern", json::object());
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      out.push_back(pat["Regex"].get<std::string>());
    } else {
      out.emplace_back();
    }
  } else if (type == "ByteLevel") {
    if (pt.value("use_regex", true)) out.emplace_back(kGpt2Regex);
  } else if (type == "Digits") {
    out.emplace_back(pt.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else if (type == "Metaspace" || type == "WhitespaceSplit" || type == "BertPreTokenizer" || type == "Whitespace") {
    // SentencePiece and WordPiece splitting is not a byte-level BPE pre-tokenizer.
  } else {
    out.emplace_back();
  }
}

std::string token_content(const json& entry) {
  if (entry.is_string()) return entry.get<std::string>();
  if (entry.is_object() && entry.contains("content") && entry["content"].is_string()) return entry["content"].get<std::string>();
  return {};
}

bool looks_special(const std::string& t) {
  const auto starts = [&](const char* p) { return t.rfind(p, 0) == 0; };
  const auto ends = [&](const char* s) {
    const size_t n = std::strlen(s);
    return t.size() >= n && t.compare(t.size() - n, n, s) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || (starts("<|") && ends("|>")) ||
         (starts("<\xEF\xBD\x9C") && ends("\xEF\xBD\x9C>")) || (starts("<unused") && ends(">"));
}

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4])) && t[5] == '>';
}

// Does the normaliser/pre-tokenizer put U+2581 before the text (SentencePiece's dummy prefix)?
bool spm_adds_prefix(const json& tj) {
  bool prefix = false;
  const std::function<void(const json&)> walk = [&](const json& n) {
    if (!n.is_object()) return;
    const std::string type = n.value("type", "");
    if (type == "Prepend" && n.value("prepend", "") == "\xE2\x96\x81") prefix = true;
    if (type == "Metaspace") {
      const std::string scheme = n.value("prepend_scheme", n.value("add_prefix_space", true) ? "always" : "never");
      if (scheme != "never") prefix = true;
    }
    for (const char* k : {"normalizers", "pretokenizers"}) {
      if (n.contains(k) && n[k].is_array()) {
        for (const auto& c : n[k]) walk(c);
      }
    }
  };
  if (tj.contains("normalizer")) walk(tj["normalizer"]);
  if (tj.contains("pre_tokenizer")) walk(tj["pre_tokenizer"]);
  return prefix;
}

}  // namespace

std::string detect_pre_name(const std::vector<std::string>& regexes, bool ignore_merges) {
  if (regexes.empty()) return {};
  std::vector<std::string> sig;
  for (const auto& r : regexes) sig.push_back(canonical_regex(r));
  const char* const candidates[] = {ignore_merges ? "llama-bpe" : "smaug-bpe",
                                    "qwen2",
                                    "qwen35",
                                    "gpt-2",
                                    "starcoder",
                                    "deepseek-llm",
                                    "deepseek-coder",
                                    "deepseek-v3",
                                    "falcon",
                                    "default",
                                    "gpt-4o",
                                    "tekken",
                                    "seed-coder",
                                    "bailingmoe",
                                    "poro-chat",
                                    "viking"};
  for (const char* name : candidates) {
    std::vector<std::vector<std::string>> forms = {pre_config(name).regexes};
    if (auto it = kOriginalForms.find(name); it != kOriginalForms.end()) forms.push_back(it->second);
    for (const auto& form : forms) {
      std::vector<std::string> c;
      for (const auto& r : form) c.push_back(canonical_regex(r));
      if (c == sig) return name;
    }
  }
  return {};
}

HfImportResult import_hf_tokenizer(const std::string& tokenizer_json, const std::string& tokenizer_config_json,
                                   const HfImportOptions& opt, gguf::Writer& w) {
  json tj, cfg;
  try {
    tj = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    throw Error(std::string("tokenizer.json is not valid JSON: ") + e.what());
  }
  if (!tokenizer_config_json.empty()) {
    try {
      cfg = json::parse(tokenizer_config_json);
    } catch (const json::exception& e) {
      throw Error(std::string("tokenizer_config.json is not valid JSON: ") + e.what());
    }
    PG_CHECK(cfg.is_object(), "tokenizer_config.json is not a JSON object");
  }
  PG_CHECK(tj.is_object() && tj.contains("model") && tj["model"].is_object(), "tokenizer.json has no \"model\" object");
  HfImportResult res;
  try {
    const json& model = tj["model"];
    const std::string mtype = model.value("type", "");
    const bool byte_fallback = model.value("byte_fallback", false);
    if (mtype == "BPE") {
      res.model = byte_fallback ? "llama" : "gpt2";
    } else if (mtype == "WordPiece") {
      res.model = "bert";
    } else if (mtype == "Unigram") {
      throw Error("tokenizer.json has a Unigram model (T5-style); only BPE and WordPiece vocabularies can be imported");
    } else {
      throw Error("tokenizer.json model type '" + mtype + "' is not supported (BPE or WordPiece)");
    }

    // ---- vocabulary ----
    PG_CHECK(model.contains("vocab") && model["vocab"].is_object(), "tokenizer.json model has no \"vocab\" object");
    std::map<int64_t, std::string> by_id;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      PG_CHECK(it.value().is_number_integer(), "tokenizer.json vocab entry '" + it.key() + "' has no integer id");
      const int64_t id = it.value().get<int64_t>();
      PG_CHECK(id >= 0 && id < (int64_t{1} << 31), "tokenizer.json vocab id out of range for '" + it.key() + "'");
      by_id[id] = it.key();
    }
    struct Added {
      std::string content;
      bool special, normalized;
    };
    std::map<int64_t, Added> added;
    std::vector<std::pair<std::string, int64_t>> added_list;  // in file order, for special-token lookup
    for (const auto& a : tj.value("added_tokens", json::array())) {
      PG_CHECK(
          a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") && a["content"].is_string(),
          "tokenizer.json has a malformed added_tokens entry");
      const int64_t id = a["id"].get<int64_t>();
      PG_CHECK(id >= 0 && id < (int64_t{1} << 31), "tokenizer.json added token id out of range");
      const std::string content = a["content"].get<std::string>();
      added[id] = Added{content, a.value("special", false), a.value("normalized", true)};
      added_list.emplace_back(content, id);
      by_id[id] = content;
    }
    PG_CHECK(!by_id.empty(), "tokenizer.json has an empty vocabulary");
    int64_t n = by_id.rbegin()->first + 1;
    if (opt.vocab_size > 0) {
      PG_CHECK(opt.vocab_size >= n, "--vocab-size " + std::to_string(opt.vocab_size) +
                                        " is smaller than the largest token id + 1 (" + std::to_string(n) + ")");
      n = opt.vocab_size;
    }
    std::set<std::string> added_contents;
    for (const auto& [id, a] : added) added_contents.insert(a.content);
    const std::string unk =
        model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"].get<std::string>() : "";

    std::vector<std::string> tokens(n);
    std::vector<int32_t> types(n);
    for (int64_t i = 0; i < n; ++i) {
      auto it = by_id.find(i);
      if (it == by_id.end()) {
        tokens[i] = "[PAD" + std::to_string(i) + "]";
        types[i] = static_cast<int32_t>(TokenType::UNUSED);
        continue;
      }
      std::string t = it->second;
      TokenType ty = TokenType::NORMAL;
      auto ad = added.find(i);
      if (res.model == "llama" && !unk.empty() && t == unk) {
        ty = TokenType::UNKNOWN;  // as SentencePiece conversions type <unk>
      } else if (ad != added.end() || added_contents.count(t)) {
        const bool special = ad != added.end() ? ad->second.special : false;
        if (special || looks_special(t)) {
          ty = TokenType::CONTROL;
        } else {
          ty = TokenType::USER_DEFINED;
          // User-defined tokens are matched in raw text, so SentencePiece spaces become real spaces.
          for (size_t p; (p = t.find("\xE2\x96\x81")) != std::string::npos;) t.replace(p, 3, " ");
        }
      } else if (res.model == "llama" && is_byte_token(t)) {
        ty = TokenType::BYTE;
      }
      if (res.model == "bert" && ty != TokenType::CONTROL) {
        t = t.rfind("##", 0) == 0 ? t.substr(2) : "\xE2\x96\x81" + t;
      }
      tokens[i] = std::move(t);
      types[i] = static_cast<int32_t>(ty);
    }

    // ---- merges ----
    std::vector<std::string> merges;
    std::vector<std::string> merged;  // the token each merge makes
    if (mtype == "BPE") {
      const json m = model.value("merges", json::array());
      for (const auto& e : m) {
        if (e.is_string()) {
          const std::string s = e.get<std::string>();
          const size_t sp = s.size() > 1 ? s.find(' ', 1) : std::string::npos;
          merged.push_back(sp == std::string::npos ? std::string() : s.substr(0, sp) + s.substr(sp + 1));
          merges.push_back(s);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
          merged.push_back(e[0].get<std::string>() + e[1].get<std::string>());
          // The pair form (transformers >= 4.45) allows spaces inside a part; gguf-py encodes them as
          // U+0120 so the "left right" string stays splittable.
          std::string s;
          for (int k = 0; k < 2; ++k) {
            if (k) s += ' ';
            for (char c : e[k].get<std::string>()) {
              if (c == ' ') {
                s += "\xC4\xA0";
              } else {
                s += c;
              }
            }
          }
          merges.push_back(std::move(s));
        } else {
          throw Error("tokenizer.json has a merge entry that is neither \"a b\" nor [\"a\", \"b\"]");
        }
      }
      PG_CHECK(!merges.empty() || res.model != "gpt2", "tokenizer.json BPE model has no merges");
    }
    res.n_merges = merges.size();
    res.n_tokens = tokens.size();

    // ---- pre-tokenizer ----
    if (res.model == "gpt2") {
      if (!opt.pre.empty()) {
        pre_config(opt.pre);  // throws for an unknown name
        res.pre = opt.pre;
      } else {
        std::vector<std::string> regexes;
        if (tj.contains("pre_tokenizer")) collect_regexes(tj["pre_tokenizer"], regexes);
        res.pre = detect_pre_name(regexes, model.value("ignore_merges", false));
        if (res.pre.empty()) {
          std::string list;
          for (const auto& r : regexes) list += "\n  " + (r.empty() ? std::string("(a step without a regex)") : r);
          throw Error(
              "cannot tell which llama.cpp pre-tokenizer tokenizer.json uses; pass --pre NAME. Its pre-tokenizer regexes:" +
              (list.empty() ? std::string(" none") : list));
        }
        res.notes.push_back("pre-tokenizer detected as '" + res.pre + "'");
      }
    } else {
      res.pre = opt.pre.empty() ? "default" : opt.pre;
    }

    // ---- special tokens (gguf-py SpecialVocab) ----
    std::map<std::string, bool> add_special;
    const auto cfg_tok = [&](const char* key) -> std::string {
      return cfg.is_object() && cfg.contains(key) ? token_content(cfg[key]) : std::string();
    };
    std::string bos = cfg_tok("bos_token"), eos = cfg_tok("eos_token"), cls = cfg_tok("cls_token"), sep = cfg_tok("sep_token");
    std::string eot, eom;
    if (bos.empty() && !cls.empty()) bos = cls;
    if (eos.empty() && !sep.empty()) eos = sep;
    if (tj.contains("post_processor") && tj["post_processor"].is_object()) {
      const json& pp = tj["post_processor"];
      const json procs = pp.contains("processors") ? pp["processors"] : json::array({pp});
      for (const auto& proc : procs) {
        const std::string type = proc.value("type", "");
        if (type == "RobertaProcessing") {
          add_special["bos"] = add_special["eos"] = add_special["sep"] = true;
          if (cls.empty() && proc.contains("cls") && proc["cls"].is_array() && !proc["cls"].empty())
            cls = token_content(proc["cls"][0]);
          if (sep.empty() && proc.contains("sep") && proc["sep"].is_array() && !proc["sep"].empty())
            sep = token_content(proc["sep"][0]);
        } else if (type == "TemplateProcessing") {
          const json single = proc.value("single", json::array());
          if (single.is_array() && single.size() > 1) {
            const auto special_id = [](const json& item) -> std::string {
              if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object()) {
                return item["SpecialToken"].value("id", "");
              }
              return {};
            };
            if (const std::string first = special_id(single.front()); !first.empty()) {
              if (cfg.is_null()) {
                bos = first;
              } else if (first != bos && first != cls) {
                if (bos.empty()) bos = first;
                if (cls.empty()) cls = first;
              }
              add_special["bos"] = first == bos || first == cls;
            }
            if (const std::string last = special_id(single.back()); !last.empty()) {
              if (cfg.is_null()) {
                eos = last;
              } else if (last != eos) {
                (eot.empty() ? eot : eom) = eos;
                eos = last;
              }
              add_special["eos"] = last == eos;
            }
          }
        }
      }
    }
    if (cfg.is_object()) {
      for (const char* typ : {"bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot", "eom"}) {
        const std::string key = std::string("add_") + typ + "_token";
        if (cfg.contains(key) && cfg[key].is_boolean()) add_special[typ] = cfg[key].get<bool>();
      }
    }
    const std::map<std::string, std::string> contents = {{"bos", bos},
                                                         {"eos", eos},
                                                         {"unk", cfg_tok("unk_token")},
                                                         {"sep", sep},
                                                         {"pad", cfg_tok("pad_token")},
                                                         {"cls", cls},
                                                         {"mask", cfg_tok("mask_token")},
                                                         {"eot", eot},
                                                         {"eom", eom}};
    const std::map<std::string, std::string> id_keys = {
        {"bos", "tokenizer.ggml.bos_token_id"},     {"eos", "tokenizer.ggml.eos_token_id"},
        {"unk", "tokenizer.ggml.unknown_token_id"}, {"sep", "tokenizer.ggml.seperator_token_id"},
        {"pad", "tokenizer.ggml.padding_token_id"}, {"cls", "tokenizer.ggml.cls_token_id"},
        {"mask", "tokenizer.ggml.mask_token_id"},   {"eot", "tokenizer.ggml.eot_token_id"},
        {"eom", "tokenizer.ggml.eom_token_id"}};

    // ---- write ----
    w.set_string("tokenizer.ggml.model", res.model);
    w.set_string("tokenizer.ggml.pre", res.pre);
    w.set("tokenizer.ggml.tokens", gguf::make_string_array(tokens));
    if (res.model == "llama") {
      // Minus the rank of the merge producing each token; tokens no merge produces score below all.
      std::vector<float> scores(n, -1e9f);
      StrMap<int64_t> id_of;
      for (int64_t i = 0; i < n; ++i) id_of.emplace(tokens[i], i);
      for (size_t r = 0; r < merged.size(); ++r) {
        auto it = id_of.find(merged[r]);
        if (it != id_of.end() && scores[it->second] == -1e9f) scores[it->second] = -static_cast<float>(r);
      }
      for (int64_t i = 0; i < n; ++i) {
        if (scores[i] == -1e9f) scores[i] = types[i] == static_cast<int32_t>(TokenType::NORMAL) ? -1e6f : 0.0f;
      }
      w.set("tokenizer.ggml.scores", gguf::make_f32_array(scores));
      if (!spm_adds_prefix(tj)) w.set_bool("tokenizer.ggml.add_space_prefix", false);
    }
    w.set("tokenizer.ggml.token_type", gguf::make_i32_array(types));
    if (res.model == "gpt2") w.set("tokenizer.ggml.merges", gguf::make_string_array(merges));
    for (const char* typ : {"bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot", "eom"}) {
      const std::string& c = contents.at(typ);
      if (c.empty()) continue;
      // Only added tokens are looked up, first match wins (as SpecialVocab does).
      for (const auto& [content, id] : added_list) {
        if (content == c) {
          if (id < n) w.set_u32(id_keys.at(typ), static_cast<uint32_t>(id));
          break;
        }
      }
    }
    for (const auto& [typ, on] : add_special) {
      if (typ == "bos" || typ == "eos" || typ == "sep") w.set_bool("tokenizer.ggml.add_" + typ + "_token", on);
    }
    // Normaliser flags (WordPiece).
    if (tj.contains("normalizer") && tj["normalizer"].is_object()) {
      std::optional<bool> lower, strip;
      const std::function<void(const json&)> walk = [&](const json& nrm) {
        const std::string type = nrm.value("type", "");
        if (type == "Lowercase") lower = true;
        if (type == "StripAccents") strip = true;
        if (type == "BertNormalizer") {
          if (nrm.contains("lowercase") && nrm["lowercase"].is_boolean()) lower = nrm["lowercase"].get<bool>();
          if (nrm.contains("strip_accents") && nrm["strip_accents"].is_boolean()) strip = nrm["strip_accents"].get<bool>();
        }
        if (type == "Sequence") {
          for (const auto& c : nrm.value("normalizers", json::array())) {
            if (c.is_object()) walk(c);
          }
        }
      };
      walk(tj["normalizer"]);
      if (lower) w.set_bool("tokenizer.ggml.normalizer.lowercase", *lower);
      if (strip) w.set_bool("tokenizer.ggml.normalizer.strip_accents", *strip);
    }
    // Chat template(s).
    std::optional<json> tmpl;
    if (cfg.is_object() && cfg.contains("chat_template")) {
      tmpl = cfg["chat_template"];
    } else if (opt.chat_template) {
      tmpl = json(*opt.chat_template);
    }
    if (tmpl && tmpl->is_string()) {
      w.set_string("tokenizer.chat_template", tmpl->get<std::string>());
    } else if (tmpl && tmpl->is_array()) {
      std::vector<std::string> names;
      for (const auto& t : *tmpl) {
        if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
        std::string name = t.value("name", "");
        for (auto& c : name) {
          if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
        }
        if (name.empty()) continue;
        if (name == "default") {
          w.set_string("tokenizer.chat_template", t["template"].get<std::string>());
        } else {
          w.set_string("tokenizer.chat_template." + name, t["template"].get<std::string>());
          names.push_back(name);
        }
      }
      if (!names.empty()) w.set("tokenizer.chat_templates", gguf::make_string_array(names));
    }
  } catch (const json::exception& e) {
    throw Error(std::string("unexpected structure in the tokenizer files: ") + e.what());
  }
  return res;
}

}  // namespace pg::tok
