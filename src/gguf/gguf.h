// GGUF v2/v3 reader over a read-only memory map. Every count, length, offset and shape is checked
// against the file before it is used, so a hostile file ends in one pg::Error, never a crash or a
// huge allocation. Tensor data is not copied: TensorInfo::data points into the map.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace pg::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// Text from a file made safe for one-line messages and terminals: control characters and bytes that
// are not valid UTF-8 become escapes (\n, \t, \xNN), and the result is cut after about max_bytes of
// input with "..." appended. Sets *cut when it was shortened. With quoted, '"' and '\' are escaped too
// (for text shown between double quotes).
std::string escape_text(std::string_view s, size_t max_bytes = 80, bool* cut = nullptr, bool quoted = false);
// escape_text(s) in single quotes, for error messages that name a key or tensor.
std::string printable(std::string_view s, size_t max_bytes = 80);

struct Value;
struct Array {
  ValueType elem_type;
  std::vector<Value> items;
};

// A metadata value. Integers keep their exact value; accessors convert with range checks.
struct Value {
  ValueType type = ValueType::UINT8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> v;

  bool is_integer() const;
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
  int64_t as_int() const;    // integer or bool; throws otherwise
  uint64_t as_uint() const;  // non-negative integer
  double as_float() const;   // any number
  bool as_bool() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  std::string to_display(size_t max_items = 8) const;  // short human-readable form
};

constexpr int kMaxDims = 4;
// Limits shared by the reader and the writer.
constexpr int kMaxArrayNesting = 4;          // arrays of arrays of ... (real files use 1)
constexpr size_t kMaxTensorNameLength = 63;  // ggml keeps names in char[64] with a NUL
constexpr size_t kMaxKeyLength = 65536;

struct TensorInfo {
  std::string name;
  int n_dims = 0;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // ggml order: ne[0] is the contiguous (input) dimension
  DType type = DType::F32;
  uint64_t offset = 0;  // relative to the start of the data section
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "{256, 512}"
};

class File {
 public:
  // Maps and parses a file. Throws pg::Error with the path in the message.
  static std::unique_ptr<File> open(const std::string& path);
  // Parses bytes owned by the caller (fuzzing, tests). The bytes must outlive the File.
  static std::unique_ptr<File> from_memory(std::span<const uint8_t> bytes, const std::string& name = "<memory>");
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters: throw pg::Error naming the key when it is missing or of the wrong type.
  const Value& get(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  // Optional forms: nullopt when the key is absent (still throw on a wrong type).
  std::optional<std::string> get_string_opt(const std::string& key) const;
  std::optional<int64_t> get_int_opt(const std::string& key) const;
  std::optional<double> get_float_opt(const std::string& key) const;
  std::optional<bool> get_bool_opt(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;

  // The "general.architecture" value, or "" when absent.
  std::string architecture() const;

 private:
  File() = default;
  void parse();

  std::string path_;
  std::span<const uint8_t> bytes_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace pg::gguf
