// Special tokens, end-of-generation sets, detokenization, streaming, errors and speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "core/error.h"
#include "testutil.h"
#include "tok_testutil.h"

namespace pg::test {
namespace {

using tok::Tokenizer;

const Tokenizer& llama3() { return cached_vocab("testdata/tokenizer/ggml-vocab-llama3.gguf"); }
const Tokenizer& qwen3() { return cached_vocab("testdata/tokenizer/ggml-vocab-qwen3.gguf"); }
const Tokenizer& gpt2() { return cached_vocab("testdata/tokenizer/ggml-vocab-gpt-2.gguf"); }
const Tokenizer& stories() { return cached_vocab("testdata/models/stories260K.gguf"); }
const Tokenizer& llama_spm() { return cached_vocab("testdata/tokenizer/ggml-vocab-llama-spm.gguf"); }

// The id whose piece is the single byte b (byte-level BPE has one for every byte).
int32_t byte_token(const Tokenizer& t, uint8_t b) {
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    if (t.token_to_piece(id) == std::string(1, static_cast<char>(b))) return id;
  }
  ADD_FAILURE() << "no token for byte " << int(b);
  return 0;
}

std::vector<int32_t> enc(const Tokenizer& t, const std::string& s, bool add_special = false, bool parse_special = false) {
  return t.encode(s, add_special, parse_special);
}

TEST(Special, Llama3BosAndControlParsing) {
  const auto& t = llama3();
  EXPECT_EQ(t.bos(), 128000);
  EXPECT_EQ(t.eos(), 128001);
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.pre_name(), "llama-bpe");
  const auto with_bos = enc(t, "Hello", true);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 128000);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), enc(t, "Hello"));

  const std::string text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
  const auto parsed = enc(t, text, false, true);
  ASSERT_GE(parsed.size(), 4u);
  EXPECT_EQ(parsed[0], t.text_to_token("<|start_header_id|>"));
  EXPECT_EQ(parsed.back(), t.text_to_token("<|eot_id|>"));
  // Without parse_special the same text is plain text: no control token appears.
  for (int32_t id : enc(t, text)) EXPECT_FALSE(t.is_control(id)) << id;
  EXPECT_EQ(t.decode(enc(t, text), false, false), text);
  // Control tokens render only when asked.
  EXPECT_EQ(t.decode(parsed, /*special=*/true, false), text);
  EXPECT_EQ(t.decode(parsed, /*special=*/false, false), "user\n\nhi");
}

TEST(Special, Llama3EndOfGeneration) {
  const auto& t = llama3();
  for (const char* s : {"<|end_of_text|>", "<|eot_id|>"}) {
    EXPECT_TRUE(t.is_eog(t.text_to_token(s))) << s;
  }
  EXPECT_FALSE(t.is_eog(t.bos()));
  EXPECT_FALSE(t.is_eog(t.text_to_token("<|start_header_id|>")));
  EXPECT_EQ(t.eot(), t.text_to_token("<|eot_id|>"));
  // This is the original Llama 3 vocabulary: <|eom_id|> came with 3.1.
  EXPECT_EQ(t.text_to_token("<|eom_id|>"), tok::kNoToken);
  EXPECT_EQ(t.special().eom, tok::kNoToken);
  EXPECT_EQ(t.eog_ids(), (std::vector<int32_t>{128001, 128009}));
  EXPECT_EQ(t.nl(), t.text_to_token("\xC4\x8A"));  // "Ċ", byte 0x0A
}

TEST(Special, Qwen3) {
  const auto& t = qwen3();
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(enc(t, "hi", true), enc(t, "hi", false));  // add_bos_token = false
  const int32_t im_end = t.text_to_token("<|im_end|>"), eot = t.text_to_token("<|endoftext|>");
  EXPECT_EQ(t.eos(), im_end);
  EXPECT_TRUE(t.is_eog(im_end));
  EXPECT_TRUE(t.is_eog(eot));
  EXPECT_TRUE(t.is_eog(t.text_to_token("<|fim_pad|>")));
  EXPECT_TRUE(t.is_eog(t.text_to_token("<|repo_name|>")));
  EXPECT_TRUE(t.is_eog(t.text_to_token("<|file_sep|>")));
  EXPECT_FALSE(t.is_eog(t.text_to_token("<|im_start|>")));
  EXPECT_FALSE(t.is_eog(t.text_to_token("<think>")));
  // The regular token </s> is made an end-of-generation control token, as llama.cpp does.
  const int32_t s = t.text_to_token("</s>");
  EXPECT_TRUE(t.is_eog(s));
  EXPECT_TRUE(t.is_control(s));
  EXPECT_TRUE(std::is_sorted(t.eog_ids().begin(), t.eog_ids().end()));
  // User-defined tokens are matched even when special text is not parsed; control tokens are not.
  EXPECT_EQ(enc(t, "<think>"), std::vector<int32_t>{t.text_to_token("<think>")});
  EXPECT_EQ(enc(t, "<|im_start|>", false, true), std::vector<int32_t>{t.text_to_token("<|im_start|>")});
  EXPECT_GT(enc(t, "<|im_start|>", false, false).size(), 1u);
  // Unused padding entries render as nothing.
  EXPECT_EQ(t.token_to_piece(t.n_vocab() - 1, true), "");
}

TEST(Special, GoldenChatMarkersParsedOnRequest) {
  const auto& t = qwen3();
  const std::string chat = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
  const auto ids = enc(t, chat, false, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), t.text_to_token("<|im_start|>")), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), t.text_to_token("<|im_end|>")), 1);
  EXPECT_EQ(t.decode(ids, true), chat);
}

TEST(Spm, StoriesPromptAndLeadingSpace) {
  const auto& t = stories();
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  EXPECT_EQ(enc(t, "Once upon a time", true), ids);
  EXPECT_TRUE(t.add_bos());
  EXPECT_TRUE(t.add_space_prefix());
  // The BOS piece is empty without special, so the dummy prefix space stays (as in llama.cpp).
  EXPECT_EQ(t.decode(ids), " Once upon a time");
  EXPECT_EQ(t.decode(ids, true), "<s> Once upon a time");
  // Without BOS the first token's prefix space is removed.
  EXPECT_EQ(t.decode(std::vector<int32_t>(ids.begin() + 1, ids.end())), "Once upon a time");
  EXPECT_EQ(t.token_to_piece(403), " Once");
  EXPECT_EQ(t.token_to_piece(1, false), "");
  EXPECT_EQ(t.token_to_piece(1, true), "<s>");
  EXPECT_EQ(t.nl(), 13);
  EXPECT_EQ(t.token_to_piece(13), "\n");
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_FALSE(t.is_eog(1));
  // 0xFFFFFFFF in the file means "none": the defaults stay out of range -> no token.
  EXPECT_EQ(t.special().sep, tok::kNoToken);
}

TEST(Spm, ByteFallbackRoundTrip) {
  const auto& t = llama_spm();
  const std::string s = "naïve 日本語 🦙\x01";
  const auto ids = enc(t, s);
  EXPECT_EQ(t.decode(ids), s);
}

TEST(Decode, CleanUpSpaces) {
  const auto& t = gpt2();
  EXPECT_TRUE(t.clean_spaces());
  const std::string s = "Hello , world ! it 's a ' test ' , they 're here .";
  const auto ids = enc(t, s);
  EXPECT_EQ(t.decode(ids, false, /*clean_spaces=*/false), s);
  EXPECT_EQ(t.decode(ids), "Hello, world! it's a'test ', they're here.");
  EXPECT_FALSE(qwen3().clean_spaces());
}

TEST(Decode, InvalidBytesBecomeReplacementCharacters) {
  const auto& t = qwen3();
  // "a" then the first three bytes of U+1F642 as byte tokens: an unfinished character.
  const std::vector<int32_t> ids = {t.text_to_token("a"), byte_token(t, 0xF0), byte_token(t, 0x9F), byte_token(t, 0x99)};
  const std::string raw = t.decode(ids);
  EXPECT_FALSE(tok::utf8_is_valid(raw));
  EXPECT_EQ(t.detokenize(ids), "a\xEF\xBF\xBD");
}

TEST(Utf8, SanitizeMaximalSubparts) {
  EXPECT_EQ(tok::utf8_sanitize("abc"), "abc");
  EXPECT_EQ(tok::utf8_sanitize("\x80"), "\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_sanitize("\xE6\x97"), "\xEF\xBF\xBD");  // truncated 3-byte
  EXPECT_EQ(tok::utf8_sanitize("\xE6\x97"
                               "A"),
            "\xEF\xBF\xBD"
            "A");                                                                                         // broken off
  EXPECT_EQ(tok::utf8_sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                                  // overlong: 2 subparts
  EXPECT_EQ(tok::utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");                  // surrogate
  EXPECT_EQ(tok::utf8_sanitize("\xF4\x90\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // > U+10FFFF
  EXPECT_TRUE(tok::utf8_is_valid("\xF0\x9F\xA6\x99 caf\xC3\xA9"));
  EXPECT_FALSE(tok::utf8_is_valid("caf\xC3"));
}

TEST(Stream, HoldsBackUnfinishedCharacters) {
  const auto& t = qwen3();
  const std::vector<int32_t> ids = {byte_token(t, 0xF0), byte_token(t, 0x9F), byte_token(t, 0x99), byte_token(t, 0x82),
                                    t.text_to_token("!")};  // U+1F642 byte by byte, then "!"
  tok::Detokenizer d(t);
  std::string all;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string out = d.push(ids[i]);
    EXPECT_TRUE(tok::utf8_is_valid(out));
    EXPECT_EQ(out.empty(), i < 3) << i;  // nothing until the fourth byte completes the character
    all += out;
  }
  all += d.finish();
  EXPECT_EQ(all, "\xF0\x9F\x99\x82!");
  // An unfinished character at the end becomes U+FFFD only at finish().
  tok::Detokenizer d2(t);
  EXPECT_EQ(d2.push(ids[0]), "");
  EXPECT_EQ(d2.finish(), "\xEF\xBF\xBD");
}

TEST(Stream, SpmLeadingSpaceAndCleanup) {
  tok::Detokenizer d(stories());
  std::string s;
  for (int32_t id : {403, 407, 261, 378}) s += d.push(id);
  s += d.finish();
  EXPECT_EQ(s, "Once upon a time");
  // Generation continuing a prompt keeps the first piece's space, also after finish().
  tok::Detokenizer c(stories());
  c.continuation();
  for (int round = 0; round < 2; ++round) {
    std::string g = c.push(432);  // ","
    g += c.push(383);             // " there"
    g += c.finish();
    EXPECT_EQ(g, ", there");
    EXPECT_EQ(c.push(403) + c.finish(), " Once");
  }
  const auto& g = gpt2();
  const auto ids = enc(g, "Hi , you 're here !");
  tok::Detokenizer dg(g);
  std::string o;
  for (int32_t id : ids) o += dg.push(id);
  o += dg.finish();
  EXPECT_EQ(o, g.decode(ids));
  EXPECT_EQ(o, "Hi, you're here!");
}

TEST(Errors, UnknownPreTokenizerIsNamed) {
  try {
    tok::LoadOptions opt;
    opt.pre_override = "no-such-pre";
    load_vocab(shared_path("testdata/tokenizer/ggml-vocab-gpt-2.gguf"), opt);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'no-such-pre'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pre-tokenizer"), std::string::npos) << e.what();
  }
}

TEST(Errors, OutOfRangeIds) {
  const auto& t = stories();
  EXPECT_THROW(t.token_to_piece(512), Error);
  EXPECT_THROW(t.token_to_piece(-1), Error);
  const std::vector<int32_t> bad = {1, 100000};
  EXPECT_THROW(t.decode(bad), Error);
  tok::Detokenizer d(t);
  EXPECT_THROW(d.push(-5), Error);
}

TEST(Errors, FileWithoutTokenizer) {
  // A GGUF with no tokenizer keys: build the smallest valid one in memory (header, 0 tensors, 1 KV).
  std::vector<uint8_t> b;
  const auto u32 = [&](uint32_t x) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  const auto u64 = [&](uint64_t x) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  const auto str = [&](const std::string& s) {
    u64(s.size());
    for (char c : s) b.push_back(static_cast<uint8_t>(c));
  };
  for (char c : std::string("GGUF")) b.push_back(static_cast<uint8_t>(c));
  u32(3);
  u64(0);
  u64(1);
  str("general.architecture");
  u32(8);
  str("llama");
  auto f = gguf::File::from_memory(b, "notok.gguf");
  EXPECT_THROW(tok::Tokenizer::from_gguf(*f), Error);
}

std::string random_words(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  static const std::vector<std::string> extra = {"café", "naïve", "日本語",  "🦙", "Привет", "σοφία", "x²", "  ", "\n",
                                                 "\t",   "'s",    "3.14159", "—",    "==",     "{",     "}",  "()"};
  std::string s;
  while (s.size() < bytes) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 7) {
      const int len = 1 + static_cast<int>(rng() % 10);
      for (int i = 0; i < len; ++i) s += static_cast<char>('a' + rng() % 26);
    } else if (kind == 7) {
      s += std::to_string(rng() % 100000);
    } else {
      s += extra[rng() % extra.size()];
    }
    s += (rng() % 12 == 0) ? ". " : " ";
  }
  return s;
}

TEST(Speed, HundredKilobytesWellUnderASecond) {
  const std::string text = random_words(100 * 1024, 7);
  for (const Tokenizer* t : {&llama3(), &qwen3(), &stories()}) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = t->encode(text, false, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ speed    ] %s/%s: %zu bytes -> %zu tokens in %.3f s\n", t->model_name().c_str(), t->pre_name().c_str(),
                text.size(), ids.size(), s);
    EXPECT_LT(s, 1.0);
    EXPECT_EQ(t->decode(ids, false, false), text);
  }
}

}  // namespace
}  // namespace pg::test
