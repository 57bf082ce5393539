// Human-readable dump of a GGUF file (`peregrine gguf inspect`): header, every metadata key with its
// type and a shortened value, the tensor table and totals. Kept apart from the CLI so it can be tested.
#pragma once
#include <cstdint>
#include <map>
#include <ostream>
#include <string>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace pg::gguf {

struct InspectOptions {
  size_t max_array_items = 8;    // array items shown before "... (N items)"; 0 shows all
  size_t max_string_bytes = 80;  // string bytes shown before "..."; 0 shows all
  bool tensors = true;           // print the tensor table
};

// "u32", "str", "arr[str,151936]", "arr[arr[i32,2],3]" (nested arrays show their first item's length).
std::string type_string(const Value& v);
// A one-line rendering of a value: strings quoted and escaped, floats in their shortest exact form,
// arrays as "[a, b, ... (N items)]".
std::string format_value(const Value& v, const InspectOptions& opt = {});
// Shortest decimal that reads back as the same float / double ("1e-05", "10000", "0.1").
std::string format_f32(float x);
std::string format_f64(double x);

struct TypeTotals {
  size_t tensors = 0;
  uint64_t params = 0;
  uint64_t bytes = 0;
};
struct TensorTotals {
  size_t tensors = 0;
  uint64_t params = 0;
  uint64_t bytes = 0;
  std::map<DType, TypeTotals> by_type;
};
TensorTotals tensor_totals(const File& f);

std::string with_commas(uint64_t n);  // 1234567 -> "1,234,567"
std::string human_bytes(uint64_t n);  // "1.50 GiB"
std::string human_count(uint64_t n);  // 8190735360 -> "8.19B"

void print_inspect(const File& f, std::ostream& os, const InspectOptions& opt = {});
std::string inspect(const File& f, const InspectOptions& opt = {});

}  // namespace pg::gguf
