// The paged KV cache (the KvCache implementation): per attention layer one K and one V tensor of
// n_blocks·block_size cells; each sequence slot owns a block table mapping its logical blocks to
// physical ones. Blocks are refcounted: share_prefix() lets sequences point at the same blocks, and
// write_cell() copies a shared block before a write lands in it (copy-on-write, one kv_copy per layer).
#pragma once
#include <memory>
#include <vector>

#include "kv/kv_cache.h"

namespace pg {

class PagedKvCache final : public KvCache {
 public:
  // `layers`: per layer the K/V row widths (0 = no KV, e.g. a linear-attention layer); `recurrent` (one
  // entry per layer, or empty) sizes the recurrent state of hybrid models.
  PagedKvCache(Backend& backend, const std::vector<KvLayerShape>& layers, const KvCacheOptions& opt,
               const std::vector<RecurrentLayerShape>& recurrent = {});
  ~PagedKvCache() override;

  const KvCacheOptions& options() const override { return opt_; }
  int max_blocks() const override { return max_blocks_; }
  int free_blocks() const override { return static_cast<int>(free_.size()); }
  int total_blocks() const override { return opt_.n_blocks; }
  size_t bytes() const override { return bytes_; }
  size_t bytes_per_token() const override { return bytes_per_token_; }

  int seq_len(int seq) const override { return len_[static_cast<size_t>(seq)]; }
  bool reserve(int seq, int n) override;
  void set_len(int seq, int n) override;
  void truncate(int seq, int n) override;
  void share_prefix(int src, int dst, int n) override;
  std::vector<uint8_t> save_seq(int seq) const override;
  void restore_seq(int seq, const std::vector<uint8_t>& data) override;

  void set_tree(int seq, std::vector<int32_t> parent, std::vector<int32_t> rows) override;
  void drop_tree(int seq) override;
  int tree_size(int seq) const override { return static_cast<int>(trees_[static_cast<size_t>(seq)].parent.size()); }
  void commit(int seq, const std::vector<int>& path) override;

  RecurrentState* recurrent() override { return recurrent_.get(); }
  const RecurrentState* recurrent() const override { return recurrent_.get(); }

  int32_t cell(int seq, int pos) const override;
  int32_t write_cell(int seq, int pos) override;
  const std::vector<int32_t>& block_table() const override { return table_; }
  bool table_dirty() const override { return table_dirty_; }
  void clear_dirty() override { table_dirty_ = false; }
  int n_layer() const override { return static_cast<int>(layers_.size()); }
  KvLayer& layer(int il) override { return layers_[static_cast<size_t>(il)]; }
  bool has_layer(int il) const override { return layers_[static_cast<size_t>(il)].k.valid(); }

  int block_refcount(int block) const { return refcount_[static_cast<size_t>(block)]; }

  // ---- blocks held outside any sequence (the prefix cache, kv/prefix_cache.h) ----
  // A reference the prefix index keeps is one more refcount: a block stays out of the free pool while
  // any sequence or the index holds it, and is never written again once full (a sequence only writes
  // past its attached prefix, so copy-on-write never triggers on an attached full block).
  int32_t block_of(int seq, int i) const;  // physical block of logical block i of seq (reserved)
  void hold_block(int32_t b);              // one more reference to a block in use
  void drop_block(int32_t b);              // one reference less; the last returns it to the pool
  int32_t alloc_block();                   // a free block with one reference (the caller's), or -1
  // Makes the empty sequence seq hold `blocks` (full blocks, in order) as its positions
  // [0, blocks.size()·block_size); their refcounts grow. The recurrent state (hybrid models) is the
  // caller's to set.
  void attach_blocks(int seq, const std::vector<int32_t>& blocks);
  // Partial-block reuse (copy-on-write done eagerly): appends to seq, whose length must be a whole
  // number of blocks, a block of its own holding copies of cells [0, n_cells) of block `src` (1 ≤
  // n_cells ≤ block_size; one kv_copy per attention layer), so seq_len grows by n_cells and the next
  // write lands in seq's own block, never in `src`. The copy is made now rather than at the first write
  // because that write always follows (the caller leaves a prompt token to prefill) and taking the block
  // here lets the caller evict for it instead of a forward failing on a full pool. False (nothing
  // changed) when no block is free.
  bool attach_partial(int seq, int32_t src, int n_cells);
  // The K and V rows of one block over every attention layer (layer order, K then V), as bytes.
  size_t block_bytes() const { return block_bytes_; }
  void read_block(int32_t b, uint8_t* out) const { read_cells(b, opt_.block_size, out); }  // writes block_bytes()
  void write_block(int32_t b, const uint8_t* in) { write_cells(b, opt_.block_size, in); }  // reads block_bytes()
  // The same for cells [0, n_cells) of the block only (a partly filled tail: n_cells·bytes_per_token()
  // bytes, layer order, K then V); write_cells leaves the block's other cells as they were.
  void read_cells(int32_t b, int n_cells, uint8_t* out) const;
  void write_cells(int32_t b, int n_cells, const uint8_t* in);
  // K/V rows moved so far by commit() and copy-on-write (per layer count once): a chain verified as a
  // tree commits with none.
  int64_t rows_copied() const { return rows_copied_; }

 private:
  void check_seq(int seq) const;
  void release_blocks(int seq, int n);  // frees the sequence's blocks past those holding positions [0, n)
  int32_t& table_at(int seq, int blk) { return table_[static_cast<size_t>(seq) * static_cast<size_t>(max_blocks_) + static_cast<size_t>(blk)]; }
  // K/V rows src[i] → dst[i] in every attention layer, sequentially (Backend::kv_copy), with one upload
  // of each cell list.
  void copy_cells(const std::vector<int32_t>& src, const std::vector<int32_t>& dst);

  Backend& backend_;
  KvCacheOptions opt_;
  int max_blocks_ = 0;
  size_t bytes_ = 0, bytes_per_token_ = 0, block_bytes_ = 0;
  std::vector<KvLayer> layers_;        // (n_layer); invalid for non-attention layers
  std::vector<int32_t> table_;         // (n_seq, max_blocks)
  std::vector<int> n_blocks_of_;       // (n_seq)
  std::vector<int> len_;               // (n_seq)
  std::vector<int32_t> refcount_;      // (n_blocks)
  std::vector<int32_t> free_;          // free block ids (stack)
  bool table_dirty_ = true;
  std::unique_ptr<RecurrentState> recurrent_;
  struct Tree {
    std::vector<int32_t> parent, rows;  // (n tree rows)
  };
  std::vector<Tree> trees_;             // (n_seq)
  int64_t rows_copied_ = 0;
  Tensor copy_src_, copy_dst_;          // I32 (max(kMaxTreeRows, block_size)) cell lists of copy_cells()
};

}  // namespace pg
