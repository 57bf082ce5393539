// GGUF v3 writer. Metadata of every value type (including arrays of arrays), tensors given as bytes
// or streamed from a callback, general.alignment honoured. The layout is the one ggml and gguf-py
// produce (header, kv pairs, tensor infos, padding, tensors in order each padded to the alignment), so
// the files load in llama.cpp as well as in pg::gguf::File.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace pg::gguf {

// Value constructors. Arrays check that every item has elem_type (nested arrays: ValueType::ARRAY).
Value make_u8(uint8_t x);
Value make_i8(int8_t x);
Value make_u16(uint16_t x);
Value make_i16(int16_t x);
Value make_u32(uint32_t x);
Value make_i32(int32_t x);
Value make_u64(uint64_t x);
Value make_i64(int64_t x);
Value make_f32(float x);
Value make_f64(double x);
Value make_bool(bool x);
Value make_string(std::string s);
Value make_array(ValueType elem_type, std::vector<Value> items);
Value make_string_array(const std::vector<std::string>& items);
Value make_f32_array(std::span<const float> items);
Value make_i32_array(std::span<const int32_t> items);
Value make_u32_array(std::span<const uint32_t> items);

class Writer {
 public:
  // A streamed tensor calls emit() any number of times with the tensor's bytes in order; the sizes
  // must add up to exactly the tensor's byte size (checked). Called once per write().
  using Emit = std::function<void(const void* data, size_t n)>;
  using Producer = std::function<void(const Emit& emit)>;

  Writer() = default;

  // ---- metadata (kept in insertion order; setting an existing key replaces its value in place) ----
  void set(const std::string& key, Value v);
  void set_string(const std::string& key, std::string v) { set(key, make_string(std::move(v))); }
  void set_u32(const std::string& key, uint32_t v) { set(key, make_u32(v)); }
  void set_i32(const std::string& key, int32_t v) { set(key, make_i32(v)); }
  void set_u64(const std::string& key, uint64_t v) { set(key, make_u64(v)); }
  void set_f32(const std::string& key, float v) { set(key, make_f32(v)); }
  void set_bool(const std::string& key, bool v) { set(key, make_bool(v)); }
  // general.alignment (u32, a power of two); 32 when never set.
  void set_alignment(uint32_t alignment);
  uint64_t alignment() const;
  const Value* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  bool remove(const std::string& key);
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }

  // ---- tensors (written in the order added). shape is in ggml order: shape[0] is the row length ----
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape, std::vector<uint8_t> data);
  // The bytes are not copied: they must stay valid until the last write().
  void add_tensor_view(const std::string& name, DType type, const std::vector<int64_t>& shape, std::span<const uint8_t> data);
  void add_tensor_stream(const std::string& name, DType type, const std::vector<int64_t>& shape, Producer producer);
  size_t tensor_count() const { return tensors_.size(); }
  // Bytes of one tensor of this type and shape (validates the shape like add_tensor does).
  static uint64_t tensor_bytes(DType type, const std::vector<int64_t>& shape);

  // Total file size write() will produce.
  uint64_t file_size() const;

  // Writes the file. A regular file is written under a temporary name beside it and renamed into place
  // on success, so a failed or interrupted write never leaves a truncated model at `path`. Other paths
  // (/dev/null, a pipe) are written directly. Throws pg::Error with the path on any I/O failure.
  void write(const std::string& path) const;
  // The same bytes, in memory (tests, fuzz seeds).
  std::vector<uint8_t> write_to_memory() const;
  // The same bytes through a sink that receives them in order.
  void write_to(const Emit& sink) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    std::vector<uint8_t> owned;
    std::span<const uint8_t> view;
    Producer producer;
  };
  void add(Tensor t);
  std::vector<uint8_t> header() const;  // everything before the data section, padded

  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace pg::gguf
