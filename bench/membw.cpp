// Memory read bandwidth of this machine: the roofline that decode speed (tg) is judged against.
//
//   pg_membw [--mib N] [--threads T] [--reps R]
//
// Every thread streams its own contiguous share of one large buffer (N MiB, default 1024, far larger than
// the last-level cache) with 256-bit loads, the access pattern of a matrix-vector product over the
// weights. For each thread count 1..T it prints the best and the median GB/s over R passes (GB = 1e9
// bytes). The best pass is the roofline figure: on a shared machine the median is pulled down by others.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// Sums the 32-bit words of [p, p + bytes) so the loads cannot be optimised away; four independent
// accumulators keep several loads in flight, as the dot-product kernels do.
uint32_t read_sum(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi32(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi32(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi32(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi32(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  uint32_t r = 0;
  for (uint32_t v : lanes) r += v;
  return r;
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--mib N (64..65536)] [--threads T (1..256)] [--reps R (1..1000)]\n", argv0);
  return 2;
}

bool parse_int(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long mib = 1024, threads = std::max(1u, std::thread::hardware_concurrency()), reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") return usage(argv[0]), 0;
    if (i + 1 >= argc) return usage(argv[0]);
    bool ok = false;
    if (a == "--mib") {
      ok = parse_int(argv[++i], 64, 65536, &mib);
    } else if (a == "--threads") {
      ok = parse_int(argv[++i], 1, 256, &threads);
    } else if (a == "--reps") {
      ok = parse_int(argv[++i], 1, 1000, &reps);
    }
    if (!ok) return usage(argv[0]);
  }
  const size_t bytes = static_cast<size_t>(mib) << 20;  // a multiple of 128 · 256, so every share is too
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  if (!buf) {
    std::fprintf(stderr, "cannot allocate %ld MiB\n", mib);
    return 1;
  }
  // Touch every page (and give it non-zero content) before timing.
  for (size_t i = 0; i < bytes; i += 64) std::memset(buf + i, static_cast<int>(i >> 6), 64);

  std::printf("buffer: %ld MiB, %ld passes per thread count\n| threads | best GB/s | median GB/s |\n|---:|---:|---:|\n", mib,
              reps);
  std::atomic<uint32_t> sink{0};
  for (long t = 1; t <= threads; ++t) {
    std::vector<double> gbs;
    for (long r = 0; r < reps + 1; ++r) {  // the first pass warms up
      std::atomic<int> ready{0};
      std::atomic<bool> go{false};
      std::vector<std::thread> pool;
      const size_t share = bytes / static_cast<size_t>(t) / 128 * 128;
      for (long k = 0; k < t; ++k)
        pool.emplace_back([&, k] {
          ready.fetch_add(1);
          while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
          sink.fetch_add(read_sum(buf + static_cast<size_t>(k) * share, share), std::memory_order_relaxed);
        });
      while (ready.load() < t) std::this_thread::yield();
      const auto t0 = std::chrono::steady_clock::now();
      go.store(true, std::memory_order_release);
      for (auto& th : pool) th.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) gbs.push_back(static_cast<double>(share) * static_cast<double>(t) / s / 1e9);
    }
    std::sort(gbs.begin(), gbs.end());
    std::printf("| %ld | %.2f | %.2f |\n", t, gbs.back(), gbs[gbs.size() / 2]);
  }
  std::fprintf(stderr, "(checksum %u)\n", sink.load());
  std::free(buf);
  return 0;
}
