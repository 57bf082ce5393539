// Constrained sampling through the engine's scheduler on real models: outputs of real schemas
// validate against them (python3-jsonschema, an independent validator), greedy constrained output
// with speculation equals the output without, and reasoning budgets close the block and let the
// answer follow.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/constraint.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "schema_corpus.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"

namespace pg::engine {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::ordered_json;

struct Out {
  std::vector<int32_t> ids;
  std::string text;
  Event last;
};

Out drain(RequestHandle& h) {
  Out r;
  const auto end = Clock::now() + 300s;
  Event e;
  while (Clock::now() < end) {
    if (!h.next(e, 100ms)) continue;
    for (auto& t : e.tokens) r.ids.push_back(t.id);
    r.text += e.text;
    if (e.done) {
      r.last = e;
      return r;
    }
  }
  ADD_FAILURE() << "request did not finish";
  return r;
}

struct Engine {
  CpuBackend be{[] {
    CpuOptions co;
    co.n_threads = 2;
    return co;
  }()};
  std::unique_ptr<Model> target, draft;
  std::unique_ptr<tok::Tokenizer> tok;
  std::unique_ptr<Scheduler> sched;
  Engine(const std::string& target_path, const std::string& draft_path = {}, SpecOptions spec = {}, int n_ctx = 768) {
    target = Model::load(target_path, be);
    tok = tok::Tokenizer::from_gguf(target->file());
    if (!draft_path.empty()) {
      draft = Model::load(draft_path, be);
      spec.draft = draft.get();
    }
    SchedulerOptions so;
    so.n_slots = 4;
    so.n_ctx = n_ctx;
    so.n_batch = 256;
    so.spec = spec;
    sched = std::make_unique<Scheduler>(*target, *tok, so);
  }
  std::vector<Out> run(const std::vector<RequestSpec>& reqs) {
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (const auto& r : reqs) hs.push_back(sched->submit(r));
    std::vector<Out> o;
    for (auto& h : hs) o.push_back(drain(*h));
    return o;
  }
};

std::string demo_target() { return std::string(PEREGRINE_SOURCE_DIR) + "/models/peregrine-demo-target-Q8_0.gguf"; }
std::string demo_draft() { return std::string(PEREGRINE_SOURCE_DIR) + "/models/peregrine-demo-draft-Q8_0.gguf"; }
std::string stories() { return test::shared_path("testdata/models/stories260K.gguf").string(); }

std::shared_ptr<const ConstraintSpec> schema_constraint(const tok::Tokenizer& tok, const json& schema) {
  auto c = std::make_shared<ConstraintSpec>();
  c->grammar = compile_grammar(grammar::json_schema_to_gbnf(schema.dump()), tok, false);
  return c;
}

// Every n-th schema of the corpus: ≥ 50 real tool schemas plus the hand-written ones.
std::vector<std::pair<std::string, json>> some_schemas(size_t want) {
  auto all = test::schema_corpus();
  std::vector<std::pair<std::string, json>> v;
  const size_t stride = std::max<size_t>(1, all.size() / want);
  for (size_t i = 0; i < all.size() && v.size() < want; i += stride) v.push_back(all[i]);
  return v;
}

// Validates texts against schemas with python3-jsonschema; returns failures as messages.
std::vector<std::string> validate(const std::vector<std::pair<json, std::string>>& items) {
  json jobs = json::array();
  for (auto& [s, t] : items) jobs.push_back({{"schema", s}, {"instances", json::array({t})}});
  const auto dir = std::filesystem::temp_directory_path() / ("pg_constraint_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto in = dir / "in.json", out = dir / "out.json";
  std::ofstream(in) << jobs.dump();
  auto res = test::run_command({"/usr/bin/python3", std::string(PG_GRAMMAR_TEST_DIR) + "/validate_instances.py", in.string(), out.string()}, "", 300);
  std::vector<std::string> bad;
  if (res.exit_code != 0) {
    bad.push_back("jsonschema check failed (is python3-jsonschema installed?) " + res.err);
    return bad;
  }
  json r = json::parse(std::ifstream(out));
  for (size_t i = 0; i < items.size(); ++i)
    if (!r[i][0][0].get<bool>()) bad.push_back(items[i].second + " : " + r[i][0][1].get<std::string>());
  std::filesystem::remove_all(dir);
  return bad;
}

// Small models never close a free string (or an open array) on their own, so the test narrows the
// schema: strings without maxLength get 24, arrays without maxItems 3, objects no extra keys. Instances of the narrowed
// schema are instances of the original, which is what they are validated against.
json narrowed(json s) {
  if (s.is_array()) {
    for (auto& x : s) x = narrowed(x);
    return s;
  }
  if (!s.is_object()) return s;
  for (auto& [k, v] : s.items())
    if (k != "enum" && k != "const" && k != "default" && k != "examples") v = narrowed(v);
  auto has_type = [&](const char* t) {
    if (!s.contains("type")) return false;
    const json& ty = s["type"];
    if (ty.is_string()) return ty == t;
    if (ty.is_array())
      for (auto& x : ty)
        if (x == t) return true;
    return false;
  };
  if (has_type("string") && !s.contains("maxLength") && !s.contains("enum") && !s.contains("const") && !s.contains("pattern") &&
      !s.contains("format"))
    s["maxLength"] = std::max<int64_t>(24, s.value("minLength", int64_t{0}));
  if ((has_type("object") || s.contains("properties")) && !s.contains("additionalProperties")) s["additionalProperties"] = false;
  if (has_type("array") && !s.contains("maxItems")) s["maxItems"] = std::max<int64_t>(3, s.value("minItems", int64_t{0}));
  return s;
}

void corpus_on(const std::string& model, const std::string& prefix, const std::string& suffix, size_t n_schemas, int max_tokens,
               double temperature) {
  Engine e(model);
  auto schemas = some_schemas(n_schemas);
  ASSERT_GE(schemas.size(), n_schemas);
  std::vector<RequestSpec> reqs;
  for (size_t i = 0; i < schemas.size(); ++i) {
    RequestSpec r;
    r.prompt = e.tok->encode(prefix + "Call the tool " + schemas[i].first + " with JSON arguments." + suffix, true, true);
    r.sampling.temperature = static_cast<float>(temperature);
    r.sampling.seed = 1000 + i;
    r.max_tokens = max_tokens;
    r.constraint = schema_constraint(*e.tok, narrowed(schemas[i].second));
    reqs.push_back(std::move(r));
  }
  const auto t0 = Clock::now();
  auto outs = e.run(reqs);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<std::pair<json, std::string>> items;
  int n_tokens = 0, n_eog = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    n_tokens += outs[i].last.stats.n_generated;
    EXPECT_FALSE(outs[i].last.stats.grammar_broken) << schemas[i].first;
    // The grammar ends the output: EOG is the only way out (max_tokens is generous).
    EXPECT_EQ(outs[i].last.finish, FinishReason::kEog) << schemas[i].first << ": " << outs[i].text;
    n_eog += outs[i].last.finish == FinishReason::kEog;
    items.push_back({schemas[i].second, outs[i].text});
  }
  auto bad = validate(items);
  for (auto& b : bad) ADD_FAILURE() << b;
  std::printf("%s: %zu schemas, %d/%zu ended by the grammar, %zu invalid, %d tokens in %.1f s\n", model.c_str(), schemas.size(),
              n_eog, outs.size(), bad.size(), n_tokens, s);
}

TEST(Constraint, CorpusSchemasValidateOnStories260K) {
  corpus_on(stories(), "Once upon a time, ", "", 60, 600, 0.0);
}

TEST(Constraint, CorpusSchemasValidateOnDemoModel) {
  corpus_on(demo_target(), "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", 60, 600, 0.7);
}

std::vector<RequestSpec> demo_requests(const tok::Tokenizer& tok, size_t n) {
  auto schemas = some_schemas(n);
  std::vector<RequestSpec> reqs;
  for (size_t i = 0; i < schemas.size(); ++i) {
    RequestSpec r;
    r.prompt = tok.encode("<|im_start|>user\nGive the arguments of " + schemas[i].first +
                              " as JSON.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                          false, true);
    r.sampling.temperature = 0;
    r.max_tokens = 160;
    r.constraint = schema_constraint(tok, schemas[i].second);
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(Constraint, GreedySpeculativeEqualsPlainChainAndDDTree) {
  std::vector<Out> plain;
  std::vector<RequestSpec> reqs;
  {
    Engine e(demo_target());
    reqs = demo_requests(*e.tok, 12);
    plain = e.run(reqs);
  }
  SpecOptions chain;
  chain.type = spec::SpecType::kDraft;
  chain.n_max = 8;
  SpecOptions tree = chain;
  tree.tree = true;
  tree.budget = 22;
  for (auto [name, so] : {std::pair{"chain", chain}, std::pair{"ddtree", tree}}) {
    Engine e(demo_target(), demo_draft(), so);
    // The same grammars (compile_cached keys on the vocab object; rebuild for this tokenizer).
    auto rq = demo_requests(*e.tok, 12);
    auto outs = e.run(rq);
    int drafted = 0, accepted = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      EXPECT_EQ(outs[i].ids, plain[i].ids) << name << " request " << i;
      EXPECT_EQ(outs[i].text, plain[i].text) << name << " request " << i;
      drafted += outs[i].last.stats.draft_n;
      accepted += outs[i].last.stats.draft_n_accepted;
    }
    EXPECT_GT(accepted, 0) << name;
    std::printf("%s: drafted %d accepted %d\n", name, drafted, accepted);
  }
}

// Sampled requests with a speculating chain (the path that draws drafts from the draft's q and accepts
// with min(1, p/q) for unconstrained requests) must still end on the grammar and validate.
TEST(Constraint, SampledSpeculativeChainStaysInTheGrammar) {
  SpecOptions chain;
  chain.type = spec::SpecType::kDraft;
  chain.n_max = 8;
  chain.p_min = 0;
  chain.adaptive = false;  // always draft: this test is about the verification path
  Engine e(demo_target(), demo_draft(), chain);
  auto schemas = some_schemas(16);
  std::vector<RequestSpec> reqs;
  for (size_t i = 0; i < schemas.size(); ++i) {
    RequestSpec r;
    r.prompt = e.tok->encode("<|im_start|>user\nGive the arguments of " + schemas[i].first +
                                 " as JSON.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                             false, true);
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 77 + i;
    r.max_tokens = 600;
    r.constraint = schema_constraint(*e.tok, narrowed(schemas[i].second));
    reqs.push_back(std::move(r));
  }
  auto outs = e.run(reqs);
  std::vector<std::pair<json, std::string>> items;
  int drafted = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_FALSE(outs[i].last.stats.grammar_broken) << schemas[i].first;
    EXPECT_EQ(outs[i].last.finish, FinishReason::kEog) << schemas[i].first << ": " << outs[i].text;
    drafted += outs[i].last.stats.draft_n;
    items.push_back({schemas[i].second, outs[i].text});
  }
  EXPECT_GT(drafted, 0);
  for (auto& b : validate(items)) ADD_FAILURE() << b;
}

std::shared_ptr<ConstraintSpec> budget(int n) {
  auto c = std::make_shared<ConstraintSpec>();
  c->reasoning_budget = n;
  c->think_open = "<think>";
  c->think_close = "</think>";
  c->close_text = "\n</think>\n\n";
  return c;
}

TEST(Constraint, ReasoningBudgetClosesTheBlock) {
  std::string plain_cut;  // the budgeted answer without speculation: speculation must give the same
  for (bool speculate : {false, true}) {
    SpecOptions so;
    if (speculate) {
      so.type = spec::SpecType::kDraft;
      so.n_max = 8;
    }
    Engine e(demo_target(), speculate ? demo_draft() : "", so);
    RequestSpec r;
    r.prompt = e.tok->encode("<|im_start|>user\nWhat is 4821 + 3907?<|im_end|>\n<|im_start|>assistant\n", false, true);
    r.sampling.temperature = 0;
    r.max_tokens = 200;
    r.special_text = false;
    RequestSpec unlimited = r;
    r.constraint = budget(8);
    auto outs = e.run({unlimited, r});
    const std::string& full = outs[0].text;
    const std::string& cut = outs[1].text;
    std::printf("unlimited (%d reasoning-free tokens): %s\nbudget 8: %s\n", outs[0].last.stats.n_generated, full.c_str(), cut.c_str());
    ASSERT_NE(full.find("</think>"), std::string::npos) << "the demo model reasons in <think>";
    const size_t close = cut.find("</think>");
    ASSERT_NE(close, std::string::npos) << cut;
    EXPECT_LT(close, full.find("</think>")) << "the budget ended the reasoning earlier than the model would";
    EXPECT_EQ(outs[1].last.finish, FinishReason::kEog);
    EXPECT_GT(cut.size(), close + 12) << "an answer follows the closed block";
    // 8 thought tokens plus the closing text's tokens.
    EXPECT_GE(outs[1].last.stats.n_reasoning, 8);
    EXPECT_LE(outs[1].last.stats.n_reasoning, 8 + 3);
    EXPECT_LT(outs[1].last.stats.n_reasoning, outs[1].last.stats.n_generated);
    if (!speculate) plain_cut = cut;
    else EXPECT_EQ(cut, plain_cut) << "greedy with a budget: the forced close lands at the same token with drafts";
  }
}

TEST(Constraint, GrammarAfterReasoningAndStopStrings) {
  Engine e(demo_target());
  RequestSpec r;
  r.prompt = e.tok->encode("<|im_start|>user\nWhat is 12 + 30? Answer in JSON.<|im_end|>\n<|im_start|>assistant\n", false, true);
  r.sampling.temperature = 0;
  r.max_tokens = 300;
  auto c = budget(16);
  c->grammar = compile_grammar(
      grammar::json_schema_to_gbnf(R"({"type":"object","properties":{"answer":{"type":"integer"}},"required":["answer"],"additionalProperties":false})"),
      *e.tok, true);
  c->trigger = "</think>";
  // The template's text between the tags and the answer: allow the newlines the close text writes.
  r.constraint = c;
  auto outs = e.run({r});
  const std::string& t = outs[0].text;
  std::printf("grammar after reasoning: %s\n", t.c_str());
  const size_t close = t.find("</think>");
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(outs[0].last.finish, FinishReason::kEog);
  EXPECT_FALSE(outs[0].last.stats.grammar_broken);
  std::string answer = t.substr(close + 8);
  while (!answer.empty() && (answer[0] == '\n' || answer[0] == ' ')) answer.erase(0, 1);
  auto j = json::parse(answer);
  EXPECT_TRUE(j.contains("answer") && j["answer"].is_number_integer()) << answer;
}

}  // namespace
}  // namespace pg::engine

namespace pg::engine {
namespace {

// A grammar whose parallel parses double with every byte (x ::= "a" x "b" | "a" x "c" | ""): past the
// limit the matcher throws, which the engine thread must never see — the constraint gives up
// (grammar_broken) and sampling goes on.
TEST(Constraint, AmbiguityLimitInTheEngineDoesNotThrow) {
  CpuBackend be{CpuOptions{}};
  auto m = Model::load(stories(), be);
  auto tok = tok::Tokenizer::from_gguf(m->file());
  auto g = grammar::Grammar::parse("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"\n");
  auto spec = std::make_shared<ConstraintSpec>();
  // Not warmed (compile_cached would refuse it at request time): the state comes up mid-generation.
  spec->grammar = std::make_shared<grammar::Compiled>(grammar::Compiled{g, grammar::Matcher(g, shared_vocab(*tok))});
  Constraint c(spec, *tok);
  std::vector<float> logits(static_cast<size_t>(tok->n_vocab()), 0.0f);
  // The token whose bytes are exactly "a", 40 times: each one is valid, the parses double.
  auto v = shared_vocab(*tok);
  int32_t a = -1;
  for (int32_t t = 0; t < v->n_vocab() && a < 0; ++t)
    if (v->piece(t) == "a") a = t;
  ASSERT_GE(a, 0);
  const std::vector<int32_t> ids(40, a);
  bool threw = false;
  try {
    for (int32_t t : ids) {
      (void)c.apply(logits.data());
      c.accept(t);
    }
    (void)c.apply(logits.data());
  } catch (...) {
    threw = true;
  }
  EXPECT_FALSE(threw);
  EXPECT_TRUE(c.broken());
  // The same bytes straight into a matcher do throw: the guard above is what catches it.
  grammar::Matcher raw(g, v);
  EXPECT_THROW((void)raw.accept_bytes(std::string(40, 'a')), pg::Error);
}

}  // namespace
}  // namespace pg::engine

namespace pg::engine {
namespace {

// A GBNF string literal of arbitrary bytes.
std::string gbnf_lit(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c < 0x20 || c >= 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      o += b;
    } else o += static_cast<char>(c);
  }
  return o + "\"";
}

std::shared_ptr<ConstraintSpec> lazy(const tok::Tokenizer& tok, const std::string& gbnf, std::vector<grammar::TriggerSpec> t) {
  auto c = std::make_shared<ConstraintSpec>();
  c->grammar = compile_grammar(gbnf, tok, false);
  c->lazy = grammar::Triggers::compile(std::move(t));
  return c;
}

// The output from `at` on is a whole sentence of the grammar.
bool in_grammar(const tok::Tokenizer& tok, const std::string& gbnf, const std::string& text) {
  auto c = compile_grammar(gbnf, tok, false);
  grammar::Matcher m = c->proto.clone();
  return m.accept_bytes(text) && m.can_end();
}

// A word of the unconstrained output (letters, 3..8 long, after the first 8 bytes): a trigger the
// model is known to write.
std::string some_word(const std::string& t) {
  for (size_t i = 8; i < t.size(); ++i) {
    if (!std::isalpha(static_cast<unsigned char>(t[i])) || std::isalpha(static_cast<unsigned char>(t[i - 1]))) continue;
    size_t j = i;
    while (j < t.size() && std::isalpha(static_cast<unsigned char>(t[j]))) ++j;
    if (j - i >= 3 && j - i <= 8) return t.substr(i, j - i);
  }
  return {};
}

// Lazy grammars on stories260K (greedy): a trigger that never matches leaves the output identical to
// a request without grammar; word, pattern (capture group) and token triggers leave the text before
// the trigger as it was and constrain everything from the trigger's start to the end.
TEST(Constraint, LazyGrammarTriggersOnStories260K) {
  Engine e(stories());
  RequestSpec base;
  base.prompt = e.tok->encode("Once upon a time, ", true, false);
  base.sampling.temperature = 0;
  base.max_tokens = 120;
  const Out plain = e.run({base})[0];
  const std::string w = some_word(plain.text);
  ASSERT_FALSE(w.empty()) << plain.text;
  const size_t at = plain.text.find(w);
  const std::string tail = " [a-z ]{0,40} \".\"";
  const std::string g = "root ::= " + gbnf_lit(w) + tail + "\n";
  // The token trigger: the 6th generated token; the grammar starts with its text.
  const int32_t tid = plain.ids[5];
  const std::string tpiece = e.tok->token_to_piece(tid, true);
  size_t tat = 0;
  for (int k = 0; k < 5; ++k) tat += e.tok->token_to_piece(plain.ids[static_cast<size_t>(k)], true).size();
  for (int k = 0; k < 5; ++k)
    if (plain.ids[static_cast<size_t>(k)] == tid) tat = std::string::npos;  // fires earlier: not this check
  ASSERT_NE(tat, std::string::npos) << "pick another token";
  const std::string gt = "root ::= " + gbnf_lit(tpiece) + tail + "\n";

  RequestSpec never = base, word = base, pat = base, tok = base;
  never.constraint = lazy(*e.tok, "root ::= \"x\"\n", {{grammar::TriggerSpec::Kind::Word, "zqzqzq", -1},
                                                       {grammar::TriggerSpec::Kind::PatternFull, "\\d{5}", -1}});
  word.constraint = lazy(*e.tok, g, {{grammar::TriggerSpec::Kind::Word, w, -1}});
  pat.constraint = lazy(*e.tok, g, {{grammar::TriggerSpec::Kind::Pattern, "[\\s\\S]*?(" + w + ")", -1}});
  tok.constraint = lazy(*e.tok, gt, {{grammar::TriggerSpec::Kind::Token, "", tid}});
  auto outs = e.run({never, word, pat, tok});
  EXPECT_EQ(outs[0].ids, plain.ids) << "a lazy grammar that never triggers changes nothing";
  EXPECT_EQ(outs[0].text, plain.text);
  for (int i : {1, 2}) {
    const std::string& t = outs[static_cast<size_t>(i)].text;
    std::printf("trigger '%s' (%s): %s\n", w.c_str(), i == 1 ? "word" : "pattern", t.c_str());
    EXPECT_EQ(t.substr(0, at), plain.text.substr(0, at)) << "free before the trigger";
    EXPECT_TRUE(in_grammar(*e.tok, g, t.substr(at))) << t.substr(at);
    EXPECT_EQ(outs[static_cast<size_t>(i)].last.finish, FinishReason::kEog);
    EXPECT_FALSE(outs[static_cast<size_t>(i)].last.stats.grammar_broken);
  }
  EXPECT_EQ(outs[1].text, outs[2].text) << "word and the pattern around it start the grammar at the same byte";
  const std::string& tt = outs[3].text;
  EXPECT_EQ(tt.substr(0, tat), plain.text.substr(0, tat));
  EXPECT_TRUE(in_grammar(*e.tok, gt, tt.substr(tat))) << tt;
  EXPECT_EQ(outs[3].last.finish, FinishReason::kEog);
}

// Speculation with lazy grammars (demo pair, greedy): drafts before the trigger are free, after it
// the mask applies; the output equals the non-speculative output, chain and DDTree.
TEST(Constraint, LazyGrammarGreedySpeculativeEqualsPlain) {
  const std::string g = "root ::= \"</think>\" [ \\n]{0,4} \"{\\\"answer\\\": \" [0-9]{1,6} \"}\"\n";
  auto requests = [&g](const tok::Tokenizer& tok) {
    std::vector<RequestSpec> v;
    const char* qs[] = {"What is 12 + 30?", "Name a color.", "Write one word.", "What is 7 * 6?"};
    for (const char* q : qs) {
      RequestSpec r;
      r.prompt = tok.encode(std::string("<|im_start|>user\n") + q + "<|im_end|>\n<|im_start|>assistant\n", false, true);
      r.sampling.temperature = 0;
      r.max_tokens = 160;
      // The end of the reasoning block as the trigger: from there a JSON object follows.
      r.constraint = lazy(tok, g, {{grammar::TriggerSpec::Kind::Word, "</think>", -1}});
      v.push_back(r);
      r.constraint = lazy(tok, "root ::= \"x\"\n", {{grammar::TriggerSpec::Kind::Word, "qqzzqq", -1}});
      v.push_back(r);
    }
    return v;
  };
  std::vector<Out> plain;
  {
    Engine e(demo_target());
    plain = e.run(requests(*e.tok));
    for (size_t i = 0; i < plain.size(); i += 2) {
      const std::string& t = plain[i].text;
      const size_t c = t.find("</think>");
      ASSERT_NE(c, std::string::npos) << t;
      std::printf("lazy after </think>: %s\n", t.c_str());
      EXPECT_TRUE(in_grammar(*e.tok, g, t.substr(c))) << t;
      EXPECT_EQ(plain[i].last.finish, FinishReason::kEog);
      EXPECT_FALSE(plain[i].last.stats.grammar_broken);
    }
  }
  SpecOptions chain;
  chain.type = spec::SpecType::kDraft;
  chain.n_max = 8;
  chain.adaptive = false;
  SpecOptions tree = chain;
  tree.tree = true;
  tree.budget = 22;
  for (auto [name, so] : {std::pair{"chain", chain}, std::pair{"ddtree", tree}}) {
    Engine e(demo_target(), demo_draft(), so);
    auto outs = e.run(requests(*e.tok));
    int drafted = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      EXPECT_EQ(outs[i].ids, plain[i].ids) << name << " request " << i;
      drafted += outs[i].last.stats.draft_n;
    }
    EXPECT_GT(drafted, 0) << name;
  }
}

}  // namespace
}  // namespace pg::engine

namespace pg::engine {
namespace {

// Re-arming (tool calls with parallel_tool_calls): after the grammar completes the output is free
// again until the next trigger; without re-arming only the end may follow.
TEST(Constraint, LazyRearmAfterACompleteCall) {
  CpuBackend be{CpuOptions{}};
  auto m = Model::load(stories(), be);
  auto tok = tok::Tokenizer::from_gguf(m->file());
  std::vector<float> logits(static_cast<size_t>(tok->n_vocab()), 0.0f);
  for (bool rearm : {true, false}) {
    auto spec = std::make_shared<ConstraintSpec>();
    spec->grammar = compile_grammar("root ::= \"<x>\" [0-9] \"</x>\"\n", *tok, false);
    spec->lazy = grammar::Triggers::compile({{grammar::TriggerSpec::Kind::Word, "<x>", -1}});
    spec->lazy_rearm = rearm;
    Constraint c(spec, *tok);
    auto feed = [&](const std::string& text) {
      for (int32_t t : tok->encode(text, false, false)) {
        (void)c.apply(logits.data());
        c.accept(t);
      }
    };
    feed("ab ");
    EXPECT_TRUE(c.armed());
    feed("<x>5</x>");
    EXPECT_FALSE(c.broken());
    if (!rearm) {
      // Complete and not re-armed: only EOG is allowed.
      const float* l = c.apply(logits.data());
      int allowed = 0;
      for (int32_t t = 0; t < tok->n_vocab(); ++t) allowed += l[t] > -1e30f;
      EXPECT_EQ(allowed, static_cast<int>(shared_vocab(*tok)->eog_ids_.size()));
      continue;
    }
    EXPECT_TRUE(c.armed()) << "free again after the call";
    EXPECT_EQ(c.apply(logits.data()), logits.data()) << "no mask while armed";
    // One encoding (a SentencePiece vocabulary prefixes a space to each encoded chunk).
    const auto a = tok->encode("a", false, false);
    ASSERT_EQ(a.size(), 1u);
    bool checked = false;
    for (int32_t t : tok->encode(" cd <x>7</x>", false, false)) {
      const float* l = c.apply(logits.data());
      if (!c.armed() && !checked) {
        EXPECT_LT(l[a[0]], -1e30f) << "the second call is constrained: a letter where a digit must come";
        checked = true;
      }
      c.accept(t);
    }
    EXPECT_TRUE(checked) << "the second trigger fired";
    EXPECT_TRUE(c.armed());
    EXPECT_FALSE(c.broken());
  }
}

}  // namespace
}  // namespace pg::engine
