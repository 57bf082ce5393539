#include "gguf/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace pg::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian; this writer copies host integers");

constexpr uint32_t kMagic = 0x46554747u;  // "GGUF"
constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;

Value scalar(ValueType t, decltype(Value::v) v) {
  Value out;
  out.type = t;
  out.v = std::move(v);
  return out;
}

// Checks that the variant alternative matches the declared type and that integers fit it, so a Value
// built by hand cannot produce a file the reader would decode differently.
void validate_value(const std::string& key, const Value& v, int depth) {
  auto bad = [&](const std::string& what) { throw Error("gguf writer: metadata key " + printable(key) + ": " + what); };
  auto need_uint = [&](uint64_t max) {
    const auto* u = std::get_if<uint64_t>(&v.v);
    if (!u) bad(std::string("value of type ") + value_type_name(v.type) + " must hold an unsigned integer");
    if (*u > max) bad("value " + std::to_string(*u) + " does not fit " + value_type_name(v.type));
  };
  auto need_int = [&](int64_t min, int64_t max) {
    const auto* i = std::get_if<int64_t>(&v.v);
    if (!i) bad(std::string("value of type ") + value_type_name(v.type) + " must hold a signed integer");
    if (*i < min || *i > max) bad("value " + std::to_string(*i) + " does not fit " + value_type_name(v.type));
  };
  switch (v.type) {
    case ValueType::UINT8:
      need_uint(UINT8_MAX);
      break;
    case ValueType::UINT16:
      need_uint(UINT16_MAX);
      break;
    case ValueType::UINT32:
      need_uint(UINT32_MAX);
      break;
    case ValueType::UINT64:
      need_uint(UINT64_MAX);
      break;
    case ValueType::INT8:
      need_int(INT8_MIN, INT8_MAX);
      break;
    case ValueType::INT16:
      need_int(INT16_MIN, INT16_MAX);
      break;
    case ValueType::INT32:
      need_int(INT32_MIN, INT32_MAX);
      break;
    case ValueType::INT64:
      need_int(INT64_MIN, INT64_MAX);
      break;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      if (!std::holds_alternative<double>(v.v)) bad("float value must hold a double");
      break;
    case ValueType::BOOL:
      if (!std::holds_alternative<bool>(v.v)) bad("bool value must hold a bool");
      break;
    case ValueType::STRING:
      if (!std::holds_alternative<std::string>(v.v)) bad("string value must hold a string");
      break;
    case ValueType::ARRAY: {
      const auto* a = std::get_if<std::shared_ptr<Array>>(&v.v);
      if (!a || !*a) bad("array value must hold an array");
      if (depth >= kMaxArrayNesting) bad("arrays nested deeper than " + std::to_string(kMaxArrayNesting));
      if (static_cast<uint32_t>((*a)->elem_type) > static_cast<uint32_t>(ValueType::FLOAT64)) bad("unknown array element type");
      for (const auto& item : (*a)->items) {
        if (item.type != (*a)->elem_type)
          bad(std::string("array of ") + value_type_name((*a)->elem_type) + " holds a " + value_type_name(item.type));
        validate_value(key, item, depth + 1);
      }
      break;
    }
    default:
      bad("unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
  }
}

// Appends little-endian bytes to a header buffer.
class Buf {
 public:
  std::vector<uint8_t> b;
  template <typename T>
  void put(T x) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &x, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void put_value(const Value& v) {
    switch (v.type) {
      case ValueType::UINT8:
        put<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.v)));
        break;
      case ValueType::UINT16:
        put<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.v)));
        break;
      case ValueType::UINT32:
        put<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.v)));
        break;
      case ValueType::UINT64:
        put<uint64_t>(std::get<uint64_t>(v.v));
        break;
      case ValueType::INT8:
        put<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.v)));
        break;
      case ValueType::INT16:
        put<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.v)));
        break;
      case ValueType::INT32:
        put<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.v)));
        break;
      case ValueType::INT64:
        put<int64_t>(std::get<int64_t>(v.v));
        break;
      case ValueType::FLOAT32:
        put<float>(static_cast<float>(std::get<double>(v.v)));
        break;
      case ValueType::FLOAT64:
        put<double>(std::get<double>(v.v));
        break;
      case ValueType::BOOL:
        put<uint8_t>(std::get<bool>(v.v) ? 1 : 0);
        break;
      case ValueType::STRING:
        put_string(std::get<std::string>(v.v));
        break;
      case ValueType::ARRAY: {
        const auto& a = *std::get<std::shared_ptr<Array>>(v.v);
        put<uint32_t>(static_cast<uint32_t>(a.elem_type));
        put<uint64_t>(a.items.size());
        for (const auto& item : a.items) put_value(item);
        break;
      }
    }
  }
};

uint64_t pad_to(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// Buffered writes to a file descriptor; a short write or an error is a pg::Error naming the file.
class FdSink {
 public:
  FdSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(kBufSize); }
  void write(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    if (n >= kBufSize) {
      flush();
      raw(p, n);
      return;
    }
    if (buf_.size() + n > kBufSize) flush();
    buf_.insert(buf_.end(), p, p + n);
  }
  void flush() {
    raw(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  static constexpr size_t kBufSize = size_t{8} << 20;
  void raw(const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw Error(path_ + ": write failed: " + std::strerror(errno));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  int fd_;
  std::string path_;
  std::vector<uint8_t> buf_;
};

}  // namespace

Value make_u8(uint8_t x) { return scalar(ValueType::UINT8, uint64_t{x}); }
Value make_i8(int8_t x) { return scalar(ValueType::INT8, int64_t{x}); }
Value make_u16(uint16_t x) { return scalar(ValueType::UINT16, uint64_t{x}); }
Value make_i16(int16_t x) { return scalar(ValueType::INT16, int64_t{x}); }
Value make_u32(uint32_t x) { return scalar(ValueType::UINT32, uint64_t{x}); }
Value make_i32(int32_t x) { return scalar(ValueType::INT32, int64_t{x}); }
Value make_u64(uint64_t x) { return scalar(ValueType::UINT64, x); }
Value make_i64(int64_t x) { return scalar(ValueType::INT64, x); }
// The reader keeps F32 values as the double of the float, so the same is stored here: a round trip
// compares equal.
Value make_f32(float x) { return scalar(ValueType::FLOAT32, static_cast<double>(x)); }
Value make_f64(double x) { return scalar(ValueType::FLOAT64, x); }
Value make_bool(bool x) { return scalar(ValueType::BOOL, x); }
Value make_string(std::string s) { return scalar(ValueType::STRING, std::move(s)); }

Value make_array(ValueType elem_type, std::vector<Value> items) {
  for (const auto& item : items)
    if (item.type != elem_type)
      throw Error(std::string("gguf writer: array of ") + value_type_name(elem_type) + " given a " + value_type_name(item.type));
  auto a = std::make_shared<Array>();
  a->elem_type = elem_type;
  a->items = std::move(items);
  return scalar(ValueType::ARRAY, std::move(a));
}

Value make_string_array(const std::vector<std::string>& items) {
  std::vector<Value> v;
  v.reserve(items.size());
  for (const auto& s : items) v.push_back(make_string(s));
  return make_array(ValueType::STRING, std::move(v));
}

Value make_f32_array(std::span<const float> items) {
  std::vector<Value> v;
  v.reserve(items.size());
  for (float x : items) v.push_back(make_f32(x));
  return make_array(ValueType::FLOAT32, std::move(v));
}

Value make_i32_array(std::span<const int32_t> items) {
  std::vector<Value> v;
  v.reserve(items.size());
  for (int32_t x : items) v.push_back(make_i32(x));
  return make_array(ValueType::INT32, std::move(v));
}

Value make_u32_array(std::span<const uint32_t> items) {
  std::vector<Value> v;
  v.reserve(items.size());
  for (uint32_t x : items) v.push_back(make_u32(x));
  return make_array(ValueType::UINT32, std::move(v));
}

void Writer::set(const std::string& key, Value v) {
  if (key.empty()) throw Error("gguf writer: empty metadata key");
  if (key.size() > kMaxKeyLength) throw Error("gguf writer: metadata key " + printable(key) + " is too long");
  validate_value(key, v, 0);
  if (key == "general.alignment") {
    if (v.type != ValueType::UINT32) throw Error("gguf writer: general.alignment must be a u32");
    const uint64_t al = std::get<uint64_t>(v.v);
    if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
      throw Error("gguf writer: general.alignment " + std::to_string(al) + " is not a power of two between 1 and 1048576");
  }
  if (auto it = kv_index_.find(key); it != kv_index_.end()) {
    kv_[it->second].second = std::move(v);
    return;
  }
  kv_index_[key] = kv_.size();
  kv_.emplace_back(key, std::move(v));
}

void Writer::set_alignment(uint32_t alignment) { set("general.alignment", make_u32(alignment)); }

uint64_t Writer::alignment() const {
  const Value* v = find("general.alignment");
  return v ? std::get<uint64_t>(v->v) : kDefaultAlignment;
}

const Value* Writer::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

bool Writer::remove(const std::string& key) {
  auto it = kv_index_.find(key);
  if (it == kv_index_.end()) return false;
  kv_.erase(kv_.begin() + static_cast<std::ptrdiff_t>(it->second));
  kv_index_.clear();
  for (size_t i = 0; i < kv_.size(); ++i) kv_index_[kv_[i].first] = i;
  return true;
}

uint64_t Writer::tensor_bytes(DType type, const std::vector<int64_t>& shape) {
  if (shape.empty() || shape.size() > static_cast<size_t>(kMaxDims))
    throw Error("gguf writer: a tensor needs 1.." + std::to_string(kMaxDims) + " dimensions, got " +
                std::to_string(shape.size()));
  const auto& tr = traits(type);
  int64_t total = 1;
  for (int64_t ne : shape) {
    if (ne <= 0) throw Error("gguf writer: tensor dimension " + std::to_string(ne) + " is not positive");
    if (__builtin_mul_overflow(total, ne, &total)) throw Error("gguf writer: tensor element count overflows");
  }
  if (shape[0] % tr.block_size != 0)
    throw Error("gguf writer: row of " + std::to_string(shape[0]) + " is not a multiple of the " + std::string(tr.name) +
                " block size " + std::to_string(tr.block_size));
  const uint64_t blocks = static_cast<uint64_t>(total) / tr.block_size;
  if (blocks > std::numeric_limits<uint64_t>::max() / tr.type_size) throw Error("gguf writer: tensor byte size overflows");
  return blocks * tr.type_size;
}

void Writer::add(Tensor t) {
  if (t.name.empty()) throw Error("gguf writer: empty tensor name");
  if (t.name.size() > kMaxTensorNameLength)
    throw Error("gguf writer: tensor name " + printable(t.name) + " is longer than " + std::to_string(kMaxTensorNameLength) +
                " bytes");
  if (tensor_index_.count(t.name)) throw Error("gguf writer: duplicate tensor name " + printable(t.name));
  try {
    t.nbytes = tensor_bytes(t.type, t.shape);
  } catch (const Error& e) {
    throw Error("tensor " + printable(t.name) + ": " + e.what());
  }
  tensor_index_[t.name] = tensors_.size();
  tensors_.push_back(std::move(t));
}

void Writer::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape, std::vector<uint8_t> data) {
  const uint64_t n = data.size();
  Tensor t{name, type, shape, 0, std::move(data), {}, {}};
  add(std::move(t));
  Tensor& added = tensors_.back();
  if (added.nbytes != n) {
    const uint64_t want = added.nbytes;
    tensors_.pop_back();
    tensor_index_.erase(name);
    throw Error("gguf writer: tensor " + printable(name) + " needs " + std::to_string(want) + " bytes, got " + std::to_string(n));
  }
  added.view = std::span<const uint8_t>(added.owned.data(), added.owned.size());
}

void Writer::add_tensor_view(const std::string& name, DType type, const std::vector<int64_t>& shape,
                             std::span<const uint8_t> data) {
  const uint64_t want = tensor_bytes(type, shape);
  if (want != data.size())
    throw Error("gguf writer: tensor " + printable(name) + " needs " + std::to_string(want) + " bytes, got " +
                std::to_string(data.size()));
  add(Tensor{name, type, shape, 0, {}, data, {}});
}

void Writer::add_tensor_stream(const std::string& name, DType type, const std::vector<int64_t>& shape, Producer producer) {
  if (!producer) throw Error("gguf writer: tensor " + printable(name) + " has no producer");
  add(Tensor{name, type, shape, 0, {}, {}, std::move(producer)});
}

std::vector<uint8_t> Writer::header() const {
  const uint64_t al = alignment();
  Buf b;
  b.put<uint32_t>(kMagic);
  b.put<uint32_t>(kVersion);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(kv_.size());
  for (const auto& [key, v] : kv_) {
    b.put_string(key);
    b.put<uint32_t>(static_cast<uint32_t>(v.type));
    b.put_value(v);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    b.put_string(t.name);
    b.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t ne : t.shape) b.put<int64_t>(ne);
    b.put<uint32_t>(static_cast<uint32_t>(t.type));
    b.put<uint64_t>(offset);
    offset += pad_to(t.nbytes, al);
  }
  b.b.resize(pad_to(b.b.size(), al), 0);
  return std::move(b.b);
}

uint64_t Writer::file_size() const {
  const uint64_t al = alignment();
  uint64_t n = header().size();
  for (const auto& t : tensors_) n += pad_to(t.nbytes, al);
  return n;
}

void Writer::write_to(const Emit& sink) const {
  const uint64_t al = alignment();
  const std::vector<uint8_t> head = header();
  sink(head.data(), head.size());
  const std::vector<uint8_t> zeros(al, 0);
  for (const auto& t : tensors_) {
    if (t.producer) {
      uint64_t written = 0;
      const Emit counted = [&](const void* data, size_t n) {
        if (n > t.nbytes - written)
          throw Error("gguf writer: tensor " + printable(t.name) + " producer wrote more than its " + std::to_string(t.nbytes) +
                      " bytes");
        written += n;
        sink(data, n);
      };
      t.producer(counted);
      if (written != t.nbytes)
        throw Error("gguf writer: tensor " + printable(t.name) + " producer wrote " + std::to_string(written) + " of " +
                    std::to_string(t.nbytes) + " bytes");
    } else {
      sink(t.view.data(), t.view.size());
    }
    const uint64_t pad = pad_to(t.nbytes, al) - t.nbytes;
    if (pad) sink(zeros.data(), pad);
  }
}

std::vector<uint8_t> Writer::write_to_memory() const {
  std::vector<uint8_t> out;
  write_to([&](const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out.insert(out.end(), p, p + n);
  });
  return out;
}

void Writer::write(const std::string& path) const {
  struct stat st {};
  const bool special = ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  const std::string target = special ? path : path + ".tmp";
  const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(target + ": cannot create: " + std::strerror(errno));
  bool closed = false;
  try {
    FdSink out(fd, target);
    write_to([&](const void* data, size_t n) { out.write(data, n); });
    out.flush();
    closed = true;  // close() releases the descriptor even when it reports an error
    if (::close(fd) != 0) throw Error(target + ": close failed: " + std::strerror(errno));
  } catch (...) {
    if (!closed) ::close(fd);
    if (!special) ::unlink(target.c_str());
    throw;
  }
  if (!special && ::rename(target.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(target.c_str());
    throw Error(path + ": cannot rename " + target + " into place: " + std::strerror(e));
  }
}

}  // namespace pg::gguf
