#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace pg::gguf {
namespace {

// Each array element becomes a Value (~48 bytes) however few bytes it takes in the file, so a file of
// u8 arrays could ask for ~50x its size in memory. Real vocabularies hold ~1.5M elements in total
// (tokens + scores + types + merges of a 262k vocabulary), so 8M leaves ample room while bounding
// the worst case at about 400 MB.
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 23;

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    case ValueType::STRING:
      return 8;  // at least the length prefix
    case ValueType::ARRAY:
      return 12;  // at least type + count
  }
  return 0;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

// Bounded cursor: every read checks that the bytes are there.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> b, const std::string& name) : b_(b), name_(name) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(name_ + ": invalid GGUF: " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  void need(uint64_t n, const char* what) const {
    if (n > remaining()) fail(std::string("truncated file while reading ") + what);
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what, uint64_t max_len = std::numeric_limits<uint64_t>::max()) {
    const uint64_t len = read<uint64_t>(what);
    if (len > max_len) fail(std::string(what) + " length " + std::to_string(len) + " is too long");
    need(len, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  std::span<const uint8_t> b_;
  const std::string& name_;
  size_t pos_ = 0;
};

Value read_value(Cursor& c, ValueType type, int depth, uint64_t& element_budget) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::UINT8:
      v.v = static_cast<uint64_t>(c.read<uint8_t>("u8 value"));
      break;
    case ValueType::INT8:
      v.v = static_cast<int64_t>(c.read<int8_t>("i8 value"));
      break;
    case ValueType::UINT16:
      v.v = static_cast<uint64_t>(c.read<uint16_t>("u16 value"));
      break;
    case ValueType::INT16:
      v.v = static_cast<int64_t>(c.read<int16_t>("i16 value"));
      break;
    case ValueType::UINT32:
      v.v = static_cast<uint64_t>(c.read<uint32_t>("u32 value"));
      break;
    case ValueType::INT32:
      v.v = static_cast<int64_t>(c.read<int32_t>("i32 value"));
      break;
    case ValueType::UINT64:
      v.v = c.read<uint64_t>("u64 value");
      break;
    case ValueType::INT64:
      v.v = c.read<int64_t>("i64 value");
      break;
    case ValueType::FLOAT32:
      v.v = static_cast<double>(c.read<float>("f32 value"));
      break;
    case ValueType::FLOAT64:
      v.v = c.read<double>("f64 value");
      break;
    case ValueType::BOOL: {
      const uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.fail("bool value " + std::to_string(b) + " is neither 0 nor 1");
      v.v = b != 0;
      break;
    }
    case ValueType::STRING:
      v.v = c.read_string("string value");
      break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayNesting) c.fail("arrays nested deeper than " + std::to_string(kMaxArrayNesting));
      const uint32_t et = c.read<uint32_t>("array element type");
      if (!valid_value_type(et)) c.fail("unknown array element type " + std::to_string(et));
      const uint64_t n = c.read<uint64_t>("array length");
      const auto elem = static_cast<ValueType>(et);
      // Each element takes at least scalar_size bytes, so a count the file cannot hold is rejected
      // before anything is allocated.
      if (n > c.remaining() / scalar_size(elem)) c.fail("array length " + std::to_string(n) + " exceeds the file");
      if (n > element_budget)
        c.fail("metadata arrays hold more than " + std::to_string(kMaxArrayElements) + " elements in total");
      element_budget -= n;
      auto arr = std::make_shared<Array>();
      arr->elem_type = elem;
      arr->items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) arr->items.push_back(read_value(c, elem, depth + 1, element_budget));
      v.v = std::move(arr);
      break;
    }
  }
  return v;
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not one.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  size_t n;
  uint32_t cp;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
    cp = b0 & 0x1f;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    cp = b0 & 0x0f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3f);
  }
  // Reject overlong forms, surrogates and code points past U+10FFFF.
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

}  // namespace

std::string escape_text(std::string_view s, size_t max_bytes, bool* cut, bool quoted) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes) + 8);
  size_t i = 0;
  while (i < s.size() && i < max_bytes) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_sequence_length(s, i);
    if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (quoted && (b == '"' || b == '\\')) {
      out.push_back('\\');
      out.push_back(static_cast<char>(b));
    } else if (n == 1 && b >= 0x20 && b != 0x7f) {
      out.push_back(static_cast<char>(b));
    } else if (b == '\n') {
      out += "\\n";
    } else if (b == '\t') {
      out += "\\t";
    } else if (b == '\r') {
      out += "\\r";
    } else {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[b >> 4]);
      out.push_back(hex[b & 15]);
    }
    ++i;
  }
  const bool was_cut = i < s.size();
  if (was_cut) out += "...";
  if (cut) *cut = was_cut;
  return out;
}

std::string printable(std::string_view s, size_t max_bytes) {
  std::string out(1, '\'');
  out += escape_text(s, max_bytes);
  out.push_back('\'');
  return out;
}

const char* value_type_name(ValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "?";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::UINT16:
    case ValueType::INT16:
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::UINT64:
    case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

int64_t Value::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) throw Error("integer value out of range");
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
  throw Error(std::string("expected an integer, found ") + value_type_name(type));
}

uint64_t Value::as_uint() const {
  if (const auto* u = std::get_if<uint64_t>(&v)) return *u;
  const int64_t i = as_int();
  if (i < 0) throw Error("expected a non-negative integer, found " + std::to_string(i));
  return static_cast<uint64_t>(i);
}

double Value::as_float() const {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  throw Error(std::string("expected a number, found ") + value_type_name(type));
}

bool Value::as_bool() const {
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  if (is_integer()) return as_int() != 0;
  throw Error(std::string("expected a bool, found ") + value_type_name(type));
}

const std::string& Value::as_string() const {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  throw Error(std::string("expected a string, found ") + value_type_name(type));
}

const Array& Value::as_array() const {
  if (const auto* a = std::get_if<std::shared_ptr<Array>>(&v)) return **a;
  throw Error(std::string("expected an array, found ") + value_type_name(type));
}

std::string Value::to_display(size_t max_items) const {
  std::ostringstream os;
  switch (type) {
    case ValueType::STRING: {
      const auto& s = as_string();
      bool cut = false;
      os << '"' << escape_text(s, 60, &cut) << '"';
      if (cut) os << " (" << s.size() << " bytes)";
      break;
    }
    case ValueType::ARRAY: {
      const auto& a = as_array();
      os << "[" << value_type_name(a.elem_type) << " x " << a.items.size() << "] [";
      for (size_t i = 0; i < a.items.size() && i < max_items; ++i) os << (i ? ", " : "") << a.items[i].to_display(max_items);
      if (a.items.size() > max_items) os << ", ...";
      os << "]";
      break;
    }
    case ValueType::BOOL:
      os << (as_bool() ? "true" : "false");
      break;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      os << as_float();
      break;
    default:
      if (const auto* u = std::get_if<uint64_t>(&v))
        os << *u;
      else
        os << std::get<int64_t>(v);
  }
  return os.str();
}

std::string TensorInfo::shape_string() const {
  std::string s = "{";
  for (int i = 0; i < n_dims; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

std::unique_ptr<File> File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  std::unique_ptr<File> f(new File());
  f->path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      throw Error(path + ": mmap failed: " + std::strerror(errno));
    }
    f->map_ = m;
    f->map_size_ = size;
    f->bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(m), size);
  }
  ::close(fd);
  f->parse();
  return f;
}

std::unique_ptr<File> File::from_memory(std::span<const uint8_t> bytes, const std::string& name) {
  std::unique_ptr<File> f(new File());
  f->path_ = name;
  f->bytes_ = bytes;
  f->parse();
  return f;
}

File::~File() {
  if (map_) munmap(map_, map_size_);
}

void File::parse() {
  Cursor c(bytes_, path_);
  if (bytes_.size() < 4) c.fail("file too short to be GGUF (" + std::to_string(bytes_.size()) + " bytes)");
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != 0x46554747u) c.fail("bad magic (not a GGUF file)");  // "GGUF" little-endian
  version_ = c.read<uint32_t>("version");
  if (version_ == 1) c.fail("GGUF version 1 is not supported (convert the file with a newer llama.cpp)");
  if (version_ != 2 && version_ != 3) {
    // A big-endian writer stores small versions byte-swapped: 3 reads as 0x03000000 here.
    if ((version_ & 0xffff) == 0 && version_ != 0) c.fail("big-endian GGUF files are not supported");
    c.fail("unsupported GGUF version " + std::to_string(version_));
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A tensor record is at least 8 (name len) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes;
  // a kv at least 8 (key len) + 1 (key) + 4 (type) + 1 (value). Counts the file cannot hold are
  // rejected before anything is reserved.
  const std::string left =
      " cannot fit in the " + std::to_string(c.remaining()) + " bytes that follow (truncated or corrupt file)";
  if (n_tensors > c.remaining() / 32) c.fail("tensor count " + std::to_string(n_tensors) + left);
  if (n_kv > c.remaining() / 14) c.fail("metadata count " + std::to_string(n_kv) + left);

  uint64_t element_budget = kMaxArrayElements;
  kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key", kMaxKeyLength);
    if (key.empty()) c.fail("empty metadata key");
    const uint32_t t = c.read<uint32_t>("metadata value type");
    if (!valid_value_type(t)) c.fail("unknown metadata value type " + std::to_string(t) + " for key " + printable(key));
    Value v = read_value(c, static_cast<ValueType>(t), 0, element_budget);
    if (kv_index_.count(key)) c.fail("duplicate metadata key " + printable(key));
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    // The spec (and ggml) require a u32; a power of two keeps offsets cheap to check. 1 MiB is far
    // beyond any real alignment (32 is the default, 64 or 4096 are seen).
    if (a->type != ValueType::UINT32) c.fail(std::string("general.alignment must be a u32, found ") + value_type_name(a->type));
    const uint64_t al = a->as_uint();
    if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
      c.fail("general.alignment " + std::to_string(al) + " is not a power of two between 1 and 1048576");
    alignment_ = al;
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = c.read_string("tensor name", kMaxKeyLength);
    if (t.name.empty()) c.fail("tensor " + std::to_string(i) + " has an empty name");
    if (t.name.size() > kMaxTensorNameLength)
      c.fail("tensor name " + printable(t.name) + " is longer than " + std::to_string(kMaxTensorNameLength) + " bytes");
    const std::string shown = printable(t.name);
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.fail("tensor " + shown + " has " + std::to_string(n_dims) + " dimensions (1.." + std::to_string(kMaxDims) + " allowed)");
    t.n_dims = static_cast<int>(n_dims);
    int64_t total = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const int64_t ne = c.read<int64_t>("tensor dimension");
      if (ne <= 0) c.fail("tensor " + shown + " has dimension " + std::to_string(d) + " of size " + std::to_string(ne));
      if (__builtin_mul_overflow(total, ne, &total)) c.fail("tensor " + shown + " element count overflows");
      t.ne[d] = ne;
    }
    const uint32_t type = c.read<uint32_t>("tensor type");
    const auto tr = dtype_traits(type);
    if (!tr) c.fail("tensor " + shown + " has unknown type " + std::to_string(type));
    t.type = tr->type;
    if (t.ne[0] % tr->block_size != 0)
      c.fail("tensor " + shown + " row of " + std::to_string(t.ne[0]) + " is not a multiple of the " + std::string(tr->name) +
             " block size " + std::to_string(tr->block_size));
    const uint64_t blocks = static_cast<uint64_t>(total) / tr->block_size;
    if (blocks > std::numeric_limits<uint64_t>::max() / tr->type_size) c.fail("tensor " + shown + " byte size overflows");
    t.nbytes = blocks * tr->type_size;
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0)
      c.fail("tensor " + shown + " offset " + std::to_string(t.offset) + " is not aligned to " + std::to_string(alignment_));
    if (tensor_index_.count(t.name)) c.fail("duplicate tensor name " + shown);
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t pos = c.pos();
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > bytes_.size())
    c.fail("data section (at byte " + std::to_string(data_offset_) + ") starts past the end of the file");
  const uint64_t data_size = bytes_.size() > data_offset_ ? bytes_.size() - data_offset_ : 0;
  auto fail_tensor = [&](const TensorInfo& t, const std::string& what) {
    throw Error(path_ + ": invalid GGUF: tensor " + printable(t.name) + " data (offset " + std::to_string(t.offset) + ", " +
                std::to_string(t.nbytes) + " bytes) " + what);
  };
  for (auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail_tensor(t, "extends past the end of the file (data section holds " + std::to_string(data_size) + " bytes)");
    t.data = bytes_.data() + data_offset_ + t.offset;
  }
  // Overlapping tensors would alias each other's weights; no writer produces them (ggml even requires
  // the tensors to be packed in order), so they are a sign of a damaged or crafted file.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    if (by_offset[i]->offset < prev.offset + prev.nbytes) fail_tensor(*by_offset[i], "overlaps tensor " + printable(prev.name));
  }
}

const Value* File::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const Value& File::get(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": missing metadata key '" + key + "'");
  return *v;
}

template <typename F>
static auto with_key(const std::string& path, const std::string& key, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(path + ": metadata key '" + key + "': " + e.what());
  }
}

std::string File::get_string(const std::string& key) const {
  return with_key(path_, key, [&] { return get(key).as_string(); });
}
int64_t File::get_int(const std::string& key) const {
  return with_key(path_, key, [&] { return get(key).as_int(); });
}
double File::get_float(const std::string& key) const {
  return with_key(path_, key, [&] { return get(key).as_float(); });
}
bool File::get_bool(const std::string& key) const {
  return with_key(path_, key, [&] { return get(key).as_bool(); });
}
std::optional<std::string> File::get_string_opt(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}
std::optional<int64_t> File::get_int_opt(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_int(key);
}
std::optional<double> File::get_float_opt(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}
std::optional<bool> File::get_bool_opt(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_bool(key);
}

std::vector<std::string> File::get_string_array(const std::string& key) const {
  return with_key(path_, key, [&] {
    std::vector<std::string> out;
    const auto& a = get(key).as_array();
    out.reserve(a.items.size());
    for (const auto& v : a.items) out.push_back(v.as_string());
    return out;
  });
}
std::vector<float> File::get_float_array(const std::string& key) const {
  return with_key(path_, key, [&] {
    std::vector<float> out;
    const auto& a = get(key).as_array();
    out.reserve(a.items.size());
    for (const auto& v : a.items) out.push_back(static_cast<float>(v.as_float()));
    return out;
  });
}
std::vector<int64_t> File::get_int_array(const std::string& key) const {
  return with_key(path_, key, [&] {
    std::vector<int64_t> out;
    const auto& a = get(key).as_array();
    out.reserve(a.items.size());
    for (const auto& v : a.items) out.push_back(v.as_int());
    return out;
  });
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string File::architecture() const { return get_string_opt("general.architecture").value_or(""); }

}  // namespace pg::gguf
