#include "kv/kv_cache.h"

#include "core/error.h"

namespace pg {

KvCache::KvCache(Backend& backend, const std::vector<KvLayerShape>& shapes, const KvCacheOptions& opt) : backend_(backend), opt_(opt) {
  PG_CHECK(opt_.type == DType::F32 || opt_.type == DType::F16, "KV cache type must be f32 or f16");
  PG_CHECK(opt_.n_seq > 0 && opt_.n_ctx > 0 && opt_.block_size > 0, "invalid KV cache size");
  max_blocks_ = (opt_.n_ctx + opt_.block_size - 1) / opt_.block_size;
  if (opt_.n_blocks == 0) opt_.n_blocks = max_blocks_ * opt_.n_seq;
  const int64_t n_cells = static_cast<int64_t>(opt_.n_blocks) * opt_.block_size;
  layers_.resize(shapes.size());
  for (size_t il = 0; il < shapes.size(); ++il) {
    if (shapes[il].k_width == 0) continue;
    auto& l = layers_[il];
    l.k = backend_.alloc(opt_.type, shapes[il].k_width, n_cells);
    l.v = backend_.alloc(opt_.type, shapes[il].v_width, n_cells);
    bytes_ += l.k.nbytes() + l.v.nbytes();
    bytes_per_token_ += l.k.row_bytes() + l.v.row_bytes();
  }
  table_.assign(static_cast<size_t>(opt_.n_seq) * static_cast<size_t>(max_blocks_), -1);
  n_blocks_of_.assign(static_cast<size_t>(opt_.n_seq), 0);
  len_.assign(static_cast<size_t>(opt_.n_seq), 0);
  refcount_.assign(static_cast<size_t>(opt_.n_blocks), 0);
  for (int b = opt_.n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

KvCache::~KvCache() {
  for (auto& l : layers_) {
    if (l.k.valid()) backend_.free(l.k);
    if (l.v.valid()) backend_.free(l.v);
  }
}

bool KvCache::reserve(int seq, int n) {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot out of range");
  PG_CHECK(n <= opt_.n_ctx, "sequence of " + std::to_string(n) + " tokens exceeds the context of " + std::to_string(opt_.n_ctx));
  const int need = (n + opt_.block_size - 1) / opt_.block_size;
  int& have = n_blocks_of_[static_cast<size_t>(seq)];
  if (need - have > static_cast<int>(free_.size())) return false;
  while (have < need) {
    const int32_t b = free_.back();
    free_.pop_back();
    refcount_[static_cast<size_t>(b)] = 1;
    table_[static_cast<size_t>(seq) * static_cast<size_t>(max_blocks_) + static_cast<size_t>(have)] = b;
    ++have;
    table_dirty_ = true;
  }
  return true;
}

void KvCache::set_len(int seq, int n) {
  PG_CHECK(n <= n_blocks_of_[static_cast<size_t>(seq)] * opt_.block_size, "set_len beyond reserved blocks");
  len_[static_cast<size_t>(seq)] = n;
}

void KvCache::truncate(int seq, int n) {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot out of range");
  if (n < len_[static_cast<size_t>(seq)]) len_[static_cast<size_t>(seq)] = n;
  const int keep = (n + opt_.block_size - 1) / opt_.block_size;
  int& have = n_blocks_of_[static_cast<size_t>(seq)];
  while (have > keep) {
    --have;
    int32_t& slot = table_[static_cast<size_t>(seq) * static_cast<size_t>(max_blocks_) + static_cast<size_t>(have)];
    if (--refcount_[static_cast<size_t>(slot)] == 0) free_.push_back(slot);
    slot = -1;
    table_dirty_ = true;
  }
}

int32_t KvCache::cell(int seq, int pos) const {
  const int32_t b = table_[static_cast<size_t>(seq) * static_cast<size_t>(max_blocks_) + static_cast<size_t>(pos / opt_.block_size)];
  PG_CHECK(b >= 0, "KV position not reserved");
  return b * opt_.block_size + pos % opt_.block_size;
}

}  // namespace pg
