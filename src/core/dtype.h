// Weight, activation and KV-cache element types. Numeric ids below kFirstInternalDTypeId are GGML's, so a
// GGUF tensor's type field maps 1:1; ids from kFirstInternalDTypeId up are Peregrine's own formats.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pg {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  // KV-cache only (core/kv_quant.h): 3.5-bit rotated Lloyd-Max groups. Not GGML's id: the reference fork's
  // GGML_TYPE_TQ3_0 is 42 and its bytes differ from ours (other sign tables), and KV formats never appear
  // in GGUF weight files, so dtype_traits(id) does not accept it from a file.
  TQ3_0 = 1024,
};

// First id that is not GGML's. GGUF readers never map a file's type field to an id at or above it.
constexpr uint32_t kFirstInternalDTypeId = 1024;

struct DTypeTraits {
  DType type;
  std::string_view name;
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t type_size;   // bytes per block
  bool supported;       // this engine can compute with it
};

// Returns nullopt for ids GGML never defined (or that were removed), and for Peregrine's internal ids
// (>= kFirstInternalDTypeId): this is the GGUF tensor-type lookup.
std::optional<DTypeTraits> dtype_traits(uint32_t id);
const DTypeTraits& traits(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // case-insensitive, e.g. "q4_k"

// Bytes of one row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(DType t, int64_t n) {
  const auto& tr = traits(t);
  return static_cast<size_t>(n / tr.block_size) * tr.type_size;
}

}  // namespace pg
