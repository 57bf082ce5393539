#include "kv/paged_kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/error.h"
#include "core/kv_quant.h"
#include "core/log.h"

namespace pg {

PagedKvCache::PagedKvCache(Backend& backend, const std::vector<KvLayerShape>& shapes, const KvCacheOptions& opt,
                           const std::vector<RecurrentLayerShape>& recurrent)
    : backend_(backend), opt_(opt) {
  for (DType t : {opt_.k_type(), opt_.v_type()}) {
    PG_CHECK(is_kv_type(t), "KV cache type " + std::string(dtype_name(t)) + " is not a KV storage type (supported: " + kv_type_list() + ")");
    PG_CHECK(backend_.supports_kv_type(t), "KV type " + kv_type_name(t) + " is not supported on " + backend_.name() + " yet");
  }
  PG_CHECK(opt_.n_seq > 0 && opt_.n_ctx > 0 && opt_.block_size > 0, "invalid KV cache size");
  max_blocks_ = (opt_.n_ctx + opt_.block_size - 1) / opt_.block_size;
  if (opt_.n_blocks == 0) opt_.n_blocks = max_blocks_ * opt_.n_seq;
  const int64_t n_cells = static_cast<int64_t>(opt_.n_blocks) * opt_.block_size;
  layers_.resize(shapes.size());
  // Once per process: every cache of a run (slots, the draft model's) would repeat it.
  static std::atomic<bool> warned_once{false};
  bool warned_pad = warned_once.load();
  for (size_t il = 0; il < shapes.size(); ++il) {
    if (shapes[il].k_width == 0) continue;
    auto& l = layers_[il];
    const int nh = shapes[il].n_head_kv > 0 ? shapes[il].n_head_kv : 1;
    PG_CHECK(shapes[il].k_width % nh == 0 && shapes[il].v_width % nh == 0, "KV row widths are not a multiple of the KV head count");
    l.n_head_kv = nh;
    l.head_dim = static_cast<int>(shapes[il].k_width / nh);
    l.head_dim_v = static_cast<int>(shapes[il].v_width / nh);
    const auto plain = [](DType t) { return t == DType::F32 || t == DType::F16; };
    // The kernels' head-size limit; F32/F16 rows of callers that give no head count (one "head" of the
    // whole row) are read as before and need no check.
    if (shapes[il].n_head_kv > 0 || !plain(opt_.k_type()) || !plain(opt_.v_type())) {
      check_kv_types(opt_.k_type(), opt_.v_type(), l.head_dim);
      check_kv_types(opt_.k_type(), opt_.v_type(), l.head_dim_v);
    }
    // Each head stored in whole blocks / rotation groups (core/kv_quant.h): the tensor's row is
    // n_head_kv padded heads, so Tensor::row_bytes() is exactly kv_row_bytes.
    l.k = backend_.alloc(opt_.k_type(), static_cast<int64_t>(nh) * kv_head_width(opt_.k_type(), l.head_dim), n_cells);
    l.v = backend_.alloc(opt_.v_type(), static_cast<int64_t>(nh) * kv_head_width(opt_.v_type(), l.head_dim_v), n_cells);
    PG_CHECK(l.k.row_bytes() == kv_row_bytes(opt_.k_type(), nh, l.head_dim) && l.v.row_bytes() == kv_row_bytes(opt_.v_type(), nh, l.head_dim_v),
             "KV row size mismatch");
    bytes_ += l.k.nbytes() + l.v.nbytes();
    bytes_per_token_ += l.k.row_bytes() + l.v.row_bytes();
    if (!warned_pad) {
      for (auto [t, hd] : {std::pair{opt_.k_type(), l.head_dim}, std::pair{opt_.v_type(), l.head_dim_v}}) {
        if (kv_head_width(t, hd) == hd || warned_pad) continue;
        // Padding is real storage: say so once (docs/kv-cache-types.md), llama.cpp refuses these instead.
        PG_WARN("KV type %s with head size %d pads each head to %d values: %.2f bits per value instead of %.2f",
                kv_type_name(t).c_str(), hd, kv_head_width(t, hd), kv_bits_per_value(t, hd),
                kv_bits_per_value(t, kv_head_width(t, hd)));
        warned_pad = true;
        warned_once = true;
      }
    }
  }
  block_bytes_ = bytes_per_token_ * static_cast<size_t>(opt_.block_size);
  if (bytes_per_token_ > 0)
    PG_INFO("KV cache: K %s, V %s: %zu bytes per token, %.1f MiB for %lld cells (%d slots x %d tokens)",
            kv_type_name(opt_.k_type()).c_str(), kv_type_name(opt_.v_type()).c_str(), bytes_per_token_,
            static_cast<double>(bytes_) / (1024.0 * 1024.0), static_cast<long long>(n_cells), opt_.n_seq, opt_.n_ctx);
  table_.assign(static_cast<size_t>(opt_.n_seq) * static_cast<size_t>(max_blocks_), -1);
  n_blocks_of_.assign(static_cast<size_t>(opt_.n_seq), 0);
  len_.assign(static_cast<size_t>(opt_.n_seq), 0);
  refcount_.assign(static_cast<size_t>(opt_.n_blocks), 0);
  for (int b = opt_.n_blocks - 1; b >= 0; --b) free_.push_back(b);
  trees_.resize(static_cast<size_t>(opt_.n_seq));
  // Cell lists of commit() (≤ kMaxTreeRows) and of a copy-on-write (one block).
  copy_src_ = backend_.alloc(DType::I32, std::max(kMaxTreeRows, opt_.block_size), 1);
  copy_dst_ = backend_.alloc(DType::I32, std::max(kMaxTreeRows, opt_.block_size), 1);
  bool any_recurrent = false;
  for (const auto& r : recurrent) any_recurrent |= r.any();
  if (any_recurrent) {
    PG_CHECK(recurrent.size() == shapes.size(), "recurrent layer shapes do not match the layer count");
    recurrent_ = std::make_unique<RecurrentState>(backend_, recurrent, opt_.n_seq, opt_.n_capture, opt_.n_snapshot);
    bytes_ += recurrent_->bytes();
  }
}

PagedKvCache::~PagedKvCache() {
  backend_.free(copy_src_);
  backend_.free(copy_dst_);
  for (auto& l : layers_) {
    if (l.k.valid()) backend_.free(l.k);
    if (l.v.valid()) backend_.free(l.v);
  }
}

void PagedKvCache::check_seq(int seq) const {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot " + std::to_string(seq) + " out of range (" + std::to_string(opt_.n_seq) + " slots)");
}

bool PagedKvCache::reserve(int seq, int n) {
  check_seq(seq);
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

void PagedKvCache::set_len(int seq, int n) {
  check_seq(seq);
  PG_CHECK(n <= n_blocks_of_[static_cast<size_t>(seq)] * opt_.block_size, "set_len beyond reserved blocks");
  len_[static_cast<size_t>(seq)] = n;
}

void PagedKvCache::truncate(int seq, int n) {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot out of range");
  PG_CHECK(n >= 0, "negative truncation length");
  if (recurrent_) {
    // The recurrent part first: it is the one that can fail, and a failure must leave everything as it was.
    if (n == 0) {
      recurrent_->zero_slot(seq);
      recurrent_->invalidate(seq, 0);
    } else if (n < len_[static_cast<size_t>(seq)]) {
      const int c = recurrent_->find_snapshot(seq, n - 1);
      PG_CHECK(c >= 0, "cannot truncate sequence " + std::to_string(seq) + " of a hybrid model to " + std::to_string(n) +
                           " tokens: no recurrent state was captured at that position (run the forward with capture)");
      recurrent_->copy_slot(c, seq);
      recurrent_->invalidate(seq, n);
    }
  }
  if (n < len_[static_cast<size_t>(seq)]) len_[static_cast<size_t>(seq)] = n;
  drop_tree(seq);
  release_blocks(seq, n);
}

void PagedKvCache::release_blocks(int seq, int n) {
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

void PagedKvCache::set_tree(int seq, std::vector<int32_t> parent, std::vector<int32_t> rows) {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot out of range");
  PG_CHECK(parent.size() == rows.size() && parent.size() <= static_cast<size_t>(kMaxTreeRows), "malformed tree record");
  trees_[static_cast<size_t>(seq)] = {std::move(parent), std::move(rows)};
}

void PagedKvCache::drop_tree(int seq) { trees_[static_cast<size_t>(seq)] = {}; }

void PagedKvCache::commit(int seq, const std::vector<int>& path) {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot out of range");
  const Tree& t = trees_[static_cast<size_t>(seq)];
  const int n_tree = static_cast<int>(t.parent.size());
  PG_CHECK(n_tree > 0 || path.empty(), "commit: sequence " + std::to_string(seq) + " has no tree from a tree forward to commit from");
  for (size_t i = 0; i < path.size(); ++i) {
    const int j = path[i];
    PG_CHECK(j >= 0 && j < n_tree, "commit: tree index " + std::to_string(j) + " is not a row of the sequence's tree (" +
                                       std::to_string(n_tree) + " rows)");
    const int want = i == 0 ? -1 : path[i - 1];
    PG_CHECK(t.parent[static_cast<size_t>(j)] == want,
             i == 0 ? "commit: the path must start at a root of the tree (tree index " + std::to_string(j) + " has a parent)"
                    : "commit: tree index " + std::to_string(j) + " is not a child of " + std::to_string(want));
  }
  const int base = len_[static_cast<size_t>(seq)];
  const int m = static_cast<int>(path.size());
  // Node i of the path sits at logical position base + path[i] and moves to base + i. path[i] ≥ i (its i
  // ancestors precede it in batch order), so copying in path order never overwrites a row still to be read.
  std::vector<int32_t> src, dst;
  for (int i = 0; i < m; ++i) {
    if (path[static_cast<size_t>(i)] == i) continue;
    src.push_back(cell(seq, base + path[static_cast<size_t>(i)]));
    dst.push_back(write_cell(seq, base + i));  // the tree's writes made these blocks the sequence's own already
  }
  copy_cells(src, dst);
  if (recurrent_ && m > 0) {
    const int last_row = t.rows[static_cast<size_t>(path.back())];
    recurrent_->commit(seq, last_row);
    // The accepted nodes' captures are now chain snapshots of the sequence (truncate can cut back into
    // the accepted run); every other tree capture is dropped.
    recurrent_->invalidate(seq, base);
    for (int i = 0; i < m; ++i) recurrent_->set_tag(t.rows[static_cast<size_t>(path[static_cast<size_t>(i)])], {seq, base + i, true});
  } else if (recurrent_) {
    recurrent_->invalidate(seq, base);
  }
  len_[static_cast<size_t>(seq)] = base + m;
  drop_tree(seq);
  release_blocks(seq, base + m);
}

void PagedKvCache::copy_cells(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  if (src.empty()) return;
  rows_copied_ += static_cast<int64_t>(src.size());
  const size_t bytes = src.size() * sizeof(int32_t);
  backend_.upload(copy_src_, src.data(), bytes);
  backend_.upload(copy_dst_, dst.data(), bytes);
  const int64_t n = static_cast<int64_t>(src.size());
  const Tensor s = copy_src_.reshape_2d(n, 1), d = copy_dst_.reshape_2d(n, 1);
  for (auto& l : layers_)
    if (l.k.valid()) backend_.kv_copy(l, s, d);
}

int32_t PagedKvCache::write_cell(int seq, int pos) {
  check_seq(seq);
  PG_CHECK(pos >= 0 && pos < n_blocks_of_[static_cast<size_t>(seq)] * opt_.block_size, "KV position not reserved");
  int32_t& b = table_at(seq, pos / opt_.block_size);
  if (refcount_[static_cast<size_t>(b)] > 1) {
    // Copy-on-write: the block is shared (share_prefix); this sequence gets its own copy first.
    if (free_.empty()) throw Error("KV cache is full: no free block for a copy-on-write of a shared block");
    const int32_t nb = free_.back();
    free_.pop_back();
    std::vector<int32_t> src(static_cast<size_t>(opt_.block_size)), dst(src.size());
    for (int i = 0; i < opt_.block_size; ++i) {
      src[static_cast<size_t>(i)] = b * opt_.block_size + i;
      dst[static_cast<size_t>(i)] = nb * opt_.block_size + i;
    }
    copy_cells(src, dst);
    --refcount_[static_cast<size_t>(b)];
    refcount_[static_cast<size_t>(nb)] = 1;
    b = nb;
    table_dirty_ = true;
  }
  return b * opt_.block_size + pos % opt_.block_size;
}

void PagedKvCache::share_prefix(int src, int dst, int n) {
  check_seq(src);
  check_seq(dst);
  PG_CHECK(src != dst, "share_prefix: source and destination are the same sequence");
  PG_CHECK(n >= 0 && n <= len_[static_cast<size_t>(src)], "share_prefix: sequence " + std::to_string(src) + " holds " +
                                                               std::to_string(len_[static_cast<size_t>(src)]) + " tokens, not " + std::to_string(n));
  int snapshot = -1;
  if (recurrent_ && n > 0 && n < len_[static_cast<size_t>(src)]) {
    snapshot = recurrent_->find_snapshot(src, n - 1);
    PG_CHECK(snapshot >= 0, "share_prefix: sequence " + std::to_string(src) + " of a hybrid model has no recurrent state captured at " +
                                std::to_string(n) + " tokens");
  }
  truncate(dst, 0);
  const int nb = (n + opt_.block_size - 1) / opt_.block_size;
  for (int i = 0; i < nb; ++i) {
    const int32_t b = table_at(src, i);
    ++refcount_[static_cast<size_t>(b)];
    table_at(dst, i) = b;
  }
  n_blocks_of_[static_cast<size_t>(dst)] = nb;
  len_[static_cast<size_t>(dst)] = n;
  table_dirty_ = true;
  if (recurrent_ && n > 0) {
    recurrent_->copy_slot(snapshot >= 0 ? snapshot : src, dst);
    recurrent_->invalidate(dst, 0);
  }
}

int32_t PagedKvCache::block_of(int seq, int i) const {
  check_seq(seq);
  PG_CHECK(i >= 0 && i < n_blocks_of_[static_cast<size_t>(seq)], "block " + std::to_string(i) + " of sequence " + std::to_string(seq) + " is not reserved");
  return table_[static_cast<size_t>(seq) * static_cast<size_t>(max_blocks_) + static_cast<size_t>(i)];
}

void PagedKvCache::hold_block(int32_t b) {
  PG_CHECK(b >= 0 && b < opt_.n_blocks && refcount_[static_cast<size_t>(b)] > 0, "hold_block: block " + std::to_string(b) + " is not in use");
  ++refcount_[static_cast<size_t>(b)];
}

void PagedKvCache::drop_block(int32_t b) {
  PG_CHECK(b >= 0 && b < opt_.n_blocks && refcount_[static_cast<size_t>(b)] > 0, "drop_block: block " + std::to_string(b) + " is not in use");
  if (--refcount_[static_cast<size_t>(b)] == 0) free_.push_back(b);
}

int32_t PagedKvCache::alloc_block() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  refcount_[static_cast<size_t>(b)] = 1;
  return b;
}

void PagedKvCache::attach_blocks(int seq, const std::vector<int32_t>& blocks) {
  check_seq(seq);
  PG_CHECK(len_[static_cast<size_t>(seq)] == 0 && n_blocks_of_[static_cast<size_t>(seq)] == 0, "attach_blocks: sequence " + std::to_string(seq) + " is not empty");
  PG_CHECK(static_cast<int>(blocks.size()) <= max_blocks_ && static_cast<int64_t>(blocks.size()) * opt_.block_size <= opt_.n_ctx,
           "attach_blocks: " + std::to_string(blocks.size()) + " blocks exceed the context");
  for (size_t i = 0; i < blocks.size(); ++i) {
    hold_block(blocks[i]);
    table_at(seq, static_cast<int>(i)) = blocks[i];
  }
  n_blocks_of_[static_cast<size_t>(seq)] = static_cast<int>(blocks.size());
  len_[static_cast<size_t>(seq)] = static_cast<int>(blocks.size()) * opt_.block_size;
  drop_tree(seq);
  table_dirty_ = true;
}

bool PagedKvCache::attach_partial(int seq, int32_t src, int n_cells) {
  check_seq(seq);
  PG_CHECK(src >= 0 && src < opt_.n_blocks && refcount_[static_cast<size_t>(src)] > 0, "attach_partial: block " + std::to_string(src) + " is not in use");
  PG_CHECK(n_cells >= 1 && n_cells <= opt_.block_size, "attach_partial: " + std::to_string(n_cells) + " cells do not fit a block of " +
                                                           std::to_string(opt_.block_size));
  const int len = len_[static_cast<size_t>(seq)];
  int& have = n_blocks_of_[static_cast<size_t>(seq)];
  PG_CHECK(len == have * opt_.block_size, "attach_partial: sequence " + std::to_string(seq) + " does not end on a block boundary");
  PG_CHECK(len + n_cells <= opt_.n_ctx, "attach_partial: the sequence would exceed the context");
  if (free_.empty()) return false;
  const int32_t nb = free_.back();
  free_.pop_back();
  refcount_[static_cast<size_t>(nb)] = 1;
  std::vector<int32_t> from(static_cast<size_t>(n_cells)), to(from.size());  // (n_cells) cells
  for (int i = 0; i < n_cells; ++i) {
    from[static_cast<size_t>(i)] = src * opt_.block_size + i;
    to[static_cast<size_t>(i)] = nb * opt_.block_size + i;
  }
  copy_cells(from, to);
  table_at(seq, have) = nb;
  ++have;
  len_[static_cast<size_t>(seq)] = len + n_cells;
  drop_tree(seq);
  table_dirty_ = true;
  return true;
}

void PagedKvCache::read_cells(int32_t b, int n_cells, uint8_t* out) const {
  PG_CHECK(b >= 0 && b < opt_.n_blocks, "read_cells: block out of range");
  PG_CHECK(n_cells >= 0 && n_cells <= opt_.block_size, "read_cells: more cells than a block holds");
  for (const auto& l : layers_) {
    if (!l.k.valid()) continue;
    for (const Tensor* t : {&l.k, &l.v}) {
      // A block's cells are consecutive rows of the layer's tensor: its first n_cells rows are one range.
      const size_t whole = t->row_bytes() * static_cast<size_t>(opt_.block_size), n = t->row_bytes() * static_cast<size_t>(n_cells);
      backend_.download(*t, out, n, static_cast<size_t>(b) * whole);
      out += n;
    }
  }
}

void PagedKvCache::write_cells(int32_t b, int n_cells, const uint8_t* in) {
  PG_CHECK(b >= 0 && b < opt_.n_blocks, "write_cells: block out of range");
  PG_CHECK(n_cells >= 0 && n_cells <= opt_.block_size, "write_cells: more cells than a block holds");
  for (auto& l : layers_) {
    if (!l.k.valid()) continue;
    for (Tensor* t : {&l.k, &l.v}) {
      const size_t whole = t->row_bytes() * static_cast<size_t>(opt_.block_size), n = t->row_bytes() * static_cast<size_t>(n_cells);
      backend_.upload(*t, in, n, static_cast<size_t>(b) * whole);
      in += n;
    }
  }
}

int32_t PagedKvCache::cell(int seq, int pos) const {
  const int32_t b = table_[static_cast<size_t>(seq) * static_cast<size_t>(max_blocks_) + static_cast<size_t>(pos / opt_.block_size)];
  PG_CHECK(b >= 0, "KV position not reserved");
  return b * opt_.block_size + pos % opt_.block_size;
}

namespace {

constexpr uint32_t kSeqMagic = 0x51534750;  // "PGSQ"
constexpr uint32_t kSeqVersion = 2;  // 2: K and V storage types recorded separately

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  const size_t at = out.size();
  out.resize(at + 8);
  std::memcpy(out.data() + at, &v, 8);
}

}  // namespace

// Layout: magic, version, n_layer, seq_len, K and V storage types, block-independent per-layer row sizes
// (K row, V row, conv slot, delta slot bytes), then per attention layer the K rows and V rows of
// positions 0..len-1, then the recurrent slot (every recurrent layer's conv then delta state).
std::vector<uint8_t> PagedKvCache::save_seq(int seq) const {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot out of range");
  const int len = len_[static_cast<size_t>(seq)];
  std::vector<uint8_t> out;
  put_u64(out, kSeqMagic);
  put_u64(out, kSeqVersion);
  put_u64(out, layers_.size());
  put_u64(out, static_cast<uint64_t>(len));
  put_u64(out, static_cast<uint64_t>(opt_.k_type()));
  put_u64(out, static_cast<uint64_t>(opt_.v_type()));
  for (size_t il = 0; il < layers_.size(); ++il) {
    const auto& l = layers_[il];
    put_u64(out, l.k.valid() ? l.k.row_bytes() : 0);
    put_u64(out, l.v.valid() ? l.v.row_bytes() : 0);
    const bool rec = recurrent_ && recurrent_->has_layer(static_cast<int>(il));
    put_u64(out, rec ? recurrent_->shape(static_cast<int>(il)).conv_width * sizeof(float) : 0);
    put_u64(out, rec ? recurrent_->shape(static_cast<int>(il)).ssm_width * sizeof(float) : 0);
  }
  for (const auto& l : layers_) {
    if (!l.k.valid()) continue;
    for (const Tensor* t : {&l.k, &l.v}) {
      const size_t rb = t->row_bytes();
      // Cells are contiguous within a block: one transfer per block.
      for (int p0 = 0; p0 < len; p0 += opt_.block_size) {
        const int cnt = std::min(opt_.block_size, len - p0);
        const size_t at = out.size();
        out.resize(at + rb * static_cast<size_t>(cnt));
        backend_.download(*t, out.data() + at, rb * static_cast<size_t>(cnt), static_cast<size_t>(cell(seq, p0)) * rb);
      }
    }
  }
  if (recurrent_) recurrent_->save_slot(seq, out);
  return out;
}

void PagedKvCache::restore_seq(int seq, const std::vector<uint8_t>& data) {
  PG_CHECK(seq >= 0 && seq < opt_.n_seq, "sequence slot out of range");
  size_t off = 0;
  auto get = [&]() {
    PG_CHECK(off + 8 <= data.size(), "sequence state is truncated");
    uint64_t v;
    std::memcpy(&v, data.data() + off, 8);
    off += 8;
    return v;
  };
  PG_CHECK(get() == kSeqMagic, "not a sequence state (bad magic)");
  const uint64_t version = get();
  PG_CHECK(version == kSeqVersion, "sequence state version " + std::to_string(version) + " is not supported");
  PG_CHECK(get() == layers_.size(), "sequence state was saved from a model with another layer count");
  const uint64_t len = get();
  PG_CHECK(len <= static_cast<uint64_t>(opt_.n_ctx), "sequence state holds " + std::to_string(len) + " tokens, more than the context " + std::to_string(opt_.n_ctx));
  PG_CHECK(get() == static_cast<uint64_t>(opt_.k_type()), "sequence state was saved with another K storage type");
  PG_CHECK(get() == static_cast<uint64_t>(opt_.v_type()), "sequence state was saved with another V storage type");
  size_t payload = 0;
  for (size_t il = 0; il < layers_.size(); ++il) {
    const auto& l = layers_[il];
    const bool rec = recurrent_ && recurrent_->has_layer(static_cast<int>(il));
    const uint64_t want[4] = {l.k.valid() ? l.k.row_bytes() : 0, l.v.valid() ? l.v.row_bytes() : 0,
                              rec ? recurrent_->shape(static_cast<int>(il)).conv_width * sizeof(float) : 0,
                              rec ? recurrent_->shape(static_cast<int>(il)).ssm_width * sizeof(float) : 0};
    for (uint64_t w : want) {
      PG_CHECK(get() == w, "sequence state layer " + std::to_string(il) + " does not match this model's cache layout");
    }
    payload += static_cast<size_t>(want[0] + want[1]) * len + static_cast<size_t>(want[2] + want[3]);
  }
  PG_CHECK(data.size() - off == payload, "sequence state has " + std::to_string(data.size() - off) + " payload bytes, expected " + std::to_string(payload));

  const int n = static_cast<int>(len);
  truncate(seq, 0);
  if (!reserve(seq, n)) throw Error("KV cache is full: cannot restore a sequence of " + std::to_string(n) + " tokens");
  for (auto& l : layers_) {
    if (!l.k.valid()) continue;
    for (Tensor* t : {&l.k, &l.v}) {
      const size_t rb = t->row_bytes();
      for (int p0 = 0; p0 < n; p0 += opt_.block_size) {
        const int cnt = std::min(opt_.block_size, n - p0);
        backend_.upload(*t, data.data() + off, rb * static_cast<size_t>(cnt), static_cast<size_t>(cell(seq, p0)) * rb);
        off += rb * static_cast<size_t>(cnt);
      }
    }
  }
  if (recurrent_) {
    recurrent_->load_slot(seq, data.data() + off);
    recurrent_->invalidate(seq, 0);
  }
  set_len(seq, n);
}

}  // namespace pg
