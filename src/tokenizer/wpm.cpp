// WordPiece (tokenizer.ggml.model = "bert"): BERT normalisation (drop control characters, optional
// accent stripping through canonical decomposition, optional lowercasing), splitting on whitespace,
// punctuation and CJK ideographs, then greedy longest-match pieces. llama.cpp's converter stores
// word-initial pieces with a U+2581 prefix and continuation pieces bare (no "##"), so each word is
// matched with that prefix prepended.
#include <algorithm>

#include "tokenizer/impl.h"

namespace pg::tok {

namespace uni {
namespace {
struct CategoryRun {
  uint32_t start;
  uint8_t cls;
};
struct CodePair {
  uint32_t cp, mapped;
};
struct DecompEntry {
  uint32_t cp;
  uint32_t offset;
  uint32_t length;
};
#include "tokenizer/unicode_tables.inc"

constexpr uint32_t kHangulBase = 0xAC00, kHangulCount = 11172;
}  // namespace

uint8_t category(uint32_t cp) {
  const auto* end = std::end(kCategoryRuns);
  const auto* it =
      std::upper_bound(std::begin(kCategoryRuns), end, cp, [](uint32_t c, const CategoryRun& r) { return c < r.start; });
  return it == std::begin(kCategoryRuns) ? 0 : (it - 1)->cls;
}

bool is_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint32_t to_lower(uint32_t cp) {
  const auto* it =
      std::lower_bound(std::begin(kLower), std::end(kLower), cp, [](const CodePair& p, uint32_t c) { return p.cp < c; });
  return it != std::end(kLower) && it->cp == cp ? it->mapped : cp;
}

void decompose(uint32_t cp, std::u32string& out) {
  if (cp >= kHangulBase && cp < kHangulBase + kHangulCount) {
    // Hangul syllables decompose algorithmically into leading consonant, vowel and optional final.
    const uint32_t s = cp - kHangulBase;
    out += static_cast<char32_t>(0x1100 + s / (21 * 28));
    out += static_cast<char32_t>(0x1161 + (s % (21 * 28)) / 28);
    if (s % 28) out += static_cast<char32_t>(0x11A7 + s % 28);
    return;
  }
  const auto* it =
      std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp, [](const DecompEntry& e, uint32_t c) { return e.cp < c; });
  if (it == std::end(kDecomp) || it->cp != cp) {
    out += static_cast<char32_t>(cp);
    return;
  }
  for (uint32_t k = 0; k < it->length; ++k) out += static_cast<char32_t>(kDecompFlat[it->offset + k]);
}
}  // namespace uni

namespace {
bool is_cjk(uint32_t cp) {
  // The ranges BERT's tokenizer treats as CJK ideographs (Hugging Face's list, including its
  // 0x2B920 lower bound).
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}
}  // namespace

void Tokenizer::Impl::wpm_encode(std::string_view raw, std::vector<int32_t>& out) const {
  const std::string text = utf8_is_valid(raw) ? std::string(raw) : utf8_sanitize(raw);
  std::vector<std::string> words(1);
  std::u32string cps;
  for (size_t i = 0; i < text.size();) {
    const uint32_t c0 = utf8_next(text, i);
    cps.clear();
    if (wpm_strip_accents) {
      uni::decompose(c0, cps);
    } else {
      cps += static_cast<char32_t>(c0);
    }
    for (char32_t cc : cps) {
      const uint32_t cp = static_cast<uint32_t>(cc);
      if (uni::is_whitespace(cp)) {
        if (!words.back().empty()) words.emplace_back();
        continue;
      }
      const uint8_t cat = uni::category(cp);
      if (cp == 0 || cp == 0xFFFD || (cat & uni::kControl)) continue;
      if (wpm_strip_accents && (cat & uni::kNonspacing)) continue;
      std::string s;
      utf8_append(s, wpm_lowercase ? uni::to_lower(cp) : cp);
      if ((cat & uni::kPunct) || (cp < 0x7F && (cat & uni::kSymbol)) || is_cjk(cp)) {
        if (!words.back().empty()) words.emplace_back();
        words.back() = std::move(s);
        words.emplace_back();
      } else {
        words.back() += s;
      }
    }
  }
  for (const std::string& word : words) {
    if (word.empty()) continue;
    const std::string w = "\xE2\x96\x81" + word;
    const size_t n = w.size();
    const size_t before = out.size();
    for (size_t i = 0; i < n;) {
      bool found = false;
      for (size_t j = std::min(n, i + max_token_len + 1); j > i; --j) {
        auto it = text_to_id.find(std::string_view(w).substr(i, j - i));
        if (it != text_to_id.end()) {
          out.push_back(it->second);
          i = j;
          found = true;
          break;
        }
      }
      if (!found) {
        out.resize(before);  // a word that cannot be covered becomes a single unknown token
        break;
      }
    }
    if (out.size() == before && sp.unk != kNoToken) out.push_back(sp.unk);
  }
}

}  // namespace pg::tok
