// Paged KV cache: fixed-size blocks of cells in one pool per attention layer; each sequence slot
// owns a block table mapping its logical positions to physical cells. Blocks are refcounted so a
// later prefix cache can share them between sequences.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace pg {

struct KvCacheOptions {
  int n_seq = 1;           // sequence slots
  int n_ctx = 4096;        // max tokens per sequence
  DType type = DType::F16; // F32 or F16 storage
  int block_size = 64;     // cells per block
  int n_blocks = 0;        // 0 = enough for every slot at full context
};

// Width of one layer's K and V rows (n_head_kv*head_dim); 0 for layers without a KV cache.
struct KvLayerShape {
  int64_t k_width = 0, v_width = 0;
};

class KvCache {
 public:
  KvCache(Backend& backend, const std::vector<KvLayerShape>& layers, const KvCacheOptions& opt);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheOptions& options() const { return opt_; }
  int n_seq() const { return opt_.n_seq; }
  int n_ctx() const { return opt_.n_ctx; }
  int max_blocks() const { return max_blocks_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int total_blocks() const { return opt_.n_blocks; }
  size_t bytes() const { return bytes_; }
  // Bytes of K+V per cached token over all layers (for bandwidth accounting).
  size_t bytes_per_token() const { return bytes_per_token_; }

  // Number of tokens stored for a sequence (its next position).
  int seq_len(int seq) const { return len_[static_cast<size_t>(seq)]; }
  // Makes room for positions [0, n) of a sequence; false when the pool has no free block.
  bool reserve(int seq, int n);
  // Marks positions [0, n) as written (after a forward).
  void set_len(int seq, int n);
  // Drops positions ≥ n (rollback after rejected speculation, or a new request reusing a prefix).
  void truncate(int seq, int n);
  void clear(int seq) { truncate(seq, 0); }

  // Physical cell of a sequence position (reserve() must have covered it).
  int32_t cell(int seq, int pos) const;
  const std::vector<int32_t>& block_table() const { return table_; }  // (n_seq, max_blocks), -1 = none
  bool table_dirty() const { return table_dirty_; }
  void clear_dirty() { table_dirty_ = false; }

  KvLayer& layer(int il) { return layers_[static_cast<size_t>(il)]; }
  bool has_layer(int il) const { return layers_[static_cast<size_t>(il)].k.valid(); }

 private:
  Backend& backend_;
  KvCacheOptions opt_;
  int max_blocks_ = 0;
  size_t bytes_ = 0, bytes_per_token_ = 0;
  std::vector<KvLayer> layers_;        // (n_layer); invalid for non-attention layers
  std::vector<int32_t> table_;         // (n_seq, max_blocks)
  std::vector<int> n_blocks_of_;       // (n_seq)
  std::vector<int> len_;               // (n_seq)
  std::vector<int32_t> refcount_;      // (n_blocks)
  std::vector<int32_t> free_;          // free block ids (stack)
  bool table_dirty_ = true;
};

}  // namespace pg
