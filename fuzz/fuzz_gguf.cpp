// libFuzzer target for the GGUF reader: parse arbitrary bytes with File::from_memory, then touch every
// metadata value (through the typed accessors too), every tensor's first and last data byte, and render
// the whole file with inspect. The only acceptable failure is a pg::Error; anything else (a crash, a
// sanitizer report, another exception type escaping) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/inspect.h"

namespace {

volatile uint64_t g_sink;

void touch(const pg::gguf::Value& v) {
  using pg::gguf::ValueType;
  uint64_t h = static_cast<uint64_t>(v.type);
  // Accessors may refuse a value of the wrong kind, but only with pg::Error.
  try {
    h += static_cast<uint64_t>(v.as_int());
  } catch (const pg::Error&) {
  }
  try {
    h += v.as_uint();
  } catch (const pg::Error&) {
  }
  try {
    h += static_cast<uint64_t>(v.as_float() != 0.0);
  } catch (const pg::Error&) {
  }
  try {
    h += v.as_bool();
  } catch (const pg::Error&) {
  }
  if (v.type == ValueType::STRING) h += v.as_string().size();
  if (v.type == ValueType::ARRAY) {
    const auto& a = v.as_array();
    h += a.items.size() + static_cast<uint64_t>(a.elem_type);
    for (const auto& item : a.items) touch(item);
  }
  g_sink = g_sink + h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<pg::gguf::File> f;
  try {
    f = pg::gguf::File::from_memory(std::span<const uint8_t>(data, size), "fuzz");
  } catch (const pg::Error&) {
    return 0;
  }
  uint64_t h = f->version() + f->alignment() + f->data_offset();
  for (const auto& [key, v] : f->metadata()) {
    h += key.size();
    touch(v);
    if (f->find(key) != &v) __builtin_trap();  // the index must point at the first and only entry
    try {
      h += f->get_string_opt(key).value_or("").size();
    } catch (const pg::Error&) {
    }
    try {
      h += f->get_int_array(key).size() + f->get_float_array(key).size() + f->get_string_array(key).size();
    } catch (const pg::Error&) {
    }
  }
  for (const auto& t : f->tensors()) {
    if (t.nbytes == 0 || t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
    if (f->find_tensor(t.name) != &t) __builtin_trap();
    h += t.data[0] + t.data[t.nbytes - 1] + static_cast<uint64_t>(t.n_elements()) + t.shape_string().size();
    h += pg::dtype_name(t.type).size();
  }
  h += pg::gguf::inspect(*f).size();
  g_sink = g_sink + h;
  return 0;
}
