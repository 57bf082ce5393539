#include "kv/disk_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace pg {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'P', 'G', 'K', 'V', 'B', 'L', 'K', '\0'};
// 2: the partial tail (tail cells, key, tokens and KV, hybrid: its snapshot) and the snapshot depth.
constexpr uint32_t kVersion = 2;
constexpr size_t kFixed = 8 + 4 + 4 + 8 + 4 * 4 + 8 + 8 + 4 + 4 + 8;  // magic .. tail key
constexpr uint32_t kMaxBlocks = 1u << 20;                 // 64M tokens at block size 64: no real prompt
constexpr uint32_t kMaxBlockSize = 1u << 16;

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

template <class T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// RAII exclusive flock on the folder's lock file (no-op when it could not be opened).
struct DirLock {
  int fd;
  explicit DirLock(int f) : fd(f) {
    if (fd >= 0)
      while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~DirLock() {
    if (fd >= 0) flock(fd, LOCK_UN);
  }
};

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

uint64_t fnv1a64(const uint8_t* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t payload_checksum(const uint8_t* p, size_t n) {
  // Four independent lanes of 8-byte words (multiply-xorshift), so a MiB checksums in well under a
  // millisecond; then the tail bytes and the length.
  uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull, 0x27d4eb2f165667c5ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * 0x100000001b3ull;
      h[l] ^= h[l] >> 29;
    }
  uint64_t r = fnv1a64(p + i, n - i, h[0] ^ (h[1] << 1) ^ (h[2] << 2) ^ (h[3] << 3));
  r ^= static_cast<uint64_t>(n);
  r *= 0xff51afd7ed558ccdull;
  return r ^ (r >> 33);
}

uint64_t parse_byte_size(const std::string& s) {
  const std::string bad = "cannot parse the size '" + s + "' (expected a number with an optional K, M, G or T suffix, e.g. 20G or 512M)";
  PG_CHECK(!s.empty(), bad);
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw Error(bad);
  }
  PG_CHECK(std::isfinite(v) && v >= 0 && (s[0] >= '0' && s[0] <= '9'), bad);
  std::string suf = s.substr(used);
  for (char& c : suf) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mul;
  if (suf.empty()) mul = 1024.0 * 1024.0;  // a bare number is MiB, like --cache-ram
  else if (suf == "B") mul = 1;
  else if (suf == "K" || suf == "KB" || suf == "KIB") mul = 1024.0;
  else if (suf == "M" || suf == "MB" || suf == "MIB") mul = 1024.0 * 1024.0;
  else if (suf == "G" || suf == "GB" || suf == "GIB") mul = 1024.0 * 1024.0 * 1024.0;
  else if (suf == "T" || suf == "TB" || suf == "TIB") mul = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  else throw Error(bad);
  const double b = v * mul;
  PG_CHECK(b < 9.0e18, bad);
  return static_cast<uint64_t>(b);
}

std::vector<uint8_t> make_block_file_header(const BlockFileHeader& h) {
  std::vector<uint8_t> out(kMagic, kMagic + 8);
  const size_t header_bytes = kFixed + h.keys.size() * 8 + h.tokens.size() * 4 + h.tail_tokens.size() * 4 + 16;
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, static_cast<uint32_t>(header_bytes));
  put<uint64_t>(out, h.model_id);
  put<uint32_t>(out, h.k_type);
  put<uint32_t>(out, h.v_type);
  put<uint32_t>(out, h.block_size);
  put<uint32_t>(out, h.n_blocks);
  put<uint64_t>(out, h.block_bytes);
  put<uint64_t>(out, h.snapshot_bytes);
  put<uint32_t>(out, h.snap_depth);
  put<uint32_t>(out, static_cast<uint32_t>(h.tail_tokens.size()));
  put<uint64_t>(out, h.tail_key);
  for (uint64_t k : h.keys) put<uint64_t>(out, k);
  for (int32_t t : h.tokens) put<int32_t>(out, t);
  for (int32_t t : h.tail_tokens) put<int32_t>(out, t);
  put<uint64_t>(out, h.payload_checksum);
  put<uint64_t>(out, fnv1a64(out.data(), out.size()));
  return out;
}

bool parse_block_file_header(std::span<const uint8_t> d, uint64_t file_size, BlockFileHeader& h, std::string& why) {
  if (d.size() < 16) return why = "shorter than a block file header", false;
  if (std::memcmp(d.data(), kMagic, 8) != 0) return why = "not a block file (bad magic)", false;
  const uint8_t* p = d.data() + 8;
  h.version = get<uint32_t>(p);
  // The version first: an older file's fixed part is shorter, and the reason should name the version.
  if (h.version != kVersion)
    return why = "block file version " + std::to_string(h.version) + " is not supported (this build reads version " + std::to_string(kVersion) +
                 (h.version == 1 ? "; version 1 files hold full blocks only and are not read since the partial tail was added)" : ")"),
           false;
  if (d.size() < kFixed) return why = "shorter than a block file header", false;
  h.header_bytes = get<uint32_t>(p + 4);
  h.model_id = get<uint64_t>(p + 8);
  h.k_type = get<uint32_t>(p + 16);
  h.v_type = get<uint32_t>(p + 20);
  h.block_size = get<uint32_t>(p + 24);
  h.n_blocks = get<uint32_t>(p + 28);
  h.block_bytes = get<uint64_t>(p + 32);
  h.snapshot_bytes = get<uint64_t>(p + 40);
  h.snap_depth = get<uint32_t>(p + 48);
  h.tail_cells = get<uint32_t>(p + 52);
  h.tail_key = get<uint64_t>(p + 56);
  if (h.block_size == 0 || h.block_size > kMaxBlockSize || h.n_blocks == 0 || h.n_blocks > kMaxBlocks)
    return why = "implausible block size or count", false;
  if (h.tail_cells >= h.block_size) return why = "a tail of " + std::to_string(h.tail_cells) + " cells does not fit a block of " + std::to_string(h.block_size), false;
  if ((h.tail_cells == 0) != (h.tail_key == 0)) return why = "tail key and tail length disagree", false;
  if (h.snap_depth > h.n_blocks) return why = "snapshot depth past the last block", false;
  // Attention files carry no states; a hybrid file without one serves no hit.
  if (h.snapshot_bytes == 0 ? h.snap_depth != 0 : (h.snap_depth == 0 && h.tail_cells == 0))
    return why = "snapshot fields inconsistent with the snapshot size", false;
  const uint64_t want = kFixed + static_cast<uint64_t>(h.n_blocks) * 8 + static_cast<uint64_t>(h.n_blocks) * h.block_size * 4 +
                        static_cast<uint64_t>(h.tail_cells) * 4 + 16;
  if (h.header_bytes != want) return why = "header length does not match its block count", false;
  if (d.size() < want) return why = "truncated header", false;
  // Sizes are bounded before multiplying: a payload larger than 2^62 bytes is malformed, not an overflow.
  if (h.block_bytes > (1ull << 40) || h.snapshot_bytes > (1ull << 40)) return why = "implausible payload size", false;
  // The tail holds whole cells of the block's layout.
  if (h.block_bytes % h.block_size != 0) return why = "block bytes are not a whole number of cells", false;
  if (file_size != want + h.payload_bytes())
    return why = "file is " + std::to_string(file_size) + " bytes, the header says " + std::to_string(want + h.payload_bytes()) + " (truncated?)", false;
  const uint8_t* q = d.data() + kFixed;
  h.keys.resize(h.n_blocks);
  for (uint32_t i = 0; i < h.n_blocks; ++i) h.keys[i] = get<uint64_t>(q + 8 * i);
  q += 8ull * h.n_blocks;
  h.tokens.resize(static_cast<size_t>(h.n_blocks) * h.block_size);
  std::memcpy(h.tokens.data(), q, h.tokens.size() * 4);
  q += h.tokens.size() * 4;
  h.tail_tokens.resize(h.tail_cells);
  if (h.tail_cells > 0) std::memcpy(h.tail_tokens.data(), q, h.tail_tokens.size() * 4);
  q += h.tail_tokens.size() * 4;
  h.payload_checksum = get<uint64_t>(q);
  const uint64_t hc = get<uint64_t>(q + 8);
  if (hc != fnv1a64(d.data(), want - 8)) return why = "header checksum mismatch (corrupt)", false;
  return true;
}

DiskCache::DiskCache(const DiskCacheOptions& opt) : opt_(opt) {
  folder_ = (fs::path(opt_.dir) / hex(opt_.root)).string();
  std::error_code ec;
  fs::create_directories(fs::path(folder_) / "quarantine", ec);
  if (ec) {
    PG_WARN("--kv-cache-dir %s: cannot create %s (%s): serving without the disk cache", opt_.dir.c_str(), folder_.c_str(), ec.message().c_str());
    return;
  }
  // Writable? (a read-only mount or someone else's directory): one probe file.
  const std::string probe = folder_ + "/.probe." + std::to_string(getpid());
  const int pf = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (pf < 0) {
    PG_WARN("--kv-cache-dir %s is not writable (%s): serving without the disk cache", opt_.dir.c_str(), std::strerror(errno));
    return;
  }
  ::close(pf);
  ::unlink(probe.c_str());
  lock_fd_ = ::open((folder_ + "/lock").c_str(), O_RDWR | O_CREAT, 0644);
  enabled_ = true;
  scan();
  thread_ = std::thread([this] { writer(); });
}

DiskCache::~DiskCache() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

bool DiskCache::enabled() const {
  std::lock_guard<std::mutex> lk(mu_);
  return enabled_;
}

void DiskCache::disable(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!enabled_) return;
  enabled_ = false;
  jobs_.clear();
  PG_WARN("disk KV cache %s: %s: serving without the disk cache from now on", folder_.c_str(), why.c_str());
}

void DiskCache::add_locked(FileRec r) {
  for (size_t i = 0; i < r.keys.size(); ++i) by_key_[r.keys[i]].push_back(r.name);
  total_ += r.size;
  files_[r.name] = std::move(r);
}

void DiskCache::remove_locked(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) return;
  for (uint64_t k : it->second.keys) {
    auto b = by_key_.find(k);
    if (b == by_key_.end()) continue;
    std::erase(b->second, name);
    if (b->second.empty()) by_key_.erase(b);
  }
  total_ -= it->second.size;
  files_.erase(it);
}

void DiskCache::quarantine(const std::string& name, const std::string& why) {
  PG_WARN("disk KV cache: skipping %s/%s: %s (moved to quarantine/)", folder_.c_str(), name.c_str(), why.c_str());
  std::error_code ec;
  fs::rename(fs::path(folder_) / name, fs::path(folder_) / "quarantine" / name, ec);
  if (ec) fs::remove(fs::path(folder_) / name, ec);
}

void DiskCache::scan() {
  DirLock lock(lock_fd_);
  std::vector<std::pair<fs::file_time_type, FileRec>> found;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(folder_, ec)) {
    const std::string name = de.path().filename().string();
    if (!de.is_regular_file(ec)) continue;
    if (name.ends_with(".tmp")) {
      // A writer that died mid-write; a live one renames within seconds.
      const auto age = fs::file_time_type::clock::now() - de.last_write_time(ec);
      if (!ec && age > std::chrono::hours(1)) fs::remove(de.path(), ec);
      continue;
    }
    if (!name.ends_with(".pgkv")) continue;
    const uint64_t size = de.file_size(ec);
    if (ec) continue;
    BlockFileHeader h;
    std::string why;
    std::vector<uint8_t> head(static_cast<size_t>(std::min<uint64_t>(size, 1u << 26)));
    const int fd = ::open(de.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    const bool ok_read = read_all(fd, head.data(), head.size());
    ::close(fd);
    bool ok = ok_read && parse_block_file_header(head, size, h, why);
    if (!ok_read) why = "unreadable";
    if (ok && (h.model_id != opt_.model_id)) ok = false, why = "written for another model";
    if (ok && (h.k_type != static_cast<uint32_t>(opt_.k_type) || h.v_type != static_cast<uint32_t>(opt_.v_type)))
      ok = false, why = "written with other K/V cache types";
    if (ok && (h.block_size != static_cast<uint32_t>(opt_.block_size) || h.block_bytes != opt_.block_bytes || h.snapshot_bytes != opt_.snapshot_bytes))
      ok = false, why = "written with another cache layout";
    if (ok && name != hex(h.tail_cells > 0 ? h.tail_key : h.keys.back()) + ".pgkv") ok = false, why = "its name does not match its contents";
    if (!ok) {
      quarantine(name, why);
      continue;
    }
    FileRec r;
    r.name = name;
    r.n_blocks = static_cast<int>(h.n_blocks);
    r.snap_depth = static_cast<int>(h.snap_depth);
    r.size = size;
    r.keys = std::move(h.keys);
    r.tokens = std::move(h.tokens);
    r.tail = std::move(h.tail_tokens);
    found.emplace_back(de.last_write_time(ec), std::move(r));
  }
  // Oldest first, so the tick order is the files' last-use order (loads touch their file).
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [t, r] : found) {
    r.tick = ++tick_;
    add_locked(std::move(r));
  }
  if (!files_.empty())
    PG_INFO("disk KV cache %s: %zu block files, %.1f MiB", folder_.c_str(), files_.size(), static_cast<double>(total_) / (1024.0 * 1024.0));
  evict_locked();
}

DiskCache::Found DiskCache::find(const std::vector<uint64_t>& keys, const std::vector<int32_t>& prompt, bool tails) const {
  std::lock_guard<std::mutex> lk(mu_);
  Found f;
  if (!enabled_) return f;
  const bool hybrid = opt_.snapshot_bytes > 0;
  const int bs = opt_.block_size;
  // Deepest first: any use of n blocks serves more than any use of fewer (a tail has < block_size cells).
  for (size_t n = keys.size(); n > 0 && f.tokens == 0; --n) {
    auto b = by_key_.find(keys[n - 1]);
    if (b == by_key_.end()) continue;
    // The prompt's cells past n blocks that a tail may serve: up to (not including) its last token.
    const int room = static_cast<int>(prompt.size()) - 1 - static_cast<int>(n) * bs;
    for (const std::string& name : b->second) {
      const FileRec& r = files_.at(name);
      if (static_cast<size_t>(r.n_blocks) < n || r.keys[n - 1] != keys[n - 1]) continue;
      // The block after the n: the tail, or (attention) the file's block n.
      const bool tail = static_cast<size_t>(r.n_blocks) == n;
      const int32_t* next = tail ? r.tail.data() : r.tokens.data() + n * static_cast<size_t>(bs);
      const int have = tail ? static_cast<int>(r.tail.size()) : bs;
      int c = 0;  // its leading cells shared with the prompt
      if (tails && (!hybrid || tail)) {
        const int most = std::min({have, room, bs - 1});
        while (c < most && next[c] == prompt[n * static_cast<size_t>(bs) + static_cast<size_t>(c)]) ++c;
        // Hybrid: the stored state is the one after the tail's last cell.
        if (hybrid && c != have) c = 0;
      }
      if (hybrid && c == 0 && static_cast<size_t>(r.snap_depth) != n) continue;
      const int tokens = static_cast<int>(n) * bs + c;
      if (tokens > f.tokens) f = {name, static_cast<int>(n), c, c > 0 && tail, tokens};
    }
  }
  return f;
}

bool DiskCache::has(uint64_t last_key) const {
  std::lock_guard<std::mutex> lk(mu_);
  return files_.count(hex(last_key) + ".pgkv") > 0;
}

bool DiskCache::load(const Found& f, const std::vector<uint64_t>& keys, const std::vector<int32_t>& prompt, BlockFileHeader& h,
                     std::vector<uint8_t>& payload) {
  const std::string path = folder_ + "/" + f.name;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    std::lock_guard<std::mutex> lk(mu_);
    remove_locked(f.name);  // evicted by another server sharing the directory: a miss
    return false;
  }
  // The header first (its length is in its fixed part), then the payload straight into `payload`: one
  // pass over the bytes, no second buffer.
  struct stat st {};
  std::vector<uint8_t> head(kFixed);
  bool ok = fstat(fd, &st) == 0 && read_all(fd, head.data(), head.size());
  std::string why = "unreadable";
  if (ok) {
    uint32_t hb = 0;
    std::memcpy(&hb, head.data() + 12, 4);
    ok = hb >= kFixed && hb <= static_cast<uint64_t>(st.st_size);
    if (ok) {
      head.resize(hb);
      ok = read_all(fd, head.data() + kFixed, hb - kFixed);
    }
    if (ok) ok = parse_block_file_header(head, static_cast<uint64_t>(st.st_size), h, why);
    else why = "truncated header";
    if (ok) {
      payload.resize(static_cast<size_t>(h.payload_bytes()));
      ok = read_all(fd, payload.data(), payload.size());
      if (!ok) why = "truncated payload";
    }
  }
  ::close(fd);
  if (ok && (h.model_id != opt_.model_id || h.k_type != static_cast<uint32_t>(opt_.k_type) || h.v_type != static_cast<uint32_t>(opt_.v_type) ||
             h.block_size != static_cast<uint32_t>(opt_.block_size) || h.block_bytes != opt_.block_bytes || h.snapshot_bytes != opt_.snapshot_bytes))
    ok = false, why = "written for another model or cache layout";
  if (ok && payload_checksum(payload.data(), payload.size()) != h.payload_checksum) ok = false, why = "payload checksum mismatch (corrupt)";
  const int n_next = f.part_cells == 0 ? 0 : f.part_tail ? static_cast<int>(h.tail_cells) : static_cast<int>(h.block_size);
  if (ok && (static_cast<int>(h.n_blocks) < f.n_blocks + (f.part_cells > 0 && !f.part_tail ? 1 : 0) ||
             (f.part_tail && static_cast<int>(h.n_blocks) != f.n_blocks) || n_next < f.part_cells))
    ok = false, why = "shorter than indexed";
  if (ok) {
    const size_t ntok = static_cast<size_t>(f.n_blocks) * h.block_size;
    const int32_t* next = f.part_tail ? h.tail_tokens.data() : h.tokens.data() + (f.part_cells > 0 ? ntok : 0);
    ok = std::equal(keys.begin(), keys.begin() + f.n_blocks, h.keys.begin()) && prompt.size() >= ntok + static_cast<size_t>(f.part_cells) &&
         std::equal(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(ntok), h.tokens.begin()) &&
         std::equal(next, next + f.part_cells, prompt.begin() + static_cast<std::ptrdiff_t>(ntok));
    if (!ok) {
      // Another chain under this name (a key collision): a miss; the file itself is fine.
      return false;
    }
  }
  if (!ok) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      remove_locked(f.name);
    }
    DirLock lock(lock_fd_);
    quarantine(f.name, why);
    return false;
  }
  // Recently used, for this process's LRU and (through the mtime) for the next start's.
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = files_.find(f.name);
  if (it != files_.end()) it->second.tick = ++tick_;
  return true;
}

void DiskCache::write(Chain c) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!enabled_ || c.keys.empty()) return;
    // Bounded: a disk slower than the engine drops writes rather than holding RAM.
    if (jobs_.size() >= 8) return;
    jobs_.push_back(std::move(c));
  }
  cv_.notify_all();
}

void DiskCache::flush() const {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [&] { return jobs_.empty() && busy_ == 0; });
}

void DiskCache::writer() {
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) {
        if (stop_) return;
        continue;
      }
      j = std::move(jobs_.front());
      jobs_.pop_front();
      ++busy_;
    }
    const bool ok = write_file(j);
    {
      std::lock_guard<std::mutex> lk(mu_);
      --busy_;
    }
    idle_.notify_all();
    (void)ok;
  }
}

bool DiskCache::write_file(const Job& j) {
  BlockFileHeader h;
  h.model_id = opt_.model_id;
  h.k_type = static_cast<uint32_t>(opt_.k_type);
  h.v_type = static_cast<uint32_t>(opt_.v_type);
  h.block_size = static_cast<uint32_t>(opt_.block_size);
  h.n_blocks = static_cast<uint32_t>(j.keys.size());
  h.block_bytes = opt_.block_bytes;
  h.snapshot_bytes = opt_.snapshot_bytes;
  h.snap_depth = j.snap_depth;
  h.tail_cells = static_cast<uint32_t>(j.tail_tokens.size());
  h.tail_key = j.tail_key;
  h.keys = j.keys;
  h.tokens = j.tokens;
  h.tail_tokens = j.tail_tokens;
  h.payload_checksum = payload_checksum(j.payload.data(), j.payload.size());
  // The engine's payload must be the one the header describes, or the file would read back as corrupt.
  if (j.payload.size() != h.payload_bytes()) {
    PG_WARN("disk KV cache: a chain's payload is %zu bytes, its header says %llu: not written", j.payload.size(),
            static_cast<unsigned long long>(h.payload_bytes()));
    return false;
  }
  const std::vector<uint8_t> head = make_block_file_header(h);
  const std::string name = hex(h.tail_cells > 0 ? j.tail_key : j.keys.back()) + ".pgkv";
  // Unique across every DiskCache of this process (two caches on one directory in one process write
  // the same chain at once: per-object counters would give both the same temporary name).
  static std::atomic<uint64_t> tmp_counter{0};
  const uint64_t n = ++tmp_counter;
  const std::string tmp = folder_ + "/" + name + "." + std::to_string(getpid()) + "." + std::to_string(n) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    disable(std::string("cannot create a block file: ") + std::strerror(errno));
    return false;
  }
  const bool ok = write_all(fd, head.data(), head.size()) && write_all(fd, j.payload.data(), j.payload.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    disable(std::string("writing a block file failed: ") + std::strerror(err));
    return false;
  }
  DirLock lock(lock_fd_);
  if (::rename(tmp.c_str(), (folder_ + "/" + name).c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    disable(std::string("renaming a block file failed: ") + std::strerror(e));
    return false;
  }
  // The rename itself must survive a crash: fsync the folder.
  if (const int dfd = ::open(folder_.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  std::lock_guard<std::mutex> lk(mu_);
  remove_locked(name);  // the same chain written again (another server, or a race): replaced
  FileRec r;
  r.name = name;
  r.n_blocks = static_cast<int>(j.keys.size());
  r.snap_depth = static_cast<int>(j.snap_depth);
  r.size = head.size() + j.payload.size();
  r.tick = ++tick_;
  r.keys = j.keys;
  r.tokens = j.tokens;
  r.tail = j.tail_tokens;
  ++writes_;
  write_bytes_ += r.size;
  // A file whose every possible hit this one serves is superseded and deleted: attention — a chain that
  // is a prefix of this one, its tail (if any) the leading cells of this one's next block or tail;
  // hybrid — states are kept only where they were taken, so only a tail-less file with the same
  // block snapshot (the same prefix and depth) goes.
  const bool hybrid = opt_.snapshot_bytes > 0;
  const size_t bs = static_cast<size_t>(opt_.block_size);
  std::vector<std::string> gone;
  for (size_t g = 1; g <= j.keys.size(); ++g) {
    auto b = by_key_.find(j.keys[g - 1]);
    if (b == by_key_.end()) continue;
    for (const std::string& other : b->second) {
      const FileRec& o = files_.at(other);
      if (other == name || static_cast<size_t>(o.n_blocks) != g || o.keys[g - 1] != j.keys[g - 1]) continue;
      bool covered;
      if (hybrid) {
        covered = o.tail.empty() && o.snap_depth == static_cast<int>(j.snap_depth);
      } else if (o.tail.empty()) {
        covered = true;  // g < n, or g == n and this one adds a tail (g == n without one is this name)
      } else {
        // Its tail's cells: this chain's block g, or (g == n) this tail.
        const int32_t* next = g < j.keys.size() ? j.tokens.data() + g * bs : j.tail_tokens.data();
        const size_t have = g < j.keys.size() ? bs : j.tail_tokens.size();
        covered = o.tail.size() <= have && std::equal(o.tail.begin(), o.tail.end(), next);
      }
      if (covered) gone.push_back(other);
    }
  }
  for (const auto& g : gone) {
    remove_locked(g);
    ::unlink((folder_ + "/" + g).c_str());
  }
  add_locked(std::move(r));
  evict_locked();
  return true;
}

void DiskCache::evict_locked() {
  while (total_ > opt_.budget && !files_.empty()) {
    auto oldest = files_.begin();
    for (auto it = files_.begin(); it != files_.end(); ++it)
      if (it->second.tick < oldest->second.tick) oldest = it;
    const std::string name = oldest->first;
    remove_locked(name);
    ::unlink((folder_ + "/" + name).c_str());
  }
}

uint64_t DiskCache::files() const {
  std::lock_guard<std::mutex> lk(mu_);
  return files_.size();
}
uint64_t DiskCache::bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return total_;
}
uint64_t DiskCache::writes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return writes_;
}
uint64_t DiskCache::write_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return write_bytes_;
}

}  // namespace pg
