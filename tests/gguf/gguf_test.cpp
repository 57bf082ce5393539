// Reader hardening, writer round trips and inspect formatting.
#include "gguf/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "core/error.h"
#include "gguf/inspect.h"
#include "gguf/writer.h"
#include "testutil.h"

namespace pg::gguf {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Deep equality of values, comparing floats by bits so NaN round trips count.
bool same(const Value& a, const Value& b) {
  if (a.type != b.type || a.v.index() != b.v.index()) return false;
  if (a.type == ValueType::ARRAY) {
    const auto& x = a.as_array();
    const auto& y = b.as_array();
    if (x.elem_type != y.elem_type || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
      if (!same(x.items[i], y.items[i])) return false;
    return true;
  }
  if (a.is_float()) {
    const double p = std::get<double>(a.v), q = std::get<double>(b.v);
    return std::memcmp(&p, &q, sizeof p) == 0;
  }
  return a.v == b.v;
}

// A writer holding every value type, nested arrays and tensors of several types and ranks.
Writer rich_writer(uint32_t alignment = 32) {
  Writer w;
  w.set_string("general.architecture", "llama");
  if (alignment != 32) w.set_alignment(alignment);
  w.set("t.u8", make_u8(255));
  w.set("t.i8", make_i8(-128));
  w.set("t.u16", make_u16(65535));
  w.set("t.i16", make_i16(-32768));
  w.set("t.u32", make_u32(4294967295u));
  w.set("t.i32", make_i32(std::numeric_limits<int32_t>::min()));
  w.set("t.u64", make_u64(std::numeric_limits<uint64_t>::max()));
  w.set("t.i64", make_i64(std::numeric_limits<int64_t>::min()));
  w.set("t.f32", make_f32(1e-5f));
  w.set("t.f32_nan", make_f32(std::numeric_limits<float>::quiet_NaN()));
  w.set("t.f64", make_f64(-0.1));
  w.set("t.bool_t", make_bool(true));
  w.set("t.bool_f", make_bool(false));
  w.set("t.str", make_string("héllo\nwörld 🙂"));
  w.set("t.str_nul", make_string(std::string("a\0b", 3)));
  w.set("t.str_empty", make_string(""));
  w.set("t.arr_str", make_string_array({"<unk>", "", "Ġthe", "\xff\xfe"}));
  const float fs[] = {0.5f, -1.25f, 3e38f};
  w.set("t.arr_f32", make_f32_array(fs));
  const int32_t is[] = {1, -2, 3};
  w.set("t.arr_i32", make_i32_array(is));
  w.set("t.arr_empty", make_array(ValueType::UINT64, {}));
  w.set("t.arr_bool", make_array(ValueType::BOOL, {make_bool(true), make_bool(false)}));
  w.set("t.arr_i8", make_array(ValueType::INT8, {make_i8(-1), make_i8(127)}));
  w.set("t.arr_arr", make_array(ValueType::ARRAY, {make_i32_array(is), make_array(ValueType::INT32, {})}));
  // Four levels of arrays: the deepest the reader accepts.
  Value deep = make_array(ValueType::STRING, {make_string("leaf")});
  for (int i = 0; i < 3; ++i) deep = make_array(ValueType::ARRAY, {deep});
  w.set("t.arr_deep", deep);

  w.add_tensor("f32.weight", DType::F32, {8}, random_bytes(32, 1));
  w.add_tensor("f16.weight", DType::F16, {16, 3}, random_bytes(96, 2));
  w.add_tensor("q8.weight", DType::Q8_0, {64, 2, 2}, random_bytes(34 * 2 * 2 * 2, 3));
  w.add_tensor("q4k.weight", DType::Q4_K, {256, 1, 2, 2}, random_bytes(144 * 4, 4));
  w.add_tensor("bf16.weight", DType::BF16, {5}, random_bytes(10, 5));
  return w;
}

// ---- writer round trips --------------------------------------------------------------------------

TEST(GgufWriter, RoundTripsEveryValueTypeAndTensor) {
  for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    const Writer w = rich_writer(alignment);
    const auto bytes = w.write_to_memory();
    EXPECT_EQ(bytes.size(), w.file_size());
    const auto f = File::from_memory(bytes);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    ASSERT_EQ(f->metadata().size(), w.metadata().size());
    for (size_t i = 0; i < w.metadata().size(); ++i) {
      EXPECT_EQ(f->metadata()[i].first, w.metadata()[i].first);
      EXPECT_TRUE(same(f->metadata()[i].second, w.metadata()[i].second)) << w.metadata()[i].first;
    }
    ASSERT_EQ(f->tensors().size(), 5u);
    const auto* q4k = f->find_tensor("q4k.weight");
    ASSERT_NE(q4k, nullptr);
    EXPECT_EQ(q4k->type, DType::Q4_K);
    EXPECT_EQ(q4k->n_dims, 4);
    EXPECT_EQ(q4k->ne[0], 256);
    EXPECT_EQ(q4k->ne[3], 2);
    EXPECT_EQ(q4k->nbytes, 144u * 4);
    EXPECT_EQ(q4k->offset % alignment, 0u);
    EXPECT_EQ(std::memcmp(q4k->data, random_bytes(144 * 4, 4).data(), q4k->nbytes), 0);
    const auto* bf16 = f->find_tensor("bf16.weight");
    ASSERT_NE(bf16, nullptr);
    EXPECT_EQ(std::memcmp(bf16->data, random_bytes(10, 5).data(), 10), 0);
    EXPECT_EQ(f->get_int("t.i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f->get("t.u64").as_uint(), std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(f->get_string("t.str_nul"), std::string("a\0b", 3));
    EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("t.f32")), 1e-5f);
    EXPECT_EQ(f->get_string_array("t.arr_str")[3], "\xff\xfe");
    EXPECT_EQ(f->get("t.arr_deep").as_array().items[0].as_array().items[0].as_array().items[0].as_array().items[0].as_string(),
              "leaf");
  }
}

TEST(GgufWriter, WritesFilesAtomicallyAndIdenticalToMemory) {
  test::TempDir dir;
  const auto path = (dir.path() / "m.gguf").string();
  const Writer w = rich_writer();
  w.write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(test::read_bytes(path), w.write_to_memory());
  const auto f = File::open(path);
  EXPECT_EQ(f->tensors().size(), 5u);

  // A failing producer leaves the previous file untouched and no temporary behind.
  Writer bad;
  bad.set_string("general.architecture", "llama");
  bad.add_tensor_stream("x.weight", DType::F32, {4}, [](const Writer::Emit& emit) {
    const float v[2] = {1, 2};
    emit(v, sizeof v);  // 8 of 16 bytes
  });
  EXPECT_THROW(bad.write(path), Error);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(test::read_bytes(path), w.write_to_memory());

  Writer over;
  over.add_tensor_stream("x.weight", DType::F32, {1}, [](const Writer::Emit& emit) {
    const float v[2] = {1, 2};
    emit(v, sizeof v);  // 8 of 4 bytes
  });
  EXPECT_THROW(over.write_to_memory(), Error);

  EXPECT_THROW(w.write((dir.path() / "no_such_dir" / "m.gguf").string()), Error);
}

TEST(GgufWriter, StreamsTensorDataInChunks) {
  Writer w;
  std::vector<uint8_t> expect(34 * 1000);
  for (size_t i = 0; i < expect.size(); ++i) expect[i] = static_cast<uint8_t>(i * 7 + 3);
  int calls = 0;
  w.add_tensor_stream("big.weight", DType::Q8_0, {3200, 10}, [&](const Writer::Emit& emit) {
    ++calls;
    for (size_t at = 0; at < expect.size(); at += 1234) emit(expect.data() + at, std::min<size_t>(1234, expect.size() - at));
  });
  w.add_tensor_view("view.weight", DType::F32, {3}, std::span<const uint8_t>(expect.data(), 12));
  const auto bytes = w.write_to_memory();
  EXPECT_EQ(calls, 1);
  const auto f = File::from_memory(bytes);
  const auto* t = f->find_tensor("big.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->nbytes, expect.size());
  EXPECT_EQ(std::memcmp(t->data, expect.data(), expect.size()), 0);
  EXPECT_EQ(std::memcmp(f->find_tensor("view.weight")->data, expect.data(), 12), 0);
}

TEST(GgufWriter, ReplacingAKeyKeepsItsPlace) {
  Writer w;
  w.set_u32("a", 1);
  w.set_u32("b", 2);
  w.set_string("a", "x");
  ASSERT_EQ(w.metadata().size(), 2u);
  EXPECT_EQ(w.metadata()[0].first, "a");
  EXPECT_EQ(w.metadata()[0].second.as_string(), "x");
  EXPECT_TRUE(w.remove("a"));
  EXPECT_FALSE(w.remove("a"));
  EXPECT_EQ(w.find("b")->as_int(), 2);
  EXPECT_EQ(w.find("a"), nullptr);
}

TEST(GgufWriter, RejectsInvalidInput) {
  Writer w;
  EXPECT_THROW(w.set("", make_u8(1)), Error);
  EXPECT_THROW(w.set_alignment(0), Error);
  EXPECT_THROW(w.set_alignment(48), Error);
  EXPECT_THROW(w.set("general.alignment", make_u64(32)), Error);
  Value five = make_array(ValueType::UINT8, {make_u8(1)});
  for (int i = 0; i < 4; ++i) five = make_array(ValueType::ARRAY, {five});
  EXPECT_THROW(w.set("deep", five), Error);
  EXPECT_THROW(make_array(ValueType::INT32, {make_u8(1)}), Error);
  Value lying;
  lying.type = ValueType::UINT8;
  lying.v = uint64_t{300};
  EXPECT_THROW(w.set("lie", lying), Error);
  lying.type = ValueType::STRING;
  EXPECT_THROW(w.set("lie", lying), Error);

  EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, std::vector<uint8_t>(15)), Error);
  EXPECT_EQ(w.tensor_count(), 0u);
  w.add_tensor("a", DType::F32, {4}, std::vector<uint8_t>(16));
  EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, std::vector<uint8_t>(16)), Error);
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), DType::F32, {4}, std::vector<uint8_t>(16)), Error);
  EXPECT_THROW(w.add_tensor("", DType::F32, {4}, std::vector<uint8_t>(16)), Error);
  EXPECT_THROW(w.add_tensor("b", DType::F32, {}, {}), Error);
  EXPECT_THROW(w.add_tensor("b", DType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)), Error);
  EXPECT_THROW(w.add_tensor("b", DType::F32, {0}, {}), Error);
  EXPECT_THROW(w.add_tensor("b", DType::F32, {-4}, {}), Error);
  EXPECT_THROW(w.add_tensor("b", DType::Q4_0, {33}, std::vector<uint8_t>(18)), Error);
  EXPECT_THROW(w.add_tensor_stream("b", DType::F32, {int64_t{1} << 62, 4}, [](const Writer::Emit&) {}), Error);
  EXPECT_EQ(Writer::tensor_bytes(DType::Q6_K, {4096, 4096}), 4096u * 16 * 210);
}

// A copy through the writer of every golden model (metadata values as read, tensor bytes as views)
// is byte-identical to the original: the writer produces exactly gguf-py's / ggml's layout.
TEST(GgufWriter, RewritesGoldenModelsByteForByte) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::shared_path("golden/models"))) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().filename().string());
    const auto f = File::open(e.path().string());
    Writer w;
    for (const auto& [key, v] : f->metadata()) w.set(key, v);
    for (const auto& t : f->tensors())
      w.add_tensor_view(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::span<const uint8_t>(t.data, t.nbytes));
    const auto original = test::read_bytes(e.path());
    const auto copy = w.write_to_memory();
    ASSERT_EQ(copy.size(), original.size());
    EXPECT_TRUE(copy == original);
    ++n;
  }
  EXPECT_GE(n, 29);
}

// ---- reader hardening -----------------------------------------------------------------------------

TEST(GgufReader, EveryTruncationOfAValidFileFails) {
  const auto bytes = rich_writer(64).write_to_memory();
  const auto full = File::from_memory(bytes);
  const auto& last = full->tensors().back();
  const size_t end_of_data = full->data_offset() + last.offset + last.nbytes;
  for (size_t n = 0; n < bytes.size(); ++n) {
    // The last tensor's padding is not data: cutting only padding still leaves a valid file.
    const auto f_ok = [&] {
      try {
        File::from_memory(std::span<const uint8_t>(bytes.data(), n));
        return true;
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
        return false;
      }
    }();
    EXPECT_EQ(f_ok, n >= end_of_data) << "prefix of " << n << " bytes";
  }
}

TEST(GgufReader, EverySingleByteCorruptionIsHandled) {
  const auto bytes = rich_writer().write_to_memory();
  const auto full = File::from_memory(bytes);
  const size_t header_end = full->data_offset();
  std::vector<uint8_t> b = bytes;
  int rejected = 0;
  for (size_t i = 0; i < header_end; ++i) {
    for (uint8_t x : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x80}, static_cast<uint8_t>(bytes[i] ^ 1)}) {
      if (x == bytes[i]) continue;
      b[i] = x;
      try {
        const auto f = File::from_memory(b);
        // Whatever parsed must be usable: render it all.
        (void)inspect(*f);
      } catch (const Error& e) {
        ++rejected;
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      }
      b[i] = bytes[i];
    }
  }
  EXPECT_GT(rejected, 100);
}

TEST(GgufReader, RejectsArraysBeyondTheElementBudget) {
  // One u8 array of 2^23 + 1 elements: the file holds it, the budget does not.
  const uint64_t n = (uint64_t{1} << 23) + 1;
  std::vector<uint8_t> b;
  auto put = [&](const void* p, size_t k) {
    b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + k);
  };
  const uint32_t magic = 0x46554747u, version = 3, type_arr = 9, type_u8 = 0;
  const uint64_t nt = 0, nkv = 1, klen = 1;
  put(&magic, 4);
  put(&version, 4);
  put(&nt, 8);
  put(&nkv, 8);
  put(&klen, 8);
  put("k", 1);
  put(&type_arr, 4);
  put(&type_u8, 4);
  put(&n, 8);
  b.resize(b.size() + n, 1);
  try {
    File::from_memory(b);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("elements in total"), std::string::npos) << e.what();
  }
  // One element fewer is fine.
  const uint64_t ok = n - 1;
  std::memcpy(b.data() + 4 + 4 + 8 + 8 + 8 + 1 + 4 + 4, &ok, 8);
  b.pop_back();
  EXPECT_EQ(File::from_memory(b)->get("k").as_array().items.size(), ok);
}

TEST(GgufReader, TypedGettersNameTheKey) {
  const auto bytes = rich_writer().write_to_memory();
  const auto f = File::from_memory(bytes, "x.gguf");
  try {
    f->get_int("t.str");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.str"), std::string::npos);
  }
  EXPECT_THROW(f->get_string("missing"), Error);
  EXPECT_FALSE(f->get_int_opt("missing").has_value());
  EXPECT_THROW(f->get_int_opt("t.str"), Error);
  EXPECT_THROW(f->get_int("t.u64"), Error);  // does not fit int64
  EXPECT_EQ(f->get_int("t.u8"), 255);
  EXPECT_EQ(f->get_bool("t.bool_t"), true);
  EXPECT_EQ(f->architecture(), "llama");
}

TEST(GgufReader, EscapesTextForMessages) {
  EXPECT_EQ(escape_text("plain"), "plain");
  EXPECT_EQ(escape_text("a\nb\tc\r"), "a\\nb\\tc\\r");
  EXPECT_EQ(escape_text(std::string("\x01\x7f", 2)), "\\x01\\x7f");
  EXPECT_EQ(escape_text("ü🙂"), "ü🙂");
  EXPECT_EQ(escape_text("\xff\xc3"), "\\xff\\xc3");           // invalid / truncated UTF-8
  EXPECT_EQ(escape_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(escape_text("\xc0\xaf"), "\\xc0\\xaf");           // overlong
  bool cut = false;
  EXPECT_EQ(escape_text(std::string(100, 'x'), 10, &cut), std::string(10, 'x') + "...");
  EXPECT_TRUE(cut);
  EXPECT_EQ(escape_text("say \"hi\" \\", 80, nullptr, true), "say \\\"hi\\\" \\\\");
  EXPECT_EQ(printable("a'b"), "'a'b'");
}

// ---- inspect -------------------------------------------------------------------------------------

TEST(GgufInspect, FormatsValues) {
  InspectOptions opt;
  EXPECT_EQ(format_value(make_u32(42), opt), "42");
  EXPECT_EQ(format_value(make_i64(-7), opt), "-7");
  EXPECT_EQ(format_value(make_f32(1e-5f), opt), "1e-05");
  EXPECT_EQ(format_value(make_f32(10000.0f), opt), "10000");
  EXPECT_EQ(format_value(make_f32(0.1f), opt), "0.1");
  EXPECT_EQ(format_value(make_f64(0.1), opt), "0.1");
  EXPECT_EQ(format_value(make_bool(false), opt), "false");
  EXPECT_EQ(format_value(make_string("a\"b\nc"), opt), "\"a\\\"b\\nc\"");
  opt.max_string_bytes = 4;
  EXPECT_EQ(format_value(make_string("abcdefgh"), opt), "\"abcd...\" (8 bytes)");
  opt.max_array_items = 3;
  const int32_t xs[] = {1, 2, 3, 4, 5};
  EXPECT_EQ(format_value(make_i32_array(xs), opt), "[1, 2, 3, ... (5 items)]");
  EXPECT_EQ(format_value(make_i32_array(std::span<const int32_t>(xs, 3)), opt), "[1, 2, 3]");
  EXPECT_EQ(format_value(make_array(ValueType::STRING, {}), opt), "[]");
  opt.max_array_items = 0;
  EXPECT_EQ(format_value(make_i32_array(xs), opt), "[1, 2, 3, 4, 5]");
  EXPECT_EQ(type_string(make_i32_array(xs)), "arr[i32,5]");
  EXPECT_EQ(type_string(make_array(ValueType::ARRAY, {make_i32_array(xs)})), "arr[arr[i32,5],1]");
  EXPECT_EQ(type_string(make_string("x")), "str");
  EXPECT_EQ(with_commas(1234567), "1,234,567");
  EXPECT_EQ(with_commas(12), "12");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(100), "100 B");
  EXPECT_EQ(human_count(8190735360ull), "8.19B");
}

TEST(GgufInspect, PrintsHeaderMetadataTensorsAndTotals) {
  const auto bytes = rich_writer(64).write_to_memory();
  const auto f = File::from_memory(bytes, "rich.gguf");
  const std::string out = inspect(*f);
  EXPECT_NE(out.find("version:     3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("alignment:   64\n"), std::string::npos);
  EXPECT_NE(out.find("data offset: " + std::to_string(f->data_offset()) + "\n"), std::string::npos);
  EXPECT_NE(out.find("t.arr_str"), std::string::npos);
  EXPECT_NE(out.find("arr[str,4]"), std::string::npos);
  EXPECT_NE(out.find("\"héllo\\nwörld 🙂\""), std::string::npos) << out;
  EXPECT_NE(out.find("q4k.weight"), std::string::npos);
  EXPECT_NE(out.find("{256, 1, 2, 2}"), std::string::npos);
  const auto totals = tensor_totals(*f);
  EXPECT_EQ(totals.tensors, 5u);
  EXPECT_EQ(totals.params, 8u + 48 + 256 + 1024 + 5);
  EXPECT_EQ(totals.by_type.at(DType::Q8_0).bytes, 34u * 8);
  EXPECT_NE(out.find("parameters: 1,341 (1.34K)"), std::string::npos) << out;
  // Every output line is a single line: newlines inside values are escaped.
  for (size_t at = 0, nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1)
    EXPECT_LT(nl - at, 400u) << out.substr(at, 80);
  InspectOptions no_tensors;
  no_tensors.tensors = false;
  EXPECT_EQ(inspect(*f, no_tensors).find("q4k.weight"), std::string::npos);
}

}  // namespace
}  // namespace pg::gguf
