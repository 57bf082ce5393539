// The prefix cache (docs/prefix-cache.md): full KV blocks of finished (and running) sequences kept in
// a block-hash index over the paged KV cache, so a new request that starts with the same tokens reuses
// them block by block and prefills only the rest.
//
// Keys: block i of a token sequence is keyed by hash(key of block i-1, the block's block_size tokens);
// the root key mixes the model identity, the K and V storage types and the block size, so a key names
// "these exact tokens at these positions, with everything before them, in this model and layout". An
// entry also keeps its tokens, which a lookup compares, so a hash collision is a miss, never wrong KV.
//
// Sharing: an index entry holds one reference to its physical block (PagedKvCache::hold_block); a hit
// attaches the blocks to the new sequence's block table (refcount +1 each), so any number of running
// sequences and the index share them. The new sequence only writes past its attached full blocks, so
// shared full blocks are never written. At least one prompt token is always left to prefill so the last
// prompt row's logits exist.
//
// Partial blocks (PrefixCacheOptions::partial): a released sequence's last, partly filled block is
// kept too, as a "tail" entry under its parent key holding its m < block_size tokens. After the walk
// over full blocks, a lookup compares the rest of the prompt with every child of the last matched key
// (full blocks and tails: a prompt that diverges inside a cached full block matches its leading cells)
// and reuses the longest common run of cells by copy-on-write: the sequence gets its own block with
// those cells copied (PagedKvCache::attach_partial) and continues writing there; the cached block is
// never written. A tail that a longer entry under the same parent starts with is dropped (superseded).
// Hybrid models: the recurrent state must be that of exactly the reused length, and a state cannot be
// cut back, so only a tail matched to its end is reused, with the state snapshotted at release (the
// sequence's state after its last token); a prompt diverging inside a block falls back to the deepest
// block-boundary snapshot.
//
// Budget and eviction: blocks that only the index holds (refcount 1) count against the RAM budget;
// over it, the least recently used leaf (no cached child) whose block no sequence holds is dropped, so
// blocks of running requests are never evicted and a chain never loses its middle. The pool is sized
// for every slot at full context plus the budget (plan()), so caching never starves a slot.
//
// Hybrid models (Gated DeltaNet + attention): attention K/V can be shared, but the recurrent state
// summarises the whole prefix and must be restored exactly. The prefill of a prompt stops once at its
// last full-block boundary before the final token (chunk_end()); after that forward the state is
// copied into a snapshot slot (RecurrentState::snapshot_slot) and, when the sequence is released, tied
// to the index entry of that block. A hit on a hybrid model ends at the deepest matched block that has
// a snapshot, whose state is copied into the sequence: the prefix is never recomputed. One snapshot per
// prompt (not per block) keeps the memory at one recurrent slot per cached prompt.
//
// Disk tier (kv/disk_cache.h): when enabled, a released sequence's cached chain — its full blocks and
// its tail (hybrid: with the snapshots the RAM entries have) — is also written as one block file (off
// the engine thread); a lookup that the RAM index cannot serve as deeply reads the file back (verified)
// into fresh blocks, which then join the RAM index, the tail as a tail entry copied like a RAM one.
//
// Engine-thread only, except stats(), which any thread may read.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/paged_kv_cache.h"

namespace pg {

class DiskCache;

struct PrefixCacheOptions {
  size_t ram_bytes = 0;        // RAM budget for what only the index holds (blocks, and hybrid snapshots)
  uint64_t model_id = 0;       // identity of the model's weights and config (part of every key)
  std::string disk_dir;        // "" = no disk tier
  uint64_t disk_bytes = 0;     // disk budget (bytes) when disk_dir is set
  bool partial = true;         // reuse partially filled blocks (tails) and the leading cells of diverging blocks
};

// What a RAM budget buys: blocks the index may hold alone and, for hybrid models, recurrent snapshot
// slots (KvCacheOptions::n_blocks grows by `blocks`, KvCacheOptions::n_snapshot = `snapshots`).
struct PrefixPlan {
  int blocks = 0;
  int snapshots = 0;
};

struct PrefixHit {
  int n_tokens = 0;  // prompt tokens attached (not to be prefilled)
  int n_disk = 0;    // of which read back from the disk tier
  int n_partial = 0; // of which cells of a partly reused block (copied, < block_size)
};

struct PrefixStats {
  uint64_t lookups = 0;
  uint64_t prompt_tokens = 0;    // prompt tokens of every lookup
  uint64_t ram_hit_tokens = 0;   // served from RAM blocks
  uint64_t disk_hit_tokens = 0;  // served from disk block files
  uint64_t partial_hit_tokens = 0;  // of the RAM and disk hits, cells copied from partly reused blocks
  uint64_t evicted_blocks = 0;
  uint64_t disk_writes = 0, disk_write_bytes = 0;
  uint64_t ram_blocks = 0;       // blocks in the index now
  uint64_t ram_bytes = 0;        // budget bytes in use now (index-only blocks + snapshots)
  uint64_t disk_files = 0, disk_bytes = 0;
};

// 64-bit keys of the block-hash chain.
uint64_t prefix_root_key(uint64_t model_id, DType k_type, DType v_type, int block_size);
uint64_t prefix_block_key(uint64_t parent, const int32_t* tokens, int n);

class PrefixCache {
 public:
  static PrefixPlan plan(size_t ram_bytes, size_t block_bytes, size_t snapshot_bytes, int n_seq);

  PrefixCache(PagedKvCache& kv, const PrefixCacheOptions& opt);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The empty sequence seq is about to prefill `prompt`: attaches the longest cached prefix (RAM, then
  // disk when that reaches deeper) and returns how many tokens it covers (seq_len(seq) afterwards).
  // max_tokens ≥ 0: the hit covers at most that many tokens (a drafter that needs the target to run
  // the rest, spec::Drafter::reusable_prefix); -1 = no cap. Stats count the whole prompt either way.
  PrefixHit attach(int seq, const std::vector<int32_t>& prompt, int max_tokens = -1);
  // Where a prefill chunk of seq starting at `from` must end at the latest (hybrid models: the snapshot
  // boundary; otherwise n_prompt).
  int chunk_end(int seq, int from, int n_prompt) const;
  // After a forward: seq has n_prefilled prompt tokens in the cache (hybrid: snapshots at the boundary).
  void after_forward(int seq, int n_prefilled);
  // The sequence is done: indexes its full blocks (history = its tokens; the KV of positions
  // 0..n_valid-1 is theirs, -1 = all of seq_len — a sequence that ended inside a speculative verify
  // step has rejected drafts' rows after its last accepted token), writes them to the disk tier,
  // empties the slot and evicts to the budget.
  void release(int seq, const std::vector<int32_t>& history, int n_valid = -1);
  // The sequence's cache content is not trustworthy (a failed forward): empties the slot, indexes nothing.
  void abandon(int seq);
  // Blocks until queued disk writes are done (tests, shutdown).
  void flush() const;

  PrefixStats stats() const;
  bool hybrid() const { return rs_ != nullptr; }
  int budget_blocks() const { return budget_blocks_; }
  int n_snapshots() const { return static_cast<int>(snap_owner_.size()); }
  // Blocks only the index holds (evictable; not "in use" by any sequence), as of the last change.
  int idle_blocks() const { return static_cast<int>(n_idle_.load()); }
  bool disk_enabled() const;

 private:
  struct Entry {
    uint64_t parent = 0;
    int32_t block = -1;
    int depth = 0;               // block index in the chain (0 = first block)
    int children = 0;            // cached entries whose parent this is (full blocks and tails)
    int snap = -1;               // hybrid: snapshot index holding the state after this block, or -1
    uint64_t tick = 0;           // last use
    std::vector<int32_t> tokens; // (block_size) a full block, or (m < block_size) a tail
    bool full(int bs) const { return static_cast<int>(tokens.size()) == bs; }
  };
  // The longest run of cells a child of one key shares with the prompt past that key.
  struct PartialMatch {
    uint64_t key = 0;  // the child's key (0 = none)
    int n = 0;         // cells to reuse (1 .. block_size-1)
  };
  struct Pending {
    int point = -1;  // hybrid: prompt position of the snapshot boundary still to reach (-1 = none)
    int snap = -1;   // snapshot taken at position snap_at, waiting for release
    int snap_at = 0;
  };

  std::vector<uint64_t> chain(const std::vector<int32_t>& toks, int n_blocks) const;
  Entry* find(uint64_t key, const int32_t* tokens);
  Entry& insert(uint64_t key, uint64_t parent, int depth, int32_t block, const int32_t* tokens, int n_tokens = -1);
  void remove(uint64_t key);  // drops an entry (a leaf): its block reference, snapshot and child link
  // Partial reuse: the best child of `parent` for prompt[from, from + limit) (hybrid: a tail with a
  // snapshot matched to its end), and attaching it to seq (which holds exactly `from` tokens).
  PartialMatch find_partial(uint64_t parent, const std::vector<int32_t>& prompt, int from, int limit) const;
  bool attach_tail(int seq, const PartialMatch& m);
  // Makes sure a block is free for attach_tail (evicting), holding `attach` and m's block meanwhile.
  bool room_for_copy(const std::vector<int32_t>& attach, const PartialMatch& m);
  // Tails of `parent` that the entry `key` (tokens t) starts with serve no hit it cannot: dropped
  // (attention models; a hybrid tail's snapshot is of its own length, so it stays).
  void supersede(uint64_t parent, uint64_t key, const std::vector<int32_t>& t);
  // Indexes positions [depth·block_size, len) of the released seq as a tail of `parent` (hybrid: with
  // the state at len snapshotted, which `state_at_len` says the sequence has).
  void release_tail(int seq, const std::vector<int32_t>& history, int len, uint64_t parent, int depth, bool state_at_len);
  int take_snapshot_slot();  // a free snapshot index (evicting the least recently used one), or -1
  void enforce_budget();
  int count_idle() const;
  bool evict_one();
  // The disk tier's part of a hit, when a block file serves more than `ram_tokens` (what RAM serves):
  // attaches its blocks to seq (RAM entries where the index has them), adds the loaded blocks and its
  // tail (hybrid: with the tail's snapshot) to the index, leaves a free block for the tail's copy, and
  // returns the blocks attached (0 = nothing changed). `disk_tail`: the key of a tail entry it loaded
  // (0 = none), for attach() to copy; hybrid: `state` says whether seq's recurrent state was set (from
  // the block snapshot) or must come from that tail.
  int attach_disk(int seq, const std::vector<int32_t>& prompt, const std::vector<uint64_t>& keys, int ram_tokens, uint64_t& disk_tail,
                  bool& state);

  PagedKvCache& kv_;
  RecurrentState* rs_;
  PrefixCacheOptions opt_;
  int bs_;
  int budget_blocks_ = 0;
  uint64_t root_ = 0;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Entry> index_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> kids_;  // parent key (root_ included) → child keys
  std::vector<Pending> pending_;      // (n_seq)
  std::vector<uint64_t> snap_owner_;  // (n_snapshot) key of the entry holding it; 0 free, 1 pending
  std::unique_ptr<DiskCache> disk_;

  std::atomic<uint64_t> lookups_{0}, prompt_tokens_{0}, ram_hits_{0}, disk_hits_{0}, partial_hits_{0}, evicted_{0};
  std::atomic<uint64_t> n_index_{0}, used_bytes_{0}, n_idle_{0};
};

}  // namespace pg
