// Fuzzing the output parsers: realistic outputs mutated at random, soups of markup fragments and random bytes, and
// adversarial inputs for running time. Whatever the input, the parsers must not throw or hang, must give the same message
// whatever the chunking, their deltas must add up to the message, everything must be valid UTF-8, and every tool call's
// arguments must be a JSON object.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "chat/parse/chat_format.h"
#include "chat/parse/output_parser.h"
#include "utf8_check.h"

namespace pg::chat {
namespace {

using json = nlohmann::ordered_json;

using pg::test::valid_utf8;

struct Outcome {
  ParsedMessage msg;
  bool deltas_ok = true;
  std::string why;
};

// Streams text cut at `cuts`, checking the deltas against the final message on the way.
Outcome stream(const ChatFormat& f, const ParserOptions& o, std::string_view text, const std::vector<size_t>& cuts) {
  Outcome out;
  OutputParser p(f, o);
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  auto take = [&](const Delta& d) {
    if (!valid_utf8(d.content) || !valid_utf8(d.reasoning_content)) out.deltas_ok = false, out.why = "delta not UTF-8";
    content += d.content;
    reasoning += d.reasoning_content;
    for (const auto& tc : d.tool_calls) {
      if (tc.index == calls.size()) {
        if (tc.id.empty() || tc.name.empty()) out.deltas_ok = false, out.why = "first call delta lacks id/name";
        calls.push_back({tc.id, tc.name, tc.arguments});
      } else if (tc.index < calls.size() && tc.id.empty() && tc.name.empty()) {
        calls[tc.index].arguments += tc.arguments;
      } else {
        out.deltas_ok = false, out.why = "call delta out of order";
      }
    }
  };
  size_t prev = 0;
  for (size_t c : cuts) {
    take(p.push(text.substr(prev, c - prev)));
    prev = c;
  }
  take(p.push(text.substr(prev)));
  take(p.finish());
  out.msg = p.message();
  if (content != out.msg.content) out.deltas_ok = false, out.why = "content deltas differ";
  if (reasoning != out.msg.reasoning_content) out.deltas_ok = false, out.why = "reasoning deltas differ";
  if (calls.size() != out.msg.tool_calls.size()) {
    out.deltas_ok = false, out.why = "call count differs";
  } else {
    for (size_t i = 0; i < calls.size(); ++i) {
      const auto& a = calls[i];
      const auto& b = out.msg.tool_calls[i];
      if (a.id != b.id || a.name != b.name || a.arguments != b.arguments) out.deltas_ok = false, out.why = "call deltas differ";
    }
  }
  return out;
}

std::string describe(const ParsedMessage& m) {
  json j = m.to_openai_json();
  j["errors"] = m.errors;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool same(const ParsedMessage& a, const ParsedMessage& b) {
  if (a.content != b.content || a.reasoning_content != b.reasoning_content || a.errors != b.errors) return false;
  if (a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].id != b.tool_calls[i].id || a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments) {
      return false;
    }
  }
  return true;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(ch);
    } else {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

// Checks everything for one input: message invariants, 1-byte streaming, `splits` random chunkings.
void check_input(const ChatFormat& f, const ParserOptions& o, const std::string& text, std::mt19937& rng, int splits) {
  const Outcome whole = stream(f, o, text, {});
  const std::string where = std::string(f.name()) + " input: " + printable(text);
  ASSERT_TRUE(whole.deltas_ok) << whole.why << "\n" << where;
  ASSERT_TRUE(valid_utf8(whole.msg.content) && valid_utf8(whole.msg.reasoning_content)) << where;
  for (const auto& tc : whole.msg.tool_calls) {
    const json a = json::parse(tc.arguments, nullptr, false);
    ASSERT_TRUE(a.is_object()) << "arguments not an object: " << printable(tc.arguments) << "\n" << where;
    ASSERT_TRUE(valid_utf8(tc.name) && !tc.name.empty()) << where;
    ASSERT_FALSE(tc.id.empty()) << where;
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const Outcome bytes = stream(f, o, text, every);
  ASSERT_TRUE(bytes.deltas_ok) << bytes.why << "\n" << where;
  ASSERT_TRUE(same(whole.msg, bytes.msg)) << "1-byte streaming differs\nwhole:  " << describe(whole.msg)
                                          << "\nbytes:  " << describe(bytes.msg) << "\n"
                                          << where;
  for (int k = 0; k < splits; ++k) {
    std::vector<size_t> cuts;
    const size_t max_piece = 1 + rng() % 16;
    for (size_t c = 1 + rng() % max_piece; c < text.size(); c += 1 + rng() % max_piece) cuts.push_back(c);
    const Outcome r = stream(f, o, text, cuts);
    ASSERT_TRUE(r.deltas_ok) << r.why << "\n" << where;
    ASSERT_TRUE(same(whole.msg, r.msg)) << "random chunking differs\nwhole:  " << describe(whole.msg)
                                        << "\nsplit:  " << describe(r.msg) << "\n"
                                        << where;
  }
}

json tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "location": {"type": "string"}, "days": {"type": "integer"}, "detailed": {"type": "boolean"},
      "options": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}}
  ])");
}

const std::string kDsCallsBegin = "<｜tool▁calls▁begin｜>";
const std::string kDsCallBegin = "<｜tool▁call▁begin｜>";
const std::string kDsSep = "<｜tool▁sep｜>";
const std::string kDsCallEnd = "<｜tool▁call▁end｜>";
const std::string kDsCallsEnd = "<｜tool▁calls▁end｜>";

struct FamilyCase {
  ChatFormat format;
  std::vector<std::string> outputs;    // realistic outputs
  std::vector<std::string> fragments;  // markup pieces for mutation and soups
};

std::vector<FamilyCase> family_cases() {
  std::vector<FamilyCase> cases;
  const std::vector<std::string> json_bits = {"{",
                                              "}",
                                              "[",
                                              "]",
                                              ",",
                                              ":",
                                              "\"",
                                              "\"name\"",
                                              "\"arguments\"",
                                              "\"parameters\"",
                                              "\"get_time\"",
                                              "\\",
                                              "\\u00e9",
                                              "\\ud83d",
                                              "1",
                                              "-",
                                              ".5e",
                                              "true",
                                              "null",
                                              "\n",
                                              " ",
                                              "é",
                                              "\xF0\x9F\x98",
                                              "\xFF",
                                              "\xC3"};
  {
    FamilyCase c{ChatFormat::of(ChatFamily::kHermes), {}, {}};
    c.outputs = {
        "<think>\nLet me think.\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
        "\"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_call>",
        "Plain answer with <b>html</b> and a { brace.",
        "<tool_call>[{\"name\": \"get_time\", \"arguments\": {\"city\": \"A\\\"B\"}}, {\"arguments\": {}, \"name\": "
        "\"x\"}]</tool_call>",
    };
    c.fragments = {"<tool_call>",         "</tool_call>",     "<think>",      "</think>",
                   "<function=get_time>", "<parameter=city>", "</parameter>", "</function>"};
    cases.push_back(c);
  }
  {
    FamilyCase c{ChatFormat::of(ChatFamily::kQwen3Coder), {}, {}};
    c.outputs = {
        "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nNew York\n</parameter>\n<parameter=days>\n"
        "2\n</parameter>\n<parameter=options>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_time>\n<parameter=city>\nline1\n\nline2 <x> </para\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=get_time>\n<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>",
        "<function=get_time>\n<parameter=city>\nLima\n</parameter>\n</function>",
    };
    c.fragments = {"<tool_call>",
                   "</tool_call>",
                   "<function=get_time>",
                   "<function=",
                   "<parameter=city>",
                   "<parameter=days>",
                   "</parameter>",
                   "</function>",
                   "<think>",
                   "</think>",
                   ">"};
    cases.push_back(c);
  }
  {
    FamilyCase c{ChatFormat::of(ChatFamily::kLlama3), {}, {}};
    c.outputs = {
        "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
        "<|python_tag|>brave_search.call(query=\"a, (b)\", n=2)",
        "<|python_tag|>print('hi')\nx = {\"a\": 1}",
        "{\"name\": \"get_time\", \"parameters\": {\"city\": \"A\"}}; {\"name\": \"get_time\", \"parameters\": {\"city\": "
        "\"B\"}}",
        "{\"name\": \"Bob\"} is a JSON answer",
    };
    c.fragments = {"<|python_tag|>", ".call(", ")", "=", "'", "{\"name\": \"get_time\", \"parameters\": ", ";"};
    cases.push_back(c);
  }
  {
    FamilyCase c{ChatFormat::of(ChatFamily::kMistral), {}, {}};
    c.outputs = {
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}, \"id\": \"abc123def\"}, "
        "{\"name\": \"get_time\", \"arguments\": {}}]",
        "[THINK]Hmm [TOOL_CALLS] maybe[/THINK]Text[TOOL_CALLS]get_time[ARGS]{\"city\": \"A\"}[TOOL_CALLS]get_time[CALL_ID]"
        "123456789[ARGS]{\"city\": \"B\"}",
    };
    c.fragments = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]", "get_time"};
    cases.push_back(c);
  }
  {
    FamilyCase c{ChatFormat::of(ChatFamily::kDeepSeek), {}, {}};
    c.outputs = {
        "<think>\nR\n</think>\n\n" + kDsCallsBegin + kDsCallBegin + "function" + kDsSep +
            "get_weather\n```json\n{\"location\": "
            "\"Paris\"}\n```" +
            kDsCallEnd + "\n" + kDsCallBegin + "function" + kDsSep + "get_time\n```json\n{}\n```" + kDsCallEnd + kDsCallsEnd,
        "Text" + kDsCallsBegin + kDsCallBegin + "get_time" + kDsSep + "{\"city\": \"Paris\"}" + kDsCallEnd + kDsCallsEnd,
    };
    c.fragments = {kDsCallsBegin,
                   kDsCallBegin,
                   kDsSep,
                   kDsCallEnd,
                   kDsCallsEnd,
                   "```json\n",
                   "```",
                   "function",
                   "<think>",
                   "</think>",
                   "<｜tool_calls_begin｜>",
                   "｜",
                   "▁"};
    cases.push_back(c);
  }
  {
    FamilyCase c{ChatFormat::of(ChatFamily::kGptOss), {}, {}};
    c.outputs = {
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>Pre.<|end|><|start|>"
        "assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"location\": \"Tokyo\"}<|call|>",
        "<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>Answer <b>.<|return|>",
        " to=functions.get_time<|channel|>commentary<|message|>{\"city\": \"X\"}",
    };
    c.fragments = {"<|start|>",  "assistant",     "<|channel|>", "analysis",    "final",   "commentary", " to=functions.get_time",
                   " to=python", "<|constrain|>", "json",        "<|message|>", "<|end|>", "<|call|>",   "<|return|>"};
    cases.push_back(c);
  }
  {
    FamilyCase c{ChatFormat::of(ChatFamily::kContentOnly), {}, {}};
    c.format.think_open = "<think>";
    c.format.think_close = "</think>";
    c.outputs = {"<think>a</think>b", "plain"};
    c.fragments = {"<think>", "</think>"};
    cases.push_back(c);
  }
  for (auto& c : cases) c.fragments.insert(c.fragments.end(), json_bits.begin(), json_bits.end());
  return cases;
}

std::vector<ParserOptions> option_sets() {
  std::vector<ParserOptions> v;
  for (int k = 0; k < 5; ++k) {
    ParserOptions o;
    o.id_seed = 7;
    o.tools = tools();
    if (k == 1) o.starts_in_reasoning = true;
    if (k == 2) o.reasoning = false;
    if (k == 3) o.parse_tool_calls = false;
    if (k == 4) o.tools = json::array();
    v.push_back(o);
  }
  return v;
}

std::string mutate(const std::string& s, const std::vector<std::string>& fragments, std::mt19937& rng) {
  std::string t = s;
  const int edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    const size_t at = t.empty() ? 0 : rng() % (t.size() + 1);
    switch (rng() % 5) {
      case 0:  // truncate (generation stopped by a token limit)
        t.resize(at);
        break;
      case 1: {  // delete a range
        const size_t n = std::min<size_t>(1 + rng() % 8, t.size() - std::min(at, t.size()));
        t.erase(std::min(at, t.size()), n);
        break;
      }
      case 2:  // insert markup
        t.insert(at, fragments[rng() % fragments.size()]);
        break;
      case 3:  // insert a random byte
        t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), static_cast<char>(rng() & 0xFF));
        break;
      case 4:  // duplicate a slice
        if (!t.empty()) {
          const size_t from = rng() % t.size();
          t.insert(at, t.substr(from, 1 + rng() % 20));
        }
        break;
    }
  }
  return t;
}

TEST(ChatParseFuzz, MutatedRealisticOutputs) {
  std::mt19937 rng(1234);
  const auto cases = family_cases();
  const auto opts = option_sets();
  int inputs = 0;
  for (const auto& c : cases) {
    for (const auto& o : opts) {
      for (const auto& out : c.outputs) {
        check_input(c.format, o, out, rng, 4);
        if (HasFatalFailure()) return;
        for (int m = 0; m < 40; ++m) {
          check_input(c.format, o, mutate(out, c.fragments, rng), rng, 2);
          if (HasFatalFailure()) return;
          ++inputs;
        }
      }
    }
  }
  EXPECT_GT(inputs, 3000);
}

TEST(ChatParseFuzz, FragmentSoup) {
  // Random sequences of every family's markup, JSON pieces and random bytes, through every family's parser.
  std::mt19937 rng(99);
  const auto cases = family_cases();
  std::vector<std::string> all;
  for (const auto& c : cases) all.insert(all.end(), c.fragments.begin(), c.fragments.end());
  const auto opts = option_sets();
  for (const auto& c : cases) {
    for (int n = 0; n < 250; ++n) {
      std::string text;
      const int parts = static_cast<int>(rng() % 40);
      for (int k = 0; k < parts; ++k) {
        const unsigned r = rng() % 10;
        if (r < 5) {
          text += c.fragments[rng() % c.fragments.size()];
        } else if (r < 7) {
          text += all[rng() % all.size()];
        } else if (r < 9) {
          text += "abc xyz"[rng() % 7];
        } else {
          text.push_back(static_cast<char>(rng() & 0xFF));
        }
      }
      check_input(c.format, opts[rng() % opts.size()], text, rng, 2);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(ChatParseFuzz, RandomBytes) {
  std::mt19937 rng(7);
  const auto cases = family_cases();
  const auto opts = option_sets();
  for (const auto& c : cases) {
    for (int n = 0; n < 150; ++n) {
      std::string text(rng() % 300, '\0');
      for (auto& ch : text) ch = static_cast<char>(rng() & 0xFF);
      check_input(c.format, opts[rng() % opts.size()], text, rng, 1);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(ChatParseFuzz, AdversarialInputsRunInLinearTime) {
  // Each input is ~200 KB, streamed one byte at a time; anything quadratic would take minutes.
  const size_t n = 200000;
  auto rep = [&](const std::string& unit) {
    std::string s;
    while (s.size() < n) s += unit;
    return s;
  };
  std::vector<std::pair<ChatFormat, std::string>> inputs;
  const auto cases = family_cases();
  for (const auto& c : cases) {
    inputs.push_back({c.format, rep("<")});
    inputs.push_back({c.format, rep("<tool_call")});
    inputs.push_back({c.format, std::string(n, ' ')});
    inputs.push_back({c.format, "<think>" + rep("thinking <thi </thin ")});
  }
  const ChatFormat hermes = ChatFormat::of(ChatFamily::kHermes);
  const ChatFormat coder = ChatFormat::of(ChatFamily::kQwen3Coder);
  const ChatFormat llama = ChatFormat::of(ChatFamily::kLlama3);
  const ChatFormat mistral = ChatFormat::of(ChatFamily::kMistral);
  const ChatFormat ds = ChatFormat::of(ChatFamily::kDeepSeek);
  const ChatFormat oss = ChatFormat::of(ChatFamily::kGptOss);
  inputs.push_back(
      {hermes, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"" + rep("ab\\n\\u00e9 ") + "\"}}"});
  inputs.push_back({hermes, "<tool_call>\n{\"arguments\": {\"a\": \"" + rep("xy") + "\"}, \"name\": \"f\"}</tool_call>"});
  inputs.push_back({hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": " + rep("[")});
  inputs.push_back({hermes, "<tool_call>" + rep(" ")});
  inputs.push_back({coder, "<tool_call>\n<function=get_weather>\n<parameter=options>\n" + rep("{\"a\": <b> \n")});
  inputs.push_back({coder, "<tool_call>\n<function=get_time>\n<parameter=city>\n" + rep("x\n</param\n")});
  inputs.push_back({coder, "<tool_call>\n<function=get_time>\n" + rep("junk<")});
  inputs.push_back({llama, "<|python_tag|>search.call(q=\"" + rep("(a)")});
  inputs.push_back({llama, "<|python_tag|>" + rep("print(1)\n")});
  inputs.push_back({llama, "{\"name\": \"get_time\", \"parameters\": {\"x\": \"" + rep("zz")});
  inputs.push_back({mistral, "[TOOL_CALLS][" + rep("{\"name\": \"get_time\", \"arguments\": {}}, ")});
  inputs.push_back({mistral, rep("[TOOL_CALLS]")});
  inputs.push_back({ds, rep(kDsCallsBegin + kDsCallBegin)});
  inputs.push_back({ds, kDsCallsBegin + kDsCallBegin + "function" + kDsSep + "f\n```json\n{\"a\": \"" + rep("q")});
  inputs.push_back({oss, rep("<|channel|>analysis")});
  inputs.push_back({oss, rep("<|start|>assistant<|channel|>final<|message|>hi<|end|>")});
  inputs.push_back({oss, "<|channel|>analysis<|message|>" + rep("a <|en")});

  ParserOptions o;
  o.tools = tools();
  o.id_seed = 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [f, text] : inputs) {
    const auto t1 = std::chrono::steady_clock::now();
    OutputParser p(f, o);
    for (char ch : text) p.push(std::string_view(&ch, 1));
    p.finish();
    const ParsedMessage whole = parse_output(f, text, o);
    EXPECT_TRUE(same(p.message(), whole)) << f.name() << ": " << printable(text.substr(0, 60));
    for (const auto& tc : whole.tool_calls) EXPECT_TRUE(json::parse(tc.arguments, nullptr, false).is_object());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    EXPECT_LT(secs, 10.0) << f.name() << ": " << printable(text.substr(0, 60));
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(total, 60.0);
}

}  // namespace
}  // namespace pg::chat
