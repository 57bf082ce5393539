#include "schema_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "testutil.h"

namespace pg::test {
namespace {
using json = nlohmann::ordered_json;

// BFCL writes Python-flavoured types; the server receives standard JSON Schema, so map them here.
void normalise_bfcl(json& s) {
  if (!s.is_object()) return;
  if (s.contains("type") && s["type"].is_string()) {
    std::string t = s["type"];
    if (t == "dict") s["type"] = "object";
    if (t == "float") s["type"] = "number";
    if (t == "tuple") s["type"] = "array";
    if (t == "any") s.erase("type");
  }
  if (s.contains("properties")) {
    for (auto& [k, v] : s["properties"].items()) normalise_bfcl(v);
  }
  if (s.contains("items")) normalise_bfcl(s["items"]);
}

}  // namespace

std::vector<std::pair<std::string, json>> schema_corpus() {
  std::vector<std::pair<std::string, json>> out;
  const auto dir = pg::test::shared_path("testdata/bench/bfcl");
  {
    std::ifstream f(dir / "BFCL_v4_live_simple.json");
    std::string line;
    while (std::getline(f, line)) {
      auto j = json::parse(line);
      for (auto& fn : j["function"]) {
        json s = fn["parameters"];
        normalise_bfcl(s);
        out.push_back({j["id"].get<std::string>() + "/" + fn["name"].get<std::string>(), s});
      }
    }
  }
  std::vector<std::filesystem::path> files;
  for (auto& e : std::filesystem::directory_iterator(dir / "multi_turn_func_doc")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (auto& p : files) {
    std::ifstream f(p);
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      auto j = json::parse(line);
      json s = j["parameters"];
      normalise_bfcl(s);
      out.push_back({p.stem().string() + "/" + j["name"].get<std::string>(), s});
    }
  }
  // Keywords beyond BFCL's: refs and recursion, combinators, tuples, bounds, formats, patterns.
  const char* extra[] = {
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},"required":["v"]}},"$ref":"#/$defs/node"})",
      R"({"definitions":{"pt":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"],"additionalProperties":false}},"type":"array","items":{"$ref":"#/definitions/pt"},"minItems":1,"maxItems":4})",
      R"({"anyOf":[{"type":"string","maxLength":3},{"type":"integer","minimum":-5,"maximum":1234},{"type":"null"}]})",
      R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"n":{"type":"integer","exclusiveMinimum":0}},"required":["kind","n"]},{"type":"object","properties":{"kind":{"const":"b"},"s":{"type":"string","minLength":2}},"required":["kind","s"]}]})",
      R"({"allOf":[{"type":"object","properties":{"id":{"type":"string","format":"uuid"}},"required":["id"]},{"properties":{"when":{"type":"string","format":"date-time"},"day":{"type":"string","format":"date"}},"required":["day"]}]})",
      R"({"type":"array","prefixItems":[{"type":"string","format":"email"},{"type":"boolean"},{"enum":[1,"two",null,[3]]}],"items":{"type":"integer","minimum":10,"maximum":99},"minItems":2,"maxItems":5})",
      R"({"type":"object","properties":{"a":{"type":["string","null"]},"b":{"type":"number","minimum":0}},"additionalProperties":{"type":"integer","maximum":-7}})",
      R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2,3}-\\d{3}(x|yz)?$"},"free":{"type":"string","pattern":"ab+c"},"t":{"type":"string","format":"time"}},"required":["code","free","t"]})",
      R"({"type":"object","additionalProperties":true,"properties":{}})",
      R"({"type":"array","items":false,"prefixItems":[{"type":"integer","minimum":100000,"maximum":100020},{"type":"integer","maximum":-1000}]})",
      R"({"type":"object","properties":{"n":{"type":"integer","minimum":37},"m":{"type":"integer","maximum":15},"q":{"type":"integer","minimum":-20,"maximum":-3}},"required":["n","m","q"]})",
      R"({"type":"string","enum":["x","y\"z","\u00e9t\u00e9"],"description":"enum with type"})",
      R"({"type":"object","properties":{"deep":{"type":"object","properties":{"deeper":{"type":"object","properties":{"deepest":{"type":"array","items":{"type":"object","properties":{"leaf":{"type":"string","maxLength":5}},"required":["leaf"]}}},"required":["deepest"]}},"required":["deeper"]}},"required":["deep"]})",
  };
  int i = 0;
  for (auto* e : extra) out.push_back({"extra/" + std::to_string(i++), json::parse(e)});
  return out;
}

}  // namespace pg::test
