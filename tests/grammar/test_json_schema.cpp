// JSON Schema -> grammar over a corpus of real tool schemas (every BFCL tool definition in
// shared/testdata/bench/bfcl) plus hand-written schemas for the keywords BFCL does not use:
//   (a) random sentences of each grammar must parse and validate against the schema (Python's
//       jsonschema, formats checked: an independent validator);
//   (b) mutations of them that jsonschema rejects must be rejected by the matcher;
// and unsupported keywords are errors naming them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "grammar/grammar.h"
#include "schema_corpus.h"
#include "testutil.h"

// GCC 12 reports a false -Wrestrict on string concatenation chains (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

using namespace pg::grammar;
using json = nlohmann::ordered_json;

namespace {

// A value of a different JSON kind than v.
json wrong_kind(const json& v) {
  if (v.is_string()) return 12345;
  if (v.is_number()) return "not-a-number";
  if (v.is_boolean()) return json::array({1});
  if (v.is_null()) return json::object({{"k", 1}});
  return "not-a-container";
}

std::vector<std::string> mutants(const std::string& text, std::mt19937_64& rng) {
  std::vector<std::string> out;
  out.push_back(text.substr(0, text.size() - 1));  // truncated
  out.push_back(text + "}");                       // trailing garbage
  json v;
  try {
    v = json::parse(text);
  } catch (...) {
    return out;
  }
  out.push_back(wrong_kind(v).dump());
  if (v.is_object() && !v.empty()) {
    auto keys = std::vector<std::string>();
    for (auto& [k, x] : v.items()) keys.push_back(k);
    std::string k = keys[std::uniform_int_distribution<size_t>(0, keys.size() - 1)(rng)];
    json a = v;
    a.erase(k);
    out.push_back(a.dump());
    json b = v;
    b[k] = wrong_kind(v[k]);
    out.push_back(b.dump());
    json c = v;
    c["zz_unknown_key"] = 1;
    out.push_back(c.dump());
  }
  if (v.is_array() && !v.empty()) {
    json a = v;
    a.push_back(a.back());
    out.push_back(a.dump());
    json b = v;
    b[0] = wrong_kind(v[0]);
    out.push_back(b.dump());
  }
  return out;
}

std::shared_ptr<const Vocab> byte_vocab() {
  std::vector<std::string> p;
  for (int b = 0; b < 256; ++b) p.push_back(std::string(1, static_cast<char>(b)));
  return Vocab::build(p, std::vector<bool>(p.size(), false));
}

}  // namespace

TEST(JsonSchema, CorpusInstancesValidateAndMutantsAreRejected) {
  auto schemas = pg::test::schema_corpus();
  ASSERT_GE(schemas.size(), 50u);
  auto bytes = byte_vocab();
  std::mt19937_64 rng(42);
  json jobs = json::array();
  std::vector<std::shared_ptr<const Grammar>> grammars;
  std::vector<size_t> n_valid;
  size_t unsatisfiable = 0;
  for (auto& [name, schema] : schemas) {
    std::string g;
    try {
      g = json_schema_to_gbnf(schema.dump());
    } catch (const pg::Error& e) {
      // BFCL has a few schemas like {"type":"array","enum":["a","b"]}: no value satisfies both, and
      // saying so is the right answer (a 400, not a grammar that can never produce a valid value).
      if (std::string(e.what()) == "json_schema: no 'enum' value has the schema's 'type'") {
        ++unsatisfiable;
      } else {
        ADD_FAILURE() << name << ": " << e.what();
      }
      continue;
    }
    std::shared_ptr<const Grammar> gr;
    try {
      gr = Grammar::parse(g);
    } catch (const pg::Error& e) {
      ADD_FAILURE() << name << ": " << e.what() << "\n" << g;
      continue;
    }
    json inst = json::array();
    for (int k = 0; k < 12; ++k) {
      std::string s;
      ASSERT_TRUE(gr->sample(rng, s, 8)) << name;
      Matcher m(gr, bytes);
      ASSERT_TRUE(m.accept_bytes(s) && m.can_end()) << name << ": sampled sentence rejected: " << s;
      inst.push_back(s);
    }
    const size_t nv = inst.size();
    for (size_t k = 0; k < nv; k += 3) {
      for (auto& mu : mutants(inst[k].get<std::string>(), rng)) inst.push_back(mu);
    }
    jobs.push_back({{"name", name}, {"schema", schema}, {"instances", inst}});
    grammars.push_back(gr);
    n_valid.push_back(nv);
  }
  pg::test::TempDir tmp;
  const auto in = tmp.path() / "jobs.json", out = tmp.path() / "out.json";
  std::ofstream(in) << jobs.dump();
  auto res = pg::test::run_command({"/usr/bin/python3", std::string(PG_GRAMMAR_TEST_DIR) + "/validate_instances.py", in.string(), out.string()}, "", 600);
  ASSERT_EQ(res.exit_code, 0) << "jsonschema check failed (is python3-jsonschema installed?)\n" << res.err;
  json results = json::parse(pg::test::read_text(out));
  ASSERT_EQ(results.size(), jobs.size());
  size_t valid_checked = 0, mutants_invalid = 0, mutants_valid = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto& inst = jobs[j]["instances"];
    for (size_t k = 0; k < inst.size(); ++k) {
      bool ok = results[j][k][0].get<bool>();
      const std::string text = inst[k].get<std::string>();
      if (k < n_valid[j]) {
        EXPECT_TRUE(ok) << jobs[j]["name"] << ": generated instance invalid: " << text << "\n  " << results[j][k][1];
        ++valid_checked;
      } else if (!ok) {
        Matcher m(grammars[j], bytes);
        EXPECT_FALSE(m.accept_bytes(text) && m.can_end()) << jobs[j]["name"] << ": invalid instance accepted: " << text;
        ++mutants_invalid;
      } else {
        ++mutants_valid;
      }
    }
  }
  EXPECT_LE(unsatisfiable, 3u);
  std::printf("unsatisfiable schemas (enum contradicts type) %zu; schemas %zu, generated instances validated %zu, invalid mutants rejected %zu (valid mutants skipped %zu)\n",
              unsatisfiable, jobs.size(), valid_checked, mutants_invalid, mutants_valid);
  EXPECT_GE(jobs.size(), 430u);
  EXPECT_GT(mutants_invalid, 1000u);
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  auto err = [](const std::string& s) {
    try {
      json_schema_to_gbnf(s);
    } catch (const pg::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(err(R"({"type":"object","patternProperties":{"a":{}}})"), "json_schema: unsupported keyword 'patternProperties'");
  EXPECT_EQ(err(R"({"not":{"type":"string"}})"), "json_schema: unsupported keyword 'not'");
  EXPECT_EQ(err(R"({"type":"array","uniqueItems":true})"), "json_schema: unsupported keyword 'uniqueItems'");
  EXPECT_EQ(err(R"({"type":"dict"})"), "json_schema: unsupported type 'dict'");
  EXPECT_EQ(err(R"({"type":"string","format":"hostname"})"), "json_schema: unsupported format 'hostname'");
  EXPECT_EQ(err(R"({"$ref":"http://x/y"})"), "json_schema: $ref 'http://x/y' is not a local reference (only '#...' is supported)");
  EXPECT_EQ(err(R"({"$ref":"#/$defs/missing"})"), "json_schema: $ref '#/$defs/missing' does not resolve");
  EXPECT_EQ(err(R"({"type":"number","maximum":3})"), "json_schema: 'maximum' on a number is not supported (only 'minimum': 0; use 'integer' for ranges)");
  EXPECT_NE(err(R"({"type":"string","pattern":"(?=a)b"})").find("lookaround"), std::string::npos);
  EXPECT_NE(err(R"({"type":"string","pattern":"(a)\\1"})").find("back-reference"), std::string::npos);
  EXPECT_NE(err(R"({"type":"string","pattern":"\\bword"})").find("word boundary"), std::string::npos);
  EXPECT_EQ(err("{\"type\":").rfind("json_schema: invalid JSON", 0), 0u);
  EXPECT_EQ(err(std::string(200, '[') + std::string(200, ']')), "json_schema: schema nested too deeply (over 128 levels)");
  EXPECT_EQ(err(R"({"type":"object","properties":{"a":{}},"required":["b"]})"), "json_schema: required property 'b' has no schema in 'properties'");
  EXPECT_EQ(err("false"), "json_schema: schema 'false' admits no value");
}

TEST(JsonSchema, WhitespacePolicyAndJsonObject) {
  auto g = Grammar::parse(json_schema_to_gbnf(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})"));
  auto bytes = byte_vocab();
  auto ok = [&](std::shared_ptr<const Grammar> gr, const std::string& s) {
    Matcher m(gr, bytes);
    return m.accept_bytes(s) && m.can_end();
  };
  EXPECT_TRUE(ok(g, R"({"a":1})"));
  EXPECT_TRUE(ok(g, "{\n  \"a\": 1\n}"));
  EXPECT_TRUE(ok(g, "{ \"a\" : 1 }"));
  EXPECT_TRUE(ok(g, "{\n" + std::string(24, ' ') + "\"a\":1}"));
  EXPECT_FALSE(ok(g, "{\n" + std::string(25, ' ') + "\"a\":1}"));  // indentation bounded
  EXPECT_FALSE(ok(g, "{\n\n\"a\":1}"));                              // one newline per gap
  EXPECT_FALSE(ok(g, " {\"a\":1}"));                                 // nothing before the value
  auto o = Grammar::parse(json_object_gbnf());
  EXPECT_TRUE(ok(o, R"({"x":[1,{"y":null}],"z":"s"})"));
  EXPECT_FALSE(ok(o, "[1]"));
  EXPECT_FALSE(ok(o, "\"s\""));
}

TEST(JsonSchema, ManyPropertiesDoNotRecurse) {
  json s = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 2000; ++i) s["properties"][std::to_string(i).insert(0, "p")] = {{"type", "integer"}};
  s["required"] = json::array({"p1999"});
  auto g = Grammar::parse(json_schema_to_gbnf(s.dump()));
  Matcher m(g, byte_vocab());
  EXPECT_TRUE(m.accept_bytes(R"({"p7":1,"p1999":2})") && m.can_end());
  Matcher m2(g, byte_vocab());
  EXPECT_FALSE(m2.accept_bytes(R"({"p7":1})") && m2.can_end());
}
