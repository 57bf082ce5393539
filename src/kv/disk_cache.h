// The disk tier of the prefix cache (docs/prefix-cache.md): one block file per cached chain.
//
// Directory layout: DIR/<identity>/ where identity is the hex of the chain's root key (model identity,
// K/V types, block size), so servers of different models or layouts sharing DIR never see each other's
// files; DIR/<identity>/<last block key>.pgkv are the block files; DIR/<identity>/quarantine/ holds
// files found broken; DIR/<identity>/lock is flock'ed (exclusive) around every scan, write+rename and
// eviction, so two servers on one directory never interleave those (readers verify checksums, and a
// file the other server evicted reads as a miss).
//
// Block file, format version 2 (little-endian):
//   magic "PGKVBLK\0" (8) | version u32 | header bytes u32 | model identity u64 | K type u32 | V type u32
//   | block size u32 | n_blocks u32 | block bytes u64 | snapshot bytes u64 (one recurrent slot; 0 =
//   attention model) | snapshot depth u32 | tail cells u32 | tail key u64
//   | keys u64[n_blocks] (the hash chain) | tokens i32[n_blocks·block size] | tail tokens i32[tail cells]
//   | payload checksum u64 (payload_checksum over the whole payload) | header checksum u64 (FNV-1a of
//   all bytes before it)
//   | payload: n_blocks × block bytes (PagedKvCache::read_block)
//             | the block snapshot (hybrid: the state after `snapshot depth` blocks; absent when 0)
//             | the tail: cells [0, tail cells) of the sequence's last, partly filled block
//               (PagedKvCache::read_cells: tail cells × block bytes / block size)
//             | the tail snapshot (hybrid, with a tail: the state after the tail's last cell)
// The tail is what the RAM index keeps as a released sequence's tail entry (kv/prefix_cache.h): a disk
// hit reuses it by the same copy-on-write as a RAM hit. The file is named after its last key: the tail
// key when it has a tail, else the last block's. Version 1 files (full blocks only, no tail fields) are
// quarantined at the scan with one warning saying so.
// Written to a temporary file in the same folder, fsync'd, renamed over the final name, and the folder
// fsync'd. The start-up scan checks every header (magic, version, identity, types, sizes, checksum of
// the header, file length); loads check the payload checksum and that keys and tokens are the prompt's.
// Anything that fails is skipped with one warning and moved to quarantine/ — never a crash, never
// wrong KV. A write that fails (disk full, directory gone) turns the tier off with one warning; the
// server keeps serving from RAM.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace pg {

// "20G", "512M", "1.5T", "4096K", "123" (MiB) → bytes. Throws pg::Error on anything else.
uint64_t parse_byte_size(const std::string& s);

struct BlockFileHeader {
  uint32_t version = 0, header_bytes = 0;
  uint64_t model_id = 0;
  uint32_t k_type = 0, v_type = 0, block_size = 0, n_blocks = 0;
  uint64_t block_bytes = 0, snapshot_bytes = 0;
  uint32_t snap_depth = 0;        // hybrid: blocks the block snapshot follows (0 = no block snapshot)
  uint32_t tail_cells = 0;        // cells of the partial tail (0 = none; < block_size)
  uint64_t tail_key = 0;          // prefix_block_key(keys.back(), tail tokens) (0 without a tail)
  std::vector<uint64_t> keys;     // (n_blocks)
  std::vector<int32_t> tokens;    // (n_blocks·block_size)
  std::vector<int32_t> tail_tokens;  // (tail_cells)
  uint64_t payload_checksum = 0;
  // Payload offsets of its sections (blocks at 0).
  uint64_t block_snapshot_at() const { return n_blocks * block_bytes; }
  uint64_t tail_at() const { return block_snapshot_at() + (snap_depth > 0 ? snapshot_bytes : 0); }
  uint64_t tail_bytes() const { return block_size > 0 ? tail_cells * (block_bytes / block_size) : 0; }
  uint64_t tail_snapshot_at() const { return tail_at() + tail_bytes(); }
  uint64_t payload_bytes() const { return tail_snapshot_at() + (tail_cells > 0 ? snapshot_bytes : 0); }
};

// Parses a block file's header from its first bytes (at least header_bytes of them; `file_size` the
// whole file's length, checked against the header). Returns false with the reason in `why` for
// anything malformed; never reads outside `data`.
bool parse_block_file_header(std::span<const uint8_t> data, uint64_t file_size, BlockFileHeader& h, std::string& why);
// The header bytes of a block file (its payload follows).
std::vector<uint8_t> make_block_file_header(const BlockFileHeader& h);
uint64_t fnv1a64(const uint8_t* p, size_t n, uint64_t h = 1469598103934665603ull);
// The payload checksum of block files (word-wise; FNV-1a byte by byte was the load's largest cost).
uint64_t payload_checksum(const uint8_t* p, size_t n);

struct DiskCacheOptions {
  std::string dir;
  uint64_t budget = 0;  // bytes
  uint64_t root = 0;    // prefix_root_key: model identity + K/V types + block size
  uint64_t model_id = 0;
  DType k_type = DType::F16, v_type = DType::F16;
  int block_size = 64;
  uint64_t block_bytes = 0, snapshot_bytes = 0;
};

class DiskCache {
 public:
  // Creates DIR/<identity>/ and scans it. An unusable directory leaves the tier disabled (one warning).
  explicit DiskCache(const DiskCacheOptions& opt);
  ~DiskCache();  // finishes queued writes
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  bool enabled() const;
  const std::string& folder() const { return folder_; }

  // The file serving the most of `prompt` (keys: the chain of its first whole blocks, those that leave
  // a prompt token to prefill), as a RAM hit would: n ≤ keys.size() of the file's blocks that are the
  // prompt's, then the leading cells the prompt shares with what follows them in the file — its tail
  // when n is all of its blocks, else its block n (at most up to the prompt's last token). Hybrid
  // models: only where a state is stored — n equal to its snapshot depth, or its whole tail matched to
  // its end. tails = false: no partly used block (--no-partial-blocks). tokens = 0 when none.
  struct Found {
    std::string name;
    int n_blocks = 0;     // whole blocks to attach
    int part_cells = 0;   // cells of the partly used block (0 = none)
    bool part_tail = false;  // that block is the file's tail (else its block n_blocks)
    int tokens = 0;       // n_blocks·block_size + part_cells
  };
  Found find(const std::vector<uint64_t>& keys, const std::vector<int32_t>& prompt, bool tails = true) const;
  // Reads the file, checks it (header, payload checksum, keys[0..n_blocks) and tokens of the prompt,
  // and the partly used block's leading tokens), and returns its payload; false when it is missing (evicted
  // by another server: silent) or broken (one warning, quarantined).
  bool load(const Found& f, const std::vector<uint64_t>& keys, const std::vector<int32_t>& prompt, BlockFileHeader& h,
            std::vector<uint8_t>& payload);
  // A file named after this key (the last block's, or the tail's) exists.
  bool has(uint64_t last_key) const;
  // What write() stores: the chain's keys and tokens, the snapshot depth, the tail (tokens and key,
  // empty/0 for none) and the payload in file order (blocks, block snapshot, tail cells, tail snapshot).
  struct Chain {
    std::vector<uint64_t> keys;
    std::vector<int32_t> tokens;
    uint32_t snap_depth = 0;
    std::vector<int32_t> tail_tokens;
    uint64_t tail_key = 0;
    std::vector<uint8_t> payload;
  };
  // Queues a write (the writer thread does the I/O).
  void write(Chain c);
  void flush() const;

  uint64_t files() const;
  uint64_t bytes() const;
  uint64_t writes() const;
  uint64_t write_bytes() const;

 private:
  struct FileRec {
    std::string name;
    int n_blocks = 0;
    int snap_depth = 0;
    uint64_t size = 0;
    uint64_t tick = 0;
    std::vector<uint64_t> keys;
    std::vector<int32_t> tokens;  // (n_blocks·block_size) the chain's, and the tail's: find() matches
    std::vector<int32_t> tail;    // them without reading the file (4 bytes a token next to its KV)
  };
  using Job = Chain;
  void scan();
  void add_locked(FileRec r);
  void remove_locked(const std::string& name);
  void quarantine(const std::string& name, const std::string& why);
  void evict_locked();
  void writer();
  bool write_file(const Job& j);
  void disable(const std::string& why);

  DiskCacheOptions opt_;
  std::string folder_;
  int lock_fd_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  mutable std::condition_variable idle_;
  bool enabled_ = false, stop_ = false;
  int busy_ = 0;
  std::deque<Job> jobs_;
  std::unordered_map<std::string, FileRec> files_;
  std::unordered_map<uint64_t, std::vector<std::string>> by_key_;  // chain key → files holding it
  uint64_t tick_ = 0, total_ = 0, writes_ = 0, write_bytes_ = 0;
  std::thread thread_;
};

}  // namespace pg
