// A view of backend memory: a typed, row-major array of up to 4 dims in ggml order
// (ne[0] is the contiguous dimension). Tensors do not own memory; Backend::alloc / Buffer do.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pg {

class Backend;

struct Tensor {
  void* data = nullptr;
  DType type = DType::F32;
  int64_t ne[4] = {1, 1, 1, 1};
  Backend* backend = nullptr;

  int64_t cols() const { return ne[0]; }
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t n_elements() const { return ne[0] * rows(); }
  size_t row_bytes() const { return pg::row_bytes(type, ne[0]); }
  size_t nbytes() const { return row_bytes() * static_cast<size_t>(rows()); }
  bool valid() const { return data != nullptr; }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  // Rows [r0, r0+n) of a 2-D view (the tensor seen as rows() rows of ne[0]).
  Tensor rows_view(int64_t r0, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<uint8_t*>(data) + static_cast<size_t>(r0) * row_bytes();
    t.ne[1] = n;
    t.ne[2] = t.ne[3] = 1;
    return t;
  }
  // The same bytes seen with another row length (total elements unchanged).
  Tensor reshape_2d(int64_t cols, int64_t rows) const {
    Tensor t = *this;
    t.ne[0] = cols;
    t.ne[1] = rows;
    t.ne[2] = t.ne[3] = 1;
    return t;
  }
  // Slice e of the last dimension of a 3-D tensor (an expert of a stacked MoE weight).
  Tensor slice3(int64_t e) const {
    Tensor t = *this;
    t.data = static_cast<uint8_t*>(data) + static_cast<size_t>(e) * row_bytes() * static_cast<size_t>(ne[1]);
    t.ne[2] = 1;
    return t;
  }
};

}  // namespace pg
