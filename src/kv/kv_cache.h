// The KV cache interface (cf. llama.cpp's llama-memory.h): a sequence's whole memory — the K/V rows of
// its attention layers and, for hybrid models (Gated DeltaNet + attention), the recurrent state of its
// linear-attention layers (recurrent()). The model's forward and the engine use only this interface;
// PagedKvCache (kv/paged_kv_cache.h) is the implementation: cells in fixed-size refcounted blocks,
// one block table per sequence slot, copy-on-write when a write lands in a block that sequences share.
//
// Positions are logical (0 .. seq_len-1 of a sequence); cells are physical rows of a layer's K and V
// tensors. Every attention layer has its own K and V tensors (element types chosen per layer: K and V
// may differ) addressed through the one block table.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "kv/recurrent_state.h"

namespace pg {

struct KvCacheOptions {
  int n_seq = 1;           // sequence slots
  int n_ctx = 4096;        // max tokens per sequence
  DType type = DType::F16; // storage of K and V unless type_k / type_v say otherwise (any KV type of core/kv_quant.h)
  int block_size = 64;     // cells per block
  int n_blocks = 0;        // 0 = enough for every slot at full context
  int n_capture = 0;       // hybrid models: recurrent-state capture slots (max rows of a capturing forward)
  int n_snapshot = 0;      // hybrid models: recurrent-state slots the prefix cache keeps block-boundary states in
  std::optional<DType> type_k = std::nullopt, type_v = std::nullopt;  // K and V storage chosen separately
  DType k_type() const { return type_k.value_or(type); }
  DType v_type() const { return type_v.value_or(type); }
};

// Width of one layer's K and V rows (n_head_kv*head_dim) in values; 0 for layers without a KV cache.
// n_head_kv tells the cache where the heads split (each head is padded to the storage type's block or
// rotation group, core/kv_quant.h); 0 = the row is one head.
struct KvLayerShape {
  int64_t k_width = 0, v_width = 0;
  int n_head_kv = 0;
};

class KvCache {
 public:
  virtual ~KvCache() = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  // Unique for the process's lifetime, so users that size scratch per cache never confuse a new
  // cache with a freed one that happened to live at the same address.
  uint64_t id() const { return id_; }

  // ---- sizes ----
  virtual const KvCacheOptions& options() const = 0;
  int n_seq() const { return options().n_seq; }
  int n_ctx() const { return options().n_ctx; }
  int block_size() const { return options().block_size; }
  virtual int max_blocks() const = 0;    // block-table row length
  virtual int free_blocks() const = 0;
  virtual int total_blocks() const = 0;
  virtual size_t bytes() const = 0;
  virtual size_t bytes_per_token() const = 0;  // K+V bytes per cached token over all layers (bandwidth accounting)

  // ---- sequences ----
  // Number of tokens stored for a sequence (its next position).
  virtual int seq_len(int seq) const = 0;
  // Makes room for positions [0, n) of a sequence; false when the pool has no free block.
  virtual bool reserve(int seq, int n) = 0;
  // Marks positions [0, n) as written (after a forward).
  virtual void set_len(int seq, int n) = 0;
  // Drops positions ≥ n (rollback after rejected speculation, or a new request reusing a prefix), and
  // releases the cells reserved past n (a tree's drafts included). Hybrid models: the recurrent state
  // cannot be cut, so truncating to 0 < n < seq_len restores the snapshot of position n-1 taken by the
  // last capturing forward over that history (Model::forward with ForwardOptions::capture: the state
  // before the batch and after each row) and throws pg::Error, changing nothing, when there is none.
  virtual void truncate(int seq, int n) = 0;
  void clear(int seq) { truncate(seq, 0); }
  // Makes sequence dst (emptied first) hold the first n positions of src without copying: dst's block
  // table points at src's blocks, whose refcounts grow; the first write into a shared block copies it
  // (copy-on-write). Hybrid models: the recurrent state is copied, so n must be seq_len(src) or a
  // position with a captured snapshot (as for truncate).
  virtual void share_prefix(int src, int dst, int n) = 0;

  // The sequence's whole state (its K/V rows 0..seq_len-1 and, for hybrid models, its recurrent state)
  // as a self-describing byte string; restore_seq loads it into any slot of a cache of the same model
  // and layout (checked), replacing that slot's contents.
  virtual std::vector<uint8_t> save_seq(int seq) const = 0;
  virtual void restore_seq(int seq, const std::vector<uint8_t>& data) = 0;

  // ---- token trees (speculative verification) ----
  // A tree forward (Model::forward with Batch::parent) stores the n tree rows of a sequence at logical
  // positions seq_len + j, j = 0..n-1 in batch order, without advancing seq_len, and records the tree
  // here: parent[j] (index j of the parent row, -1 for a root) and rows[j] (the batch row, which is also
  // the recurrent capture index of hybrid models). Anything else that changes the sequence (truncate,
  // clear, restore, commit, a chain forward) drops the record.
  virtual void set_tree(int seq, std::vector<int32_t> parent, std::vector<int32_t> rows) = 0;
  virtual void drop_tree(int seq) = 0;
  virtual int tree_size(int seq) const = 0;
  // Accepts a root-to-node path of the sequence's last tree: path = tree indices j, root first, each the
  // child of the previous (checked; an empty path accepts nothing). Afterwards the sequence holds those
  // rows at positions seq_len, seq_len+1, ... (their K/V moved on the backend with one upload of the cell
  // lists and one kv_copy per attention layer; a row already in place — a chain verified as a tree — is
  // not copied), seq_len grows by path.size(), hybrid models take the recurrent state captured after the
  // last node, and the cells of the rest of the tree are released.
  virtual void commit(int seq, const std::vector<int>& path) = 0;

  // ---- recurrent state of hybrid models; nullptr for attention-only models ----
  virtual RecurrentState* recurrent() = 0;
  virtual const RecurrentState* recurrent() const = 0;

  // ---- addressing, for the forward ----
  // Physical cell of a sequence position (reserve() must have covered it), for reading.
  virtual int32_t cell(int seq, int pos) const = 0;
  // The cell a forward writes position pos of seq to: as cell(), after making the block the sequence's
  // own (copy-on-write) when other sequences share it. Throws when no block is free for the copy.
  virtual int32_t write_cell(int seq, int pos) = 0;
  virtual const std::vector<int32_t>& block_table() const = 0;  // (n_seq, max_blocks), -1 = none
  virtual bool table_dirty() const = 0;  // the table changed since clear_dirty() (re-upload it)
  virtual void clear_dirty() = 0;
  virtual int n_layer() const = 0;
  virtual KvLayer& layer(int il) = 0;
  virtual bool has_layer(int il) const = 0;

 protected:
  KvCache();

 private:
  uint64_t id_;
};

}  // namespace pg
