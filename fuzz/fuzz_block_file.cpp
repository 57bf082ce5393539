// libFuzzer target: parse_block_file_header over arbitrary bytes (the header of a prefix-cache block
// file, kv/disk_cache.h). The first 8 input bytes pick the claimed file size (so the length checks see
// both consistent and inconsistent sizes); the rest is the file's beginning. A parse that succeeds
// must describe exactly the bytes it was given, and re-serialising it must give them back.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "kv/disk_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t claimed = 0;
  if (size >= 8) {
    std::memcpy(&claimed, data, 8);
    data += 8;
    size -= 8;
  }
  // Half the time the file is exactly the header plus a claimed payload length below 1 MiB.
  const uint64_t file_size = (claimed & 1) ? size + ((claimed >> 1) & 0xfffff) : claimed >> 1;
  pg::BlockFileHeader h;
  std::string why;
  if (pg::parse_block_file_header(std::span<const uint8_t>(data, size), file_size, h, why)) {
    const auto again = pg::make_block_file_header(h);
    if (again.size() != h.header_bytes || again.size() > size || std::memcmp(again.data(), data, again.size()) != 0) __builtin_trap();
  } else if (why.empty()) {
    __builtin_trap();  // a rejection always says why
  }
  return 0;
}
