// Paged KV cache: fixed-size blocks of cells in one pool per attention layer; each sequence slot
// owns a block table mapping its logical positions to physical cells. Blocks are refcounted so a
// later prefix cache can share them between sequences.
//
// For hybrid models (Gated DeltaNet + attention) the cache also owns the recurrent state of the
// linear-attention layers (recurrent()), so that one object is a sequence's whole memory: the forward
// takes it, clear() empties both parts, truncate() rolls both back (the recurrent part from a captured
// snapshot, see truncate), and save_seq/restore_seq move both to and from a host buffer.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kv/recurrent_state.h"

namespace pg {

struct KvCacheOptions {
  int n_seq = 1;           // sequence slots
  int n_ctx = 4096;        // max tokens per sequence
  DType type = DType::F16; // F32 or F16 storage
  int block_size = 64;     // cells per block
  int n_blocks = 0;        // 0 = enough for every slot at full context
  int n_capture = 0;       // hybrid models: recurrent-state capture slots (max rows of a capturing forward)
};

// Width of one layer's K and V rows (n_head_kv*head_dim); 0 for layers without a KV cache.
struct KvLayerShape {
  int64_t k_width = 0, v_width = 0;
};

class KvCache {
 public:
  // `recurrent` (one entry per layer, or empty) sizes the recurrent state of hybrid models.
  KvCache(Backend& backend, const std::vector<KvLayerShape>& layers, const KvCacheOptions& opt,
          const std::vector<RecurrentLayerShape>& recurrent = {});
  ~KvCache();
  // Unique for the process's lifetime, so users that size scratch per cache never confuse a new
  // cache with a freed one that happened to live at the same address.
  uint64_t id() const { return id_; }
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
  // Hybrid models: the recurrent state cannot be cut, so truncating to 0 < n < seq_len restores the
  // snapshot of position n-1 taken by the last capturing forward over that history (Model::forward with
  // ForwardOptions::capture: the state before the batch and after each row) and throws pg::Error,
  // changing nothing, when there is none.
  void truncate(int seq, int n);
  void clear(int seq) { truncate(seq, 0); }

  // The sequence's whole state (its K/V rows 0..seq_len-1 and, for hybrid models, its recurrent state)
  // as a self-describing byte string; restore_seq loads it into any slot of a cache of the same model
  // and layout (checked), replacing that slot's contents.
  std::vector<uint8_t> save_seq(int seq) const;
  void restore_seq(int seq, const std::vector<uint8_t>& data);

  // Recurrent state of hybrid models; nullptr for attention-only models.
  RecurrentState* recurrent() { return recurrent_.get(); }
  const RecurrentState* recurrent() const { return recurrent_.get(); }

  // ---- token trees (speculative verification) ----
  // A tree forward (Model::forward with Batch::parent) stores the n tree rows of a sequence at logical
  // positions seq_len + j, j = 0..n-1 in batch order, without advancing seq_len, and records the tree
  // here: parent[j] (index j of the parent row, -1 for a root) and row[j] (the batch row, which is also
  // the recurrent capture index of hybrid models). Anything else that changes the sequence (truncate,
  // clear, restore, commit, a chain forward) drops the record.
  void set_tree(int seq, std::vector<int32_t> parent, std::vector<int32_t> rows);
  void drop_tree(int seq);
  int tree_size(int seq) const { return static_cast<int>(trees_[static_cast<size_t>(seq)].parent.size()); }
  // Accepts a root-to-node path of the sequence's last tree: path = tree indices j, root first, each the
  // child of the previous (checked; an empty path accepts nothing). Afterwards the sequence holds those
  // rows at positions seq_len, seq_len+1, ... (their K/V moved on the backend with one upload of the cell
  // lists and one kv_copy per attention layer; a row already in place — a chain verified as a tree — is
  // not copied), seq_len grows by path.size(), hybrid models take the recurrent state captured after the
  // last node, and the cells of the rest of the tree are released.
  void commit(int seq, const std::vector<int>& path);

  // Physical cell of a sequence position (reserve() must have covered it).
  int32_t cell(int seq, int pos) const;
  const std::vector<int32_t>& block_table() const { return table_; }  // (n_seq, max_blocks), -1 = none
  bool table_dirty() const { return table_dirty_; }
  void clear_dirty() { table_dirty_ = false; }

  KvLayer& layer(int il) { return layers_[static_cast<size_t>(il)]; }
  bool has_layer(int il) const { return layers_[static_cast<size_t>(il)].k.valid(); }

 private:
  Backend& backend_;
  uint64_t id_;
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
  std::unique_ptr<RecurrentState> recurrent_;
  struct Tree {
    std::vector<int32_t> parent, rows;  // (n tree rows)
  };
  std::vector<Tree> trees_;             // (n_seq)
  Tensor commit_src_, commit_dst_;      // I32 (kMaxTreeRows) cell lists of commit()'s kv_copy
  void release_blocks(int seq, int n);  // frees the sequence's blocks past those holding positions [0, n)
};

}  // namespace pg
