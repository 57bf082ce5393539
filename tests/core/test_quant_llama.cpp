// quantize_weights must reproduce llama-quantize byte for byte: the golden quantized models were made by
// llama-quantize (no imatrix) from the shipped F16 models, so quantizing each F16 tensor to the type the
// quantized file uses for it must give exactly the file's bytes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/quant.h"
#include "gguf/gguf.h"
#include "testutil.h"

namespace pg {
namespace {

using test::read_bytes;
using test::shared_path;

struct TypeTally {
  int tensors = 0, exact = 0;
  int64_t blocks = 0, bad_blocks = 0;
};

// Quantizes src (f32) to t and compares with want; returns the number of differing blocks.
int64_t compare_quantized(DType t, const std::vector<float>& src, const uint8_t* want, const std::string& what) {
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<uint8_t> got(row_bytes(t, n));
  quantize_weights(t, src.data(), got.data(), n);
  const size_t bs = traits(t).type_size;
  int64_t bad = 0, first = -1;
  for (size_t b = 0; b < got.size() / bs; ++b) {
    if (std::memcmp(got.data() + b * bs, want + b * bs, bs) != 0) {
      if (first < 0) first = static_cast<int64_t>(b);
      ++bad;
    }
  }
  if (bad)
    ADD_FAILURE() << what << " (" << dtype_name(t) << "): " << bad << " of " << got.size() / bs << " blocks differ, first "
                  << first;
  return bad;
}

std::vector<float> tensor_f32(const gguf::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  dequantize_row(t.type, t.data, v.data(), t.n_elements());
  return v;
}

TEST(LlamaQuantize, EveryTensorOfEveryQuantizedModelIsBitExact) {
  const char* variants[] = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q2_K", "Q3_K_M", "IQ4_XS"};
  std::map<std::string, TypeTally> tally;
  for (const char* arch : {"llama", "qwen3"}) {
    auto base = gguf::File::open(shared_path(std::string("golden/models/tiny-") + arch + "-f16.gguf").string());
    for (const char* v : variants) {
      const std::string file = std::string("golden/models/tiny-") + arch + "-" + v + ".gguf";
      auto q = gguf::File::open(shared_path(file).string());
      int checked = 0;
      for (const auto& t : q->tensors()) {
        if (t.type == DType::F32) continue;  // norms are copied, not quantized
        ASSERT_TRUE(can_quantize(t.type)) << file << " " << t.name << " " << dtype_name(t.type);
        const auto* src = base->find_tensor(t.name);
        ASSERT_NE(src, nullptr) << t.name;
        ASSERT_EQ(src->n_elements(), t.n_elements()) << t.name;
        const auto x = tensor_f32(*src);
        auto& s = tally[std::string(dtype_name(t.type))];
        const int64_t bad = compare_quantized(t.type, x, t.data, file + " " + t.name);
        s.tensors += 1;
        s.exact += bad == 0;
        s.blocks += t.n_elements() / traits(t.type).block_size;
        s.bad_blocks += bad;
        ++checked;
      }
      EXPECT_GT(checked, 10) << file;
    }
  }
  for (const auto& [name, s] : tally)
    std::printf("[ llama-q  ] %-6s %d/%d tensors bit-exact, %lld/%lld blocks differ\n", name.c_str(), s.exact, s.tensors,
                static_cast<long long>(s.bad_blocks), static_cast<long long>(s.blocks));
  // Every quantizer the golden models use was exercised.
  for (const char* t : {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"})
    EXPECT_GT(tally[t].tensors, 0) << t;
}

TEST(LlamaQuantize, KernelWeightFilesAreBitExact) {
  // kernels/{IQ4_NL,BF16}.weight.bin: blk.0.attn_k.weight of tiny-llama-f16 converted by llama-quantize.
  auto base = gguf::File::open(shared_path("golden/models/tiny-llama-f16.gguf").string());
  const auto* src = base->find_tensor("blk.0.attn_k.weight");
  ASSERT_NE(src, nullptr);
  const auto x = tensor_f32(*src);
  for (DType t : {DType::IQ4_NL, DType::BF16}) {
    const auto want = read_bytes(shared_path("golden/kernels/" + std::string(dtype_name(t)) + ".weight.bin"));
    ASSERT_EQ(want.size(), row_bytes(t, static_cast<int64_t>(x.size())));
    EXPECT_EQ(compare_quantized(t, x, want.data(), std::string(dtype_name(t)) + ".weight.bin"), 0);
  }
}

TEST(LlamaQuantize, BlockFfnDownToEachFileType) {
  // The brief's spot check, spelled out: tiny-llama-f16 blk.0.ffn_down.weight to the type each file
  // uses for it.
  auto base = gguf::File::open(shared_path("golden/models/tiny-llama-f16.gguf").string());
  const auto x = tensor_f32(*base->find_tensor("blk.0.ffn_down.weight"));
  for (const char* v : {"Q4_K_M", "Q6_K", "Q8_0", "Q4_0"}) {
    auto q = gguf::File::open(shared_path(std::string("golden/models/tiny-llama-") + v + ".gguf").string());
    const auto* t = q->find_tensor("blk.0.ffn_down.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(compare_quantized(t->type, x, t->data, std::string(v) + " blk.0.ffn_down.weight"), 0);
  }
}

}  // namespace
}  // namespace pg
