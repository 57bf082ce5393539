// pg_cuda_attn_bench — prefill attention alone on the GPU: the FP32 kernel (attention.cu) vs the tensor-core
// kernel (attention_prefill.cu, CudaOptions::fa_prefill_min_rows), per head shape × rows × depth.
//
//   pg_cuda_attn_bench [--shapes 32:8:128,24:4:256,16:8:64] [--rows 512,4096] [--depth 0,4096] [--reps 5]
//                      [--window 0] [--softcap 0] [--kv f16|q8_0|q4_0|tq3_0|…] [--graph N]
//
// The last columns time the SIMT flash-decoding kernel (attention_decode.cu, CudaOptions::fa_vec) where it
// takes the shape (≤ 8 rows, F16): "fa_vec ms" and its speed-up over the fa_decode route. --graph N records
// N calls in a CUDA graph and times its replays (per call: device time with a graph's launch gaps, as a
// decode step sees it; without it, µs-sized decode calls measure the host's launch rate).
//
// One sequence, a cache of --kv's type (default F16; K and V alike) in blocks of 64 cells (block table in order), random K/V written by kv_store;
// the batch is `rows` consecutive causal rows after `depth` cached tokens (a prefill chunk). Times one
// attention call (median of reps after a warm-up, stream-synchronised; no other kernel) with the option off
// and on, and prints ms, TFLOP/s (4·Σ_rows visible keys·head_dim·n_head: the q·k and p·v multiply-adds) and the
// max relative difference between the two outputs (a sanity check; the tests bound it properly).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/kv_quant.h"

using namespace pg;

namespace {

std::vector<int> int_list(const std::string& s, char sep = ',') {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) v.push_back(std::stoi(item));
  return v;
}

Tensor upload(Backend& be, DType t, int64_t cols, int64_t rows, const void* data) {
  Tensor x = be.alloc(t, cols, rows);
  be.upload(x, data, x.nbytes());
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes_s = "32:8:128,24:4:256,16:8:64", rows_s = "512,4096", depth_s = "0,4096";
  int reps = 5, window = 0, graph_calls = 0;
  DType kv_t = DType::F16;
  float softcap = 0.0f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--shapes") shapes_s = val();
    else if (a == "--rows") rows_s = val();
    else if (a == "--depth") depth_s = val();
    else if (a == "--reps") reps = std::max(1, std::stoi(val()));
    else if (a == "--window") window = std::stoi(val());
    else if (a == "--kv") kv_t = parse_kv_type(val());
    else if (a == "--softcap") softcap = std::stof(val());
    else if (a == "--graph") graph_calls = std::max(0, std::stoi(val()));
    else {
      std::fprintf(stderr, "usage: %s [--shapes H:KV:D,...] [--rows N,...] [--depth D,...] [--reps R] [--window W] [--softcap C] [--kv TYPE] [--graph N]\n", argv[0]);
      return 1;
    }
  }
  try {
    if (cuda_device_count() == 0) throw Error("no CUDA device");
    CudaOptions off, on, dec;
    off.fa_vec = on.fa_vec = dec.fa_vec = false;  // the other kernels' columns, not the default's fa_vec
    off.fa_prefill_min_rows = 0;  // attention.cu at every row count (the default routes ≥ 32 rows to tensor cores)
    on.fa_prefill_min_rows = 1;
    on.fa_prefill_typed = true;  // --kv of a quantized type: the typed tensor-core path (off by default) vs attn_kvq_kernel
    // The decode routing as a model would run it (CudaOptions::fa_decode): default prefill threshold, calls
    // below it on tensor cores where fa_decode_type_wins says so (typed: q8_0 yes, tq3_0 no → attention.cu).
    dec.fa_decode = true;
    dec.fa_prefill_typed = true;
    CudaOptions vec = dec;  // the same routing with the SIMT flash-decoding kernel first (CudaOptions::fa_vec)
    vec.fa_vec = true;
    vec.fa_vec_max_rows = 8;  // wherever the kernel takes the shape (the default limits it to 1 row, head ≤ 128)
    vec.fa_vec_max_head_dim = 256;
    // Its split-plan knobs from the factory's environment aliases, so device-check can sweep them.
    if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_BLOCKS"); e && *e) vec.fa_vec_blocks_per_sm = std::max(1, std::atoi(e));
    if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_CHUNK"); e && *e) vec.fa_vec_min_chunk = std::max(1, std::atoi(e));
    if (const char* e = std::getenv("PEREGRINE_CUDA_FA_VEC_STAGES"); e && *e) vec.fa_vec_stages = std::clamp(std::atoi(e), 2, 4);
    CudaBackend be(0, off);
    std::printf("device: %s, %d SMs, KV %s\n", be.device_name().c_str(), be.multiprocessor_count(), kv_type_name(kv_t).c_str());
    std::printf("| heads/kv × dim | rows | depth | FP32 kernel ms | TFLOP/s | KV GB/s | tensor-core ms | TFLOP/s | KV GB/s | speed-up | rel L2 diff | fa_decode route ms | KV GB/s | speed-up | fa_vec ms | KV GB/s | vs fa_decode | fa_vec rel diff |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::stringstream shapes(shapes_s);
    std::string shape;
    while (std::getline(shapes, shape, ',')) {
      const std::vector<int> hkd = int_list(shape, ':');
      PG_CHECK(hkd.size() == 3, "--shapes: H:KV:D");
      const int n_head = hkd[0], n_kv = hkd[1], hd = hkd[2];
      for (int depth : int_list(depth_s))
        for (int rows : int_list(rows_s)) {
          const int len = depth + rows, bs = 64, max_blocks = (len + bs - 1) / bs;
          const int64_t kvw = static_cast<int64_t>(n_kv) * hd, qw = static_cast<int64_t>(n_head) * hd;
          KvLayer kv;
          kv.k = be.alloc(kv_t, static_cast<int64_t>(n_kv) * kv_head_width(kv_t, hd), static_cast<int64_t>(max_blocks) * bs);
          kv.v = be.alloc(kv_t, static_cast<int64_t>(n_kv) * kv_head_width(kv_t, hd), static_cast<int64_t>(max_blocks) * bs);
          kv.n_head_kv = n_kv, kv.head_dim = hd, kv.head_dim_v = hd;
          std::vector<int32_t> table(static_cast<size_t>(max_blocks));
          for (int b = 0; b < max_blocks; ++b) table[static_cast<size_t>(b)] = b;
          Tensor tt = upload(be, DType::I32, max_blocks, 1, table.data());
          // Fill [0, len) in pieces of ≤ 4096 rows through kv_store (cells = positions: table in order).
          for (int p0 = 0; p0 < len; p0 += 4096) {
            const int n = std::min(4096, len - p0);
            std::vector<float> k(static_cast<size_t>(n * kvw)), v(k.size());
            for (auto& x : k) x = nd(rng);
            for (auto& x : v) x = nd(rng);
            std::vector<int32_t> cells(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) cells[static_cast<size_t>(i)] = p0 + i;
            AttentionBatch b;
            b.n_tokens = n;
            b.cells = upload(be, DType::I32, n, 1, cells.data());
            Tensor kt = upload(be, DType::F32, kvw, n, k.data()), vt = upload(be, DType::F32, kvw, n, v.data());
            be.kv_store(kv, kt, vt, b);
            be.synchronize();
            be.free(kt);
            be.free(vt);
            be.free(b.cells);
          }
          std::vector<int32_t> pos(static_cast<size_t>(rows)), seq(static_cast<size_t>(rows), 0);
          double work = 0;  // Σ visible keys
          for (int i = 0; i < rows; ++i) {
            pos[static_cast<size_t>(i)] = depth + i;
            const int vis = window > 0 ? std::min(window, depth + i + 1) : depth + i + 1;
            work += vis;
          }
          std::vector<float> q(static_cast<size_t>(rows * qw));
          for (auto& x : q) x = nd(rng);
          AttentionBatch b;
          b.n_tokens = rows;
          b.positions = upload(be, DType::I32, rows, 1, pos.data());
          b.seq = upload(be, DType::I32, rows, 1, seq.data());
          b.block_table = tt;
          b.block_size = bs;
          b.max_blocks = max_blocks;
          b.max_kv_len = len;
          AttentionParams ap;
          ap.n_head = n_head;
          ap.n_head_kv = n_kv;
          ap.head_dim = hd;
          ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
          ap.sliding_window = window;
          ap.logit_softcap = softcap;
          Tensor qt = upload(be, DType::F32, qw, rows, q.data());
          Tensor ot = be.alloc(DType::F32, qw, rows);
          double ms[4] = {0, 0, 0, 0};
          std::vector<float> out[4];
          for (int side = 0; side < 4; ++side) {
            be.set_options(side == 0 ? off : side == 1 ? on : side == 2 ? dec : vec);
            be.attention(qt, kv, b, ap, ot);  // warm-up (scratch sizing, opt-in)
            be.synchronize();
            if (graph_calls > 0) {
              // graph_calls calls recorded once, the graph replayed reps times: device time per call.
              be.begin_capture();
              for (int c = 0; c < graph_calls; ++c) be.attention(qt, kv, b, ap, ot);
              const int gid = be.end_capture();
              be.replay(gid);
              be.synchronize();
              const auto t0 = std::chrono::steady_clock::now();
              for (int r = 0; r < reps; ++r) be.replay(gid);
              be.synchronize();
              ms[side] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / (reps * graph_calls);
              be.drop_graphs();
            } else {
              // Back-to-back launches, one synchronisation: a decode-sized call (tens of µs) is not hidden
              // behind the host's launch and sync latency.
              const auto t0 = std::chrono::steady_clock::now();
              for (int r = 0; r < reps; ++r) be.attention(qt, kv, b, ap, ot);
              be.synchronize();
              ms[side] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
            }
            out[side].resize(static_cast<size_t>(rows * qw));
            be.download(ot, out[side].data(), out[side].size() * sizeof(float));
          }
          double num = 0, den = 0, worst = 0;
          for (size_t i = 0; i < out[0].size(); ++i) {
            const double d = std::fabs(static_cast<double>(out[1][i]) - out[0][i]);
            worst = std::max(worst, d);
            num += d * d;
            den += static_cast<double>(out[0][i]) * out[0][i];
          }
          double vnum = 0, vden = 0;  // fa_vec vs the FP32 kernel
          for (size_t i = 0; i < out[0].size(); ++i) {
            const double d = static_cast<double>(out[3][i]) - out[0][i];
            vnum += d * d, vden += static_cast<double>(out[0][i]) * out[0][i];
          }
          const double flop = 4.0 * work * hd * n_head;
          // KV bytes if every cached K and V row is read once (in --kv's storage): the decode roofline's bytes.
          const double kv_bytes = 2.0 * static_cast<double>(kv_row_bytes(kv_t, n_kv, hd)) * static_cast<double>(std::min(len, window > 0 ? window + rows : len));
          std::printf("| %d/%d × %d | %d | %d | %.3f | %.1f | %.0f | %.3f | %.1f | %.0f | %.2f× | %.2e (max abs %.2e) | %.3f | %.0f | %.2f× | %.4f | %.0f | %.2f× | %.2e |\n", n_head, n_kv, hd, rows,
                      depth, ms[0], flop / ms[0] * 1e-9, kv_bytes / ms[0] * 1e-6, ms[1], flop / ms[1] * 1e-9, kv_bytes / ms[1] * 1e-6, ms[0] / ms[1],
                      den > 0 ? std::sqrt(num / den) : 0.0, worst, ms[2], kv_bytes / ms[2] * 1e-6, ms[0] / ms[2], ms[3],
                      kv_bytes / ms[3] * 1e-6, ms[2] / ms[3], vden > 0 ? std::sqrt(vnum / vden) : 0.0);
          std::fflush(stdout);
          for (Tensor* t : {&kv.k, &kv.v, &tt, &b.positions, &b.seq, &qt, &ot}) be.free(*t);
        }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
