// Pre-tokenizer regexes, run through PCRE2 (UTF + UCP, JIT). PCRE2 is used rather than hand-written
// splitters because the pre-tokenizers are many and each is a regex in the model's tokenizer.json:
// one well-tested engine with real Unicode properties reproduces them all, including lookaheads,
// and adding a pre-tokenizer is one table row instead of a new state machine.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace pg::tok {

namespace {

// Unicode White_Space, the set Rust's and Python's \s match. PCRE2's \s in UCP mode misses U+0085.
constexpr const char* kWhite =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Rewrites \s and \S (inside and outside character classes) to the explicit White_Space set.
std::string expand_whitespace(const std::string& re) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char n = re[i + 1];
      ++i;
      if (n == 's') {
        out += in_class ? std::string(kWhite) : "[" + std::string(kWhite) + "]";
      } else if (n == 'S') {
        PG_CHECK(!in_class, "pre-tokenizer regex uses \\S inside a class: " + re);
        out += "[^" + std::string(kWhite) + "]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct MatchData {
  pcre2_match_data* md = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  MatchData() {
    md = pcre2_match_data_create(8, nullptr);
    // Deep backtracking over long runs of one class needs more than the default 32 KiB JIT stack.
    stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchData() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
  }
};

MatchData& thread_match_data() {
  thread_local MatchData m;
  return m;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string source;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(const std::vector<std::string>& regexes) {
  for (const auto& src : regexes) {
    auto r = std::make_unique<Regex>();
    r->source = src;
    const std::string pat = expand_whitespace(src);
    int err = 0;
    PCRE2_SIZE off = 0;
    r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
    if (!r->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error("pre-tokenizer regex does not compile at offset " + std::to_string(off) + ": " +
                  reinterpret_cast<const char*>(msg) + ": " + src);
    }
    r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
    regexes_.push_back(std::move(r));
  }
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::pair<size_t, size_t>> PreTokenizer::split(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> pieces;
  if (text.empty()) return pieces;
  pieces.emplace_back(0, text.size());
  MatchData& m = thread_match_data();
  PG_CHECK(m.md != nullptr, "out of memory for regex match data");
  std::vector<std::pair<size_t, size_t>> next;
  for (const auto& re : regexes_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const auto& [a, b] : pieces) {
      // Each piece is matched as a subject of its own, so anchors and lookarounds stop at its edges.
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data() + a);
      const size_t len = b - a;
      size_t pos = 0, last = 0;
      while (pos <= len) {
        int rc;
        if (re->jit) {
          rc = pcre2_jit_match(re->code, subj, len, pos, PCRE2_NO_UTF_CHECK, m.md, m.ctx);
          if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            rc = pcre2_match(re->code, subj, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, m.md, nullptr);
          }
        } else {
          rc = pcre2_match(re->code, subj, len, pos, PCRE2_NO_UTF_CHECK, m.md, nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          throw Error(std::string("pre-tokenizer regex failed on the input: ") + reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {
          // Empty matches split nothing; step over one character.
          if (ms >= len) break;
          pos = ms + utf8_len_lax(static_cast<uint8_t>(text[a + ms]));
          continue;
        }
        if (ms > last) next.emplace_back(a + last, a + ms);
        next.emplace_back(a + ms, a + me);
        last = pos = me;
      }
      if (last < len) next.emplace_back(a + last, b);
    }
    pieces.swap(next);
  }
  return pieces;
}

// ---- the pre-tokenizers named by tokenizer.ggml.pre ------------------------------------------------
// Regexes are those of each model's tokenizer.json, in llama.cpp's form: case-insensitive groups
// such as (?i:'s|'t) spelled as explicit classes, so that Unicode case folding ('ſ', 'K') does not
// widen them.

namespace {

const std::string kContractions = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const std::string kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const std::string kLlama3 =
    kContractions + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string kQwen2 =
    kContractions + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string kQwen35 =
    kContractions +
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string kDeepseekLatin =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-"
    "\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}"
    "\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}"
    "\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-"
    "\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";
const std::string kPunctClass = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]";
const std::string kGpt4o = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + kContractions +
                           "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" + kContractions +
                           "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum class Kind {
  Default,
  Llama3,
  Dbrx,
  DeepseekLlm,
  DeepseekCoder,
  Deepseek3,
  Falcon,
  Starcoder,
  Gpt2,
  Qwen2,
  Qwen35,
  Poro,
  ChatGlm4,
  Viking,
  Tekken,
  Gpt4o,
  BailingMoe,
  SeedCoder,
  Grok2,
};

std::vector<std::string> regexes_of(Kind k) {
  switch (k) {
    case Kind::Default:
      return {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
    case Kind::Llama3:
    case Kind::Dbrx:
      return {kLlama3};
    case Kind::DeepseekLlm:
      return {"[\\r\\n]",
              kDeepseekLatin,
              "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
              "\\s+$",
              "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
              "\\p{N}+"};
    case Kind::DeepseekCoder:
      return {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}"};
    case Kind::Deepseek3:
      return {
          "\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
          kPunctClass +
              "[A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case Kind::Falcon:
      return {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"};
    case Kind::Starcoder:
      return {"\\p{N}", kGpt2};
    case Kind::Gpt2:
      return {kGpt2};
    case Kind::Qwen2:
      return {kQwen2};
    case Kind::Qwen35:
      return {kQwen35};
    case Kind::Poro:
      return {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"};
    case Kind::ChatGlm4:
      return {kLlama3};
    case Kind::Viking:
      return {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+", "\\p{N}"};
    case Kind::Tekken:
      return {
          "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+("
          "(?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case Kind::Gpt4o:
      return {kGpt4o};
    case Kind::BailingMoe:
      return {
          "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
          "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"};
    case Kind::SeedCoder:
      return {kContractions +
              "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case Kind::Grok2:
      return {kQwen2};
  }
  return {};
}

struct PreRow {
  const char* name;
  Kind kind;
  bool ignore_merges;
  bool clean_spaces;
  int add_bos;  // -1 keep default
  bool no_bos;
};

// Names and settings follow llama.cpp's llama_vocab::load.
constexpr PreRow kPreTable[] = {
    {"default", Kind::Default, false, true, -1, false},
    {"llama3", Kind::Llama3, true, true, 1, false},
    {"llama-v3", Kind::Llama3, true, true, 1, false},
    {"llama-bpe", Kind::Llama3, true, true, 1, false},
    {"falcon3", Kind::Llama3, true, true, 1, false},
    {"falcon-h1", Kind::Llama3, true, true, 1, false},
    {"pixtral", Kind::Llama3, true, true, 1, false},
    {"midm-2.0", Kind::Llama3, true, true, 1, false},
    {"lfm2", Kind::Llama3, true, true, 1, false},
    {"dbrx", Kind::Dbrx, false, true, -1, false},
    {"smaug-bpe", Kind::Dbrx, false, true, -1, false},
    {"deepseek-llm", Kind::DeepseekLlm, false, false, -1, false},
    {"deepseek-coder", Kind::DeepseekCoder, false, false, -1, false},
    {"deepseek-v3", Kind::Deepseek3, false, false, -1, false},
    {"hunyuan-dense", Kind::Deepseek3, false, false, -1, false},
    {"joyai-llm", Kind::Deepseek3, false, false, -1, false},
    {"falcon", Kind::Falcon, false, true, -1, false},
    {"starcoder", Kind::Starcoder, false, true, -1, false},
    {"refact", Kind::Starcoder, false, true, -1, false},
    {"codeshell", Kind::Starcoder, false, true, -1, false},
    {"exaone", Kind::Starcoder, false, true, -1, false},
    {"minerva-7b", Kind::Starcoder, false, true, -1, false},
    {"mellum2", Kind::Starcoder, false, true, -1, false},
    {"command-r", Kind::Starcoder, false, false, -1, false},
    {"smollm", Kind::Starcoder, false, false, -1, false},
    {"gpt-2", Kind::Gpt2, false, true, -1, false},
    {"mpt", Kind::Gpt2, false, true, -1, false},
    {"olmo", Kind::Gpt2, false, true, -1, false},
    {"jais", Kind::Gpt2, false, true, -1, false},
    {"phi-2", Kind::Gpt2, false, true, -1, false},
    {"jina-es", Kind::Gpt2, false, true, -1, false},
    {"jina-de", Kind::Gpt2, false, true, -1, false},
    {"jina-v2-es", Kind::Gpt2, false, true, -1, false},
    {"jina-v2-de", Kind::Gpt2, false, true, -1, false},
    {"gigachat", Kind::Gpt2, false, true, -1, false},
    {"a.x-4.0", Kind::Gpt2, false, true, -1, false},
    {"mellum", Kind::Gpt2, false, true, -1, false},
    {"modern-bert", Kind::Gpt2, false, true, -1, false},
    {"exaone4", Kind::Gpt2, false, true, -1, false},
    {"trillion", Kind::Gpt2, false, false, -1, false},
    {"granite-docling", Kind::Gpt2, false, false, -1, false},
    {"qwen2", Kind::Qwen2, false, false, -1, false},
    {"deepseek-r1-qwen", Kind::Qwen2, false, false, -1, false},
    {"kormo", Kind::Qwen2, false, false, -1, false},
    {"f2llmv2", Kind::Qwen2, false, false, -1, false},
    {"megrez", Kind::Qwen2, false, true, -1, false},
    {"stablelm2", Kind::Qwen2, false, true, -1, false},
    {"hunyuan", Kind::Qwen2, false, false, -1, false},
    {"solar-open", Kind::Qwen2, false, false, -1, false},
    {"qwen35", Kind::Qwen35, false, false, -1, false},
    {"poro-chat", Kind::Poro, false, false, -1, false},
    {"bloom", Kind::Poro, false, true, -1, false},
    {"gpt3-finnish", Kind::Poro, false, true, -1, false},
    {"chatglm-bpe", Kind::ChatGlm4, false, true, -1, true},
    {"glm4", Kind::ChatGlm4, false, true, -1, true},
    {"viking", Kind::Viking, false, false, -1, false},
    {"tekken", Kind::Tekken, true, false, 1, false},
    {"gpt-4o", Kind::Gpt4o, false, false, -1, false},
    {"llama4", Kind::Gpt4o, false, false, -1, false},
    {"kanana2", Kind::Gpt4o, false, false, -1, false},
    {"minimax-m2", Kind::Gpt4o, false, false, -1, false},
    {"bailingmoe", Kind::BailingMoe, false, false, -1, false},
    {"bailingmoe2", Kind::BailingMoe, false, false, -1, false},
    {"llada-moe", Kind::BailingMoe, false, false, -1, false},
    {"seed-coder", Kind::SeedCoder, false, false, -1, false},
    {"grok-2", Kind::Grok2, false, false, -1, false},
};

}  // namespace

PreConfig pre_config(const std::string& name) {
  for (const auto& row : kPreTable) {
    if (name == row.name) {
      PreConfig c;
      c.regexes = regexes_of(row.kind);
      c.ignore_merges = row.ignore_merges;
      c.clean_spaces = row.clean_spaces;
      c.add_bos = row.add_bos;
      c.no_bos = row.no_bos;
      return c;
    }
  }
  throw Error("unknown pre-tokenizer '" + name + "' (tokenizer.ggml.pre); known: " + [] {
    std::string s;
    for (const auto& n : known_pre_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }());
}

std::vector<std::string> known_pre_names() {
  std::vector<std::string> v;
  for (const auto& row : kPreTable) v.emplace_back(row.name);
  return v;
}

}  // namespace pg::tok
