#include "core/dtype.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace pg {
namespace {

constexpr std::array kTraits = {
    DTypeTraits{DType::F32, "F32", 1, 4, true},
    DTypeTraits{DType::F16, "F16", 1, 2, true},
    DTypeTraits{DType::Q4_0, "Q4_0", 32, 18, true},
    DTypeTraits{DType::Q4_1, "Q4_1", 32, 20, true},
    DTypeTraits{DType::Q5_0, "Q5_0", 32, 22, true},
    DTypeTraits{DType::Q5_1, "Q5_1", 32, 24, true},
    DTypeTraits{DType::Q8_0, "Q8_0", 32, 34, true},
    DTypeTraits{DType::Q8_1, "Q8_1", 32, 36, true},
    DTypeTraits{DType::Q2_K, "Q2_K", 256, 84, true},
    DTypeTraits{DType::Q3_K, "Q3_K", 256, 110, true},
    DTypeTraits{DType::Q4_K, "Q4_K", 256, 144, true},
    DTypeTraits{DType::Q5_K, "Q5_K", 256, 176, true},
    DTypeTraits{DType::Q6_K, "Q6_K", 256, 210, true},
    DTypeTraits{DType::Q8_K, "Q8_K", 256, 292, true},
    DTypeTraits{DType::IQ2_XXS, "IQ2_XXS", 256, 66, false},
    DTypeTraits{DType::IQ2_XS, "IQ2_XS", 256, 74, false},
    DTypeTraits{DType::IQ3_XXS, "IQ3_XXS", 256, 98, false},
    DTypeTraits{DType::IQ1_S, "IQ1_S", 256, 50, false},
    DTypeTraits{DType::IQ4_NL, "IQ4_NL", 32, 18, true},
    DTypeTraits{DType::IQ3_S, "IQ3_S", 256, 110, false},
    DTypeTraits{DType::IQ2_S, "IQ2_S", 256, 82, false},
    DTypeTraits{DType::IQ4_XS, "IQ4_XS", 256, 136, true},
    DTypeTraits{DType::I8, "I8", 1, 1, false},
    DTypeTraits{DType::I16, "I16", 1, 2, false},
    DTypeTraits{DType::I32, "I32", 1, 4, false},
    DTypeTraits{DType::I64, "I64", 1, 8, false},
    DTypeTraits{DType::F64, "F64", 1, 8, false},
    DTypeTraits{DType::IQ1_M, "IQ1_M", 256, 56, false},
    DTypeTraits{DType::BF16, "BF16", 1, 2, true},
    DTypeTraits{DType::TQ1_0, "TQ1_0", 256, 54, false},
    DTypeTraits{DType::TQ2_0, "TQ2_0", 256, 66, false},
    DTypeTraits{DType::MXFP4, "MXFP4", 32, 17, false},
    // 32 values in 14 bytes (fp16 norm + 2-bit low index + 1-bit high index); 4 blocks form a 128-value group.
    // "supported" is the weight path's flag: as a KV type it is handled by core/kv_quant.
    DTypeTraits{DType::TQ3_0, "TQ3_0", 32, 14, false},
};

}  // namespace

std::optional<DTypeTraits> dtype_traits(uint32_t id) {
  if (id >= kFirstInternalDTypeId) return std::nullopt;
  for (const auto& t : kTraits)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const DTypeTraits& traits(DType t) {
  for (const auto& tr : kTraits)
    if (tr.type == t) return tr;
  throw Error("unknown dtype id " + std::to_string(static_cast<uint32_t>(t)));
}

std::string_view dtype_name(DType t) { return traits(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& t : kTraits) {
    if (t.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(name[i])) == t.name[i];
    if (eq) return t.type;
  }
  return std::nullopt;
}

}  // namespace pg
