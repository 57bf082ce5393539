// libFuzzer target for src/grammar. Input: one mode byte, then the text.
//   mode even: the text is GBNF; mode odd: the text is a JSON Schema (converted, then parsed).
// A grammar that compiles is driven through the matcher: a sampled sentence must be accepted, the
// trailing bytes of the input are fed as further bytes, and at each of a few states the fast mask
// must equal the brute-force mask over a small vocabulary (single bytes, multi-byte pieces, an EOG
// token). Every failure must be a pg::Error; crashes, hangs and mask mismatches are findings.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>

#include "core/error.h"
#include "grammar/grammar.h"

using namespace pg::grammar;

namespace {

const std::shared_ptr<const Vocab>& vocab() {
  static std::shared_ptr<const Vocab> v = [] {
    std::vector<std::string> p;
    for (int b = 0; b < 256; ++b) p.push_back(std::string(1, static_cast<char>(b)));
    for (const char* s : {"\"", "\":", "\",\"", "{\"", "\"}", "true", "null", "12", "ab", " \"", "\n  ", "\xC3\xA9", "\xC3", "a\"b", "},{"})
      p.push_back(s);
    p.push_back("");  // EOG
    std::vector<bool> eog(p.size(), false);
    eog.back() = true;
    return Vocab::build(p, eog);
  }();
  return v;
}

void check_mask(const Matcher& m) {
  TokenMask fast, brute;
  m.allowed_tokens(fast);
  m.allowed_tokens_brute(brute);
  if (fast != brute) {
    std::fprintf(stderr, "mask mismatch\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool schema = data[0] & 1;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  Limits lim;
  lim.max_elements = 1 << 16;  // keep each input fast under the sanitizers
  lim.max_stacks = 256;
  lim.max_repetition = 1000;
  try {
    std::string gbnf = schema ? json_schema_to_gbnf(text) : text;
    auto g = Grammar::parse(gbnf, lim);
    Matcher m(g, vocab());
    check_mask(m);
    std::mt19937_64 rng(size);
    std::string s;
    if (g->sample(rng, s, 6, 4096)) {
      Matcher a = m.clone();
      for (size_t i = 0; i < s.size(); ++i) {
        if (!a.accept_bytes(s.substr(i, 1))) {
          std::fprintf(stderr, "sampled sentence rejected\n");
          std::abort();
        }
        if (i % 7 == 0) check_mask(a);
      }
      if (!a.can_end()) {
        std::fprintf(stderr, "sampled sentence cannot end\n");
        std::abort();
      }
    }
    // Arbitrary bytes: the input's own tail, token by token.
    size_t fed = 0;
    for (size_t i = text.size() > 64 ? text.size() - 64 : 0; i < text.size() && fed < 64; ++i, ++fed) {
      int32_t t = static_cast<uint8_t>(text[i]);
      m.accept_token(t);
      if (fed % 8 == 0) check_mask(m);
    }
  } catch (const pg::Error&) {
  }
  return 0;
}
