// The schema corpus of the structured-output tests: every BFCL tool definition in
// shared/testdata/bench/bfcl (420, Python-flavoured types mapped to JSON Schema) plus hand-written
// schemas for the keywords BFCL does not use. Shared by tests/grammar and tests/engine.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace pg::test {

// (name, schema) pairs, in a fixed order.
std::vector<std::pair<std::string, nlohmann::ordered_json>> schema_corpus();

}  // namespace pg::test
