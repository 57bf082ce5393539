// Invariant 2: CUDA logits match CPU logits, whole model, on every tiny golden model the CPU runs.
//
// Reference: CpuBackend in exact-F32 mode (and, for CUDA's default mode, the CPU's default mode). For each model: the 24-token prompt in one batched forward,
// then 15 teacher-forced decode steps (the CPU's own greedy tokens fed back one at a time).
//  - CUDA exact mode (FP32 GEMV for every matmul) with an F32 KV cache: max |Δlogit| ≤ 1e-3 (the
//    golden README's bound for F32 engines; logits have std ≈ 2).
//  - CUDA default mode with an F16 KV cache against the CPU's default mode with an F16 KV cache: both
//    round the activations of quantized weights to 8 bits the same way (q8_0 / q8_K, as llama.cpp's CPU
//    backend; the 24-row prompt too: MMQ / the GEMV), so what is left is float summation order. That is
//    not always ~0 at the logits: 8-bit rounding is discontinuous, and a value within ~1e-5 of a rounding
//    boundary rounds differently on the two sides (a handful per forward), moving that activation by a
//    whole quantum (1/127 of its block's max). Measured on the H200 (device run 12, 24 quantized files):
//    4 within 1.1e-3 (down to 3e-6), 5 at 0.03–0.1, the rest 0.10–0.14 max with RMS ≤ 0.027 — the CPU's
//    own default-vs-exact difference is 0.27 — and Q4_1/Q5_1 0.17–0.19 / RMS 0.04, whose CPU q8_1
//    activations carry FP16 block sums that the CUDA side (FP32 GEMV on q·d) keeps exact. Bounds: max |Δ| ≤ 0.25, RMS ≤ 0.03 (0.05
//    for Q4_1/Q5_1); F16 files (no 8-bit rounding) stay ≤ 0.05. MatmulDefaultModeMatchesCpuDefault
//    checks the rounding itself at the op level (≤ 2e-5).
// And greedy 64-token continuations of every golden model, CUDA default mode vs CPU (exact mode for F16
// files, default mode for quantized ones): identical, except after a step where the CPU's top-2 margin
// is below 0.1 (F16) / 0.3 (quantized) — a near-tie — which is printed, not failed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cuda_test_util.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

// The golden prompt (shared/golden/README.md §2), the same for every tiny model.
const std::vector<int32_t> kPrompt = {1, 5, 300, 17, 42, 511, 260, 99, 3, 128, 256, 400, 77, 12, 333, 450, 6, 210, 64, 499, 31, 385, 150, 270};

struct Logits {
  std::vector<float> prompt;              // (24, n_vocab)
  std::vector<std::vector<float>> steps;  // per decode step (n_vocab)
  std::vector<int32_t> tokens;            // the tokens fed at each step
  int n_vocab = 0;
};

// Prompt pass, then `n_steps` decode steps feeding `feed` (or, if empty, the argmax of the previous row).
Logits run(Backend& be, const std::string& path, DType kv, int n_steps, const std::vector<int32_t>& feed,
           const std::vector<int32_t>& prompt = kPrompt) {
  auto model = Model::load(path, be);
  const int cells = std::max(128, static_cast<int>(prompt.size() + static_cast<size_t>(n_steps) + 15) / 16 * 16);
  auto cache = model->make_cache({1, cells, kv, 16});
  Logits r;
  r.n_vocab = model->config().n_vocab;
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int>(i), 0, true);
  model->forward(b, *cache, r.prompt);
  std::vector<float> last(r.prompt.end() - r.n_vocab, r.prompt.end());
  for (int s = 0; s < n_steps; ++s) {
    const int32_t tok = feed.empty() ? static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin())
                                     : feed[static_cast<size_t>(s)];
    r.tokens.push_back(tok);
    b.clear();
    b.add(tok, static_cast<int>(prompt.size()) + s, 0, true);
    model->forward(b, *cache, last);
    r.steps.push_back(last);
  }
  return r;
}

struct Diff {
  double max = 0, rms = 0;
};
Diff diff(const Logits& a, const Logits& ref) {
  Diff d;
  double sq = 0;
  size_t n = 0;
  auto acc = [&](const std::vector<float>& x, const std::vector<float>& y) {
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      const double e = std::isfinite(x[i]) ? std::fabs(static_cast<double>(x[i]) - y[i]) : INFINITY;
      d.max = std::max(d.max, e);
      sq += e * e;
      ++n;
    }
  };
  acc(a.prompt, ref.prompt);
  for (size_t s = 0; s < a.steps.size() && s < ref.steps.size(); ++s) acc(a.steps[s], ref.steps[s]);
  d.rms = n ? std::sqrt(sq / static_cast<double>(n)) : 0;
  return d;
}

class CudaModel : public testing::TestWithParam<std::string> {};

TEST_P(CudaModel, LogitsMatchCpu) {
  PG_REQUIRE_GPU();
  const std::string stem = GetParam();
  const std::string path = test::shared_path("golden/models/" + stem + ".gguf").string();
  auto cpu = test::make_cpu_exact();
  const Logits ref32 = run(*cpu, path, DType::F32, 15, {});
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend cpu_default(co);
  const Logits ref16 = run(cpu_default, path, DType::F16, 15, ref32.tokens);
  ASSERT_EQ(ref32.prompt.size(), kPrompt.size() * static_cast<size_t>(ref32.n_vocab));

  auto exact = test::make_cuda(true);
  const Diff de = diff(run(*exact, path, DType::F32, 15, ref32.tokens), ref32);
  exact.reset();
  auto fast = test::make_cuda(false);
  const Diff df = diff(run(*fast, path, DType::F16, 15, ref32.tokens), ref16);
  EXPECT_LE(de.max, 1e-3) << "exact mode, F32 KV";
  const bool f16_file = stem.find("-f16") != std::string::npos;
  const bool q8_1 = stem.find("Q4_1") != std::string::npos || stem.find("Q5_1") != std::string::npos;
  // With the tensor-core prefill attention routed for the prompt (PEREGRINE_CUDA_FA_PREFILL ≤ its 24 rows,
  // as scripts/device-check.sh FA_PREFILL=1 runs this test) q and p are rounded to FP16 (~1e-3 relative on
  // the attention output, as llama.cpp's CUDA flash attention): F16 files keep their bounds, but behind
  // quantized weights each such change flips some of the 8-bit activation roundings of the next matmul,
  // which these random tiny models amplify (device run 2026-12-02: rms 0.032-0.043, max ≤ 0.26 on the
  // quantized files with it on, vs 0.002-0.04 off). Those files get the q8_1 path's bounds there.
  // The same holds with the tensor-core decode attention (CudaOptions::fa_decode, on by default since device
  // run 28: quantized files rms 0.033-0.045, max ≤ 0.255 there), which takes the prompt and every decode step.
  const CudaOptions& fo = fast->options();
  const bool fa_prompt = fo.fa_decode || (fo.fa_prefill_min_rows > 0 && static_cast<size_t>(fo.fa_prefill_min_rows) <= kPrompt.size());
  EXPECT_LE(df.max, f16_file ? 0.05 : fa_prompt ? 0.3 : 0.25) << "default mode, F16 KV";
  EXPECT_LE(df.rms, f16_file ? 0.01 : q8_1 || fa_prompt ? 0.05 : 0.03) << "default mode, F16 KV";
  std::printf("%-22s exact: max %.2e rms %.2e | default: max %.2e rms %.2e\n", stem.c_str(), de.max, de.rms, df.max, df.rms);
}

std::string name_of(const testing::TestParamInfo<std::string>& i) {
  std::string s = i.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Fixed list (not discovered), so a missing file is a failure.
INSTANTIATE_TEST_SUITE_P(
    Golden, CudaModel,
    testing::Values("tiny-llama-f16", "tiny-llama-Q8_0", "tiny-llama-Q4_0", "tiny-llama-Q4_1", "tiny-llama-Q5_0", "tiny-llama-Q5_1",
                    "tiny-llama-Q4_K_M", "tiny-llama-Q5_K_M", "tiny-llama-Q6_K", "tiny-llama-Q2_K", "tiny-llama-Q3_K_M",
                    "tiny-llama-IQ4_XS", "tiny-qwen3-f16", "tiny-qwen3-Q8_0", "tiny-qwen3-Q4_0", "tiny-qwen3-Q4_1", "tiny-qwen3-Q5_0",
                    "tiny-qwen3-Q5_1", "tiny-qwen3-Q4_K_M", "tiny-qwen3-Q5_K_M", "tiny-qwen3-Q6_K", "tiny-qwen3-Q2_K",
                    "tiny-qwen3-Q3_K_M", "tiny-qwen3-IQ4_XS", "tiny-qwen2-f16", "tiny-qwen3moe-f16", "tiny-gemma3-f16",
                    "tiny-qwen35-f16", "tiny-qwen35moe-f16"),
    name_of);

class CudaGreedy : public testing::TestWithParam<std::string> {};

TEST_P(CudaGreedy, SixtyFourTokensMatchCpu) {
  PG_REQUIRE_GPU();
  const std::string stem = GetParam();
  const std::string path = test::shared_path("golden/models/" + stem + ".gguf").string();
  // F16 files: the CPU's exact mode (no activation rounding on either side). Quantized files: the CPU's
  // default mode, which rounds activations to 8 bits as CUDA's default mode does; a near-tie there is
  // wider (a rounding flip moves logits by up to ~0.15, see the header), hence the larger margin.
  const bool f16_file = stem.find("-f16") != std::string::npos;
  CpuOptions co;
  co.n_threads = 2;
  co.exact_f32 = f16_file;
  auto cpu = std::make_unique<CpuBackend>(co);
  auto gpu = test::make_cuda(false);
  const double tie = f16_file ? 0.1 : 0.3;
  const Logits c = run(*cpu, path, DType::F16, 64, {});
  const Logits g = run(*gpu, path, DType::F16, 64, {});
  ASSERT_EQ(c.tokens.size(), 64u);
  ASSERT_EQ(g.tokens.size(), 64u);
  // Token s was chosen from the previous row: the prompt's last row for s = 0, else step s-1.
  auto row = [&](const Logits& l, size_t s) {
    return s == 0 ? std::vector<float>(l.prompt.end() - l.n_vocab, l.prompt.end()) : l.steps[s - 1];
  };
  for (size_t s = 0; s < 64; ++s) {
    if (c.tokens[s] == g.tokens[s]) continue;
    std::vector<float> r = row(c, s);
    std::vector<float> sorted = r;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const double margin = sorted[0] - sorted[1];
    std::printf("%s: greedy step %zu differs (cpu %d, cuda %d); CPU top-2 margin %.4f\n", stem.c_str(), s, c.tokens[s], g.tokens[s], margin);
    EXPECT_LT(margin, tie) << "greedy tokens differ at step " << s << " although the CPU's margin is not a near-tie";
    return;  // the sequences diverge from here on
  }
  std::printf("%s: 64 greedy tokens identical\n", stem.c_str());
}

// Every golden model (issue 11's correctness target).
INSTANTIATE_TEST_SUITE_P(
    Golden, CudaGreedy,
    testing::Values("tiny-llama-f16", "tiny-llama-Q8_0", "tiny-llama-Q4_0", "tiny-llama-Q4_1", "tiny-llama-Q5_0", "tiny-llama-Q5_1",
                    "tiny-llama-Q4_K_M", "tiny-llama-Q5_K_M", "tiny-llama-Q6_K", "tiny-llama-Q2_K", "tiny-llama-Q3_K_M",
                    "tiny-llama-IQ4_XS", "tiny-qwen3-f16", "tiny-qwen3-Q8_0", "tiny-qwen3-Q4_0", "tiny-qwen3-Q4_1", "tiny-qwen3-Q5_0",
                    "tiny-qwen3-Q5_1", "tiny-qwen3-Q4_K_M", "tiny-qwen3-Q5_K_M", "tiny-qwen3-Q6_K", "tiny-qwen3-Q2_K",
                    "tiny-qwen3-Q3_K_M", "tiny-qwen3-IQ4_XS", "tiny-qwen2-f16", "tiny-qwen3moe-f16", "tiny-gemma3-f16",
                    "tiny-qwen35-f16", "tiny-qwen35moe-f16"),
    name_of);

// Recorded decode steps (CUDA graphs) against eager execution of the same steps: the same kernels on the
// same inputs, except that eager attention sizes its split-K grid for the step's exact length, so the
// sums may be split differently (≤ 1e-4).
class CudaGraphs : public testing::TestWithParam<std::string> {};

TEST_P(CudaGraphs, ReplayMatchesEager) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  auto gpu = test::make_cuda(false);
  CudaOptions o;
  o.graphs = false;
  gpu->set_options(o);
  const Logits eager = run(*gpu, path, DType::F16, 20, {});
  o.graphs = true;
  gpu->set_options(o);
  const Logits replay = run(*gpu, path, DType::F16, 20, eager.tokens);
  const Diff d = diff(replay, eager);
  std::printf("%s: graphs vs eager max %.2e\n", GetParam().c_str(), d.max);
  EXPECT_LE(d.max, 1e-4);
}

// A recorded step must stay valid when a later, larger step grows a scratch buffer it uses: sequence 0
// decodes (its graph is recorded at the 256-position bucket), sequence 1 then decodes at a 1024-position
// bucket (more attention splits: the split-K scratch grows), and sequence 0 decodes again, replaying its
// old recording. Logits must equal the same schedule run without graphs.
TEST(CudaGraphsScratch, OldRecordingSurvivesScratchGrowth) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/tiny-qwen3-Q4_K_M.gguf").string();
  auto schedule = [&](bool graphs) {
    auto gpu = test::make_cuda(false);
    CudaOptions o;
    o.graphs = graphs;
    gpu->set_options(o);
    auto model = Model::load(path, *gpu);
    auto cache = model->make_cache({2, 1100, DType::F16, 16});
    std::vector<float> out, all;
    Batch b;
    auto decode = [&](int seq, int pos, int n) {
      for (int i = 0; i < n; ++i) {
        b.clear();
        b.add((pos + i * 7) % 500 + 1, pos + i, seq, true);
        model->forward(b, *cache, out);
        all.insert(all.end(), out.begin(), out.end());
      }
    };
    b.clear();
    for (int p = 0; p < 8; ++p) b.add(p + 3, p, 0, p == 7);
    model->forward(b, *cache, out);
    decode(0, 8, 6);
    for (int p0 = 0; p0 < 900; p0 += 300) {
      b.clear();
      for (int p = p0; p < p0 + 300; ++p) b.add(p % 400 + 1, p, 1, false);
      model->forward(b, *cache, out);
    }
    decode(1, 900, 4);
    decode(0, 14, 6);
    return all;
  };
  const auto eager = schedule(false), replay = schedule(true);
  ASSERT_EQ(eager.size(), replay.size());
  double max = 0;
  for (size_t i = 0; i < eager.size(); ++i) max = std::max(max, std::fabs(static_cast<double>(eager[i]) - replay[i]));
  std::printf("graphs across scratch growth: max |Δ| %.2e\n", max);
  EXPECT_LE(max, 1e-4);
}

// The fused decode kernels (CudaOptions::fuse_glu: gate+up+GLU in one launch; fuse_qkv: q/k/v grouped)
// change no bit of a whole model: a prompt and 20 greedy decode steps (graphs recorded and replayed) with
// both on give the logits of both off, on tiny models whose FFN and attention weights take the 8-bit
// kernels (Q4_K_M mixes Q4_K and Q6_K; K = 256).
class CudaFuseModel : public testing::TestWithParam<std::string> {};

TEST_P(CudaFuseModel, DecodeBitIdentical) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  auto logits = [&](bool fuse, const std::vector<int32_t>& feed) {
    auto gpu = test::make_cuda(false);
    CudaOptions o = gpu->options();
    o.fuse_glu = o.fuse_qkv = fuse;
    gpu->set_options(o);
    return run(*gpu, path, DType::F16, 20, feed);
  };
  const Logits off = logits(false, {});
  const Logits on = logits(true, off.tokens);
  const Diff d = diff(on, off);
  std::printf("%s: fused vs separate max |Δ| %.2e\n", GetParam().c_str(), d.max);
  EXPECT_EQ(d.max, 0.0);
  ASSERT_EQ(on.steps.size(), off.steps.size());
  for (size_t s = 0; s < on.steps.size(); ++s)
    EXPECT_EQ(std::memcmp(on.steps[s].data(), off.steps[s].data(), on.steps[s].size() * sizeof(float)), 0) << "step " << s;
}

INSTANTIATE_TEST_SUITE_P(Decode, CudaFuseModel,
                         testing::Values("tiny-qwen3-Q4_K_M", "tiny-llama-Q4_K_M", "tiny-qwen3-Q8_0", "tiny-llama-Q4_0", "tiny-qwen3-Q5_K_M",
                                         "tiny-qwen3-Q6_K", "tiny-qwen3-IQ4_XS", "tiny-qwen35-f16"),
                         name_of);

// Two runs of the same tokens give the same logits to the bit: the prompt's and every decode step's (the
// switches whose tests use this change timing only, never a result).
void expect_bit_identical(const Logits& on, const Logits& off) {
  ASSERT_EQ(on.prompt.size(), off.prompt.size());
  ASSERT_EQ(on.steps.size(), off.steps.size());
  EXPECT_EQ(0, std::memcmp(on.prompt.data(), off.prompt.data(), on.prompt.size() * sizeof(float))) << "prompt logits differ";
  for (size_t s = 0; s < on.steps.size(); ++s)
    EXPECT_EQ(0, std::memcmp(on.steps[s].data(), off.steps[s].data(), on.steps[s].size() * sizeof(float))) << "decode step " << s;
}

// The one-launch q/k RMSNorm + RoPE (CudaOptions::fuse_qk_norm_rope) against the four ops, whole models: the
// prompt and 20 decode steps (graphs on, as in serving) give bit-identical logits, on models with q/k norms
// (qwen3 dense/MoE, gemma3, qwen35's attention layers) and without (llama, qwen2: rope only). A profiled step
// then checks that the fused kernel is what ran.
class CudaFuseQkRope : public testing::TestWithParam<std::string> {};

TEST_P(CudaFuseQkRope, LogitsBitIdentical) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  auto gpu = test::make_cuda(false);
  CudaOptions o = gpu->options();
  o.fuse_qk_norm_rope = false;
  gpu->set_options(o);
  const Logits off = run(*gpu, path, DType::F16, 20, {});
  o.fuse_qk_norm_rope = true;
  gpu->set_options(o);
  const Logits on = run(*gpu, path, DType::F16, 20, off.tokens);
  expect_bit_identical(on, off);
  std::printf("%s: fused q/k norm + rope vs four ops max |Δ| %.2e\n", GetParam().c_str(), diff(on, off).max);
  o.profile = true;
  gpu->set_options(o);
  run(*gpu, path, DType::F16, 1, {});
  const auto prof = gpu->profile_take();
  int64_t fused_calls = 0;
  for (const auto& t : prof)
    if (t.key.rfind("qk_norm_rope", 0) == 0) fused_calls += t.calls;
  EXPECT_GT(fused_calls, 0) << "the fused kernel did not run";
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaFuseQkRope,
                         testing::Values("tiny-qwen3-f16", "tiny-qwen3-Q4_K_M", "tiny-qwen3moe-f16", "tiny-gemma3-f16", "tiny-qwen35-f16",
                                         "tiny-llama-f16", "tiny-qwen2-f16"),
                         name_of);

INSTANTIATE_TEST_SUITE_P(Decode, CudaGraphs, testing::Values("tiny-qwen3-Q4_K_M", "tiny-qwen35-f16", "tiny-qwen35moe-f16"), name_of);

// CudaOptions::fuse_norm_quant (the norms write the next matmul's 8-bit activations) changes no bit of a whole
// model: the 24-row prompt (MMQ / GEMV groups reading a multi-row norm's bytes) and 20 decode steps (graphs
// recorded and replayed) with it on give the logits of it off, with the fused GEMVs on (default) and off;
// on models of both roundings (q8_K: K-quants, IQ4_XS; q8_0: Q8_0, Q4_0) and an F16 one (nothing to fuse).
// The hit counter proves the fused path ran on the quantized ones.
class CudaFuseNormQuantModel : public testing::TestWithParam<std::string> {};

TEST_P(CudaFuseNormQuantModel, LogitsBitIdentical) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  for (const bool fuse_mm : {true, false}) {
    SCOPED_TRACE(std::string("fuse_glu/qkv ") + (fuse_mm ? "on" : "off"));
    auto gpu = test::make_cuda(false);
    CudaOptions o = gpu->options();
    o.fuse_glu = o.fuse_qkv = fuse_mm;
    o.fuse_norm_quant = false;
    gpu->set_options(o);
    const Logits off = run(*gpu, path, DType::F16, 20, {});
    o.fuse_norm_quant = true;
    gpu->set_options(o);
    const int64_t h0 = gpu->norm_quant_hits();
    const Logits on = run(*gpu, path, DType::F16, 20, off.tokens);
    const int64_t hits = gpu->norm_quant_hits() - h0;
    expect_bit_identical(on, off);
    std::printf("%s (fused GEMVs %s): norm-quant on vs off max |Δ| %.2e, %lld products read a norm's bytes\n", GetParam().c_str(),
                fuse_mm ? "on" : "off", diff(on, off).max, static_cast<long long>(hits));
    if (GetParam().find("f16") == std::string::npos) {
      EXPECT_GT(hits, 0) << "the fused path never ran";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaFuseNormQuantModel,
                         testing::Values("tiny-qwen3-Q4_K_M", "tiny-llama-Q4_K_M", "tiny-qwen3-Q8_0", "tiny-llama-Q4_0", "tiny-qwen3-Q5_K_M",
                                         "tiny-qwen3-Q6_K", "tiny-qwen3-IQ4_XS", "tiny-qwen35-f16", "tiny-qwen3moe-f16"),
                         name_of);

// CudaOptions::moe_fused (fused MoE decode kernels) changes no bit of a whole MoE model: prompt and 20 decode
// steps (graphs recorded and replayed) on vs off. The stored tiny MoE models have F16 experts, which the fused
// kernels do not take (the guard falls back): this checks the guard and the fallback; CudaMoeFused.* in
// test_cuda_ops.cpp checks the kernels on quantized experts.
class CudaMoeFusedModel : public testing::TestWithParam<std::string> {};

TEST_P(CudaMoeFusedModel, LogitsBitIdentical) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  auto gpu = test::make_cuda(false);
  CudaOptions o = gpu->options();
  o.moe_fused = false;
  gpu->set_options(o);
  const Logits off = run(*gpu, path, DType::F16, 20, {});
  o.moe_fused = true;
  gpu->set_options(o);
  const int64_t h0 = gpu->moe_fused_hits();
  const Logits on = run(*gpu, path, DType::F16, 20, off.tokens);
  expect_bit_identical(on, off);
  std::printf("%s: moe_fused on vs off max |Δ| %.2e, %lld fused moe_ffn calls\n", GetParam().c_str(), diff(on, off).max,
              static_cast<long long>(gpu->moe_fused_hits() - h0));
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaMoeFusedModel, testing::Values("tiny-qwen3moe-f16", "tiny-qwen35moe-f16"), name_of);

// CudaOptions::l2_prefetch_mb (prefetch hints on a side stream after each matmul) changes no bit of a whole model:
// prompt and 20 decode steps (graphs recorded and replayed, so the side-stream branches are captured and joined)
// on vs off, with a 1 MiB budget (every set clipped on the larger files) and a large one (sets whole). The launch
// counter proves the hints ran; each run() loads and frees its model, so the plan is also cleared on free.
class CudaPrefetchModel : public testing::TestWithParam<std::string> {};

TEST_P(CudaPrefetchModel, LogitsBitIdentical) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  auto gpu = test::make_cuda(false);
  CudaOptions o = gpu->options();
  o.l2_prefetch_mb = 0;
  gpu->set_options(o);
  const int64_t p0 = gpu->prefetch_launches();
  const Logits off = run(*gpu, path, DType::F16, 20, {});
  EXPECT_EQ(gpu->prefetch_launches(), p0) << "prefetches launched while off";
  for (const int mb : {1, 256}) {
    SCOPED_TRACE("l2_prefetch_mb " + std::to_string(mb));
    o.l2_prefetch_mb = mb;
    gpu->set_options(o);
    const int64_t l0 = gpu->prefetch_launches();
    const Logits on = run(*gpu, path, DType::F16, 20, off.tokens);
    expect_bit_identical(on, off);
    const int64_t launches = gpu->prefetch_launches() - l0;
    std::printf("%s: l2_prefetch %d MiB on vs off max |Δ| %.2e, %lld prefetch launches\n", GetParam().c_str(), mb, diff(on, off).max,
                static_cast<long long>(launches));
    EXPECT_GT(launches, 0) << "no prefetch was launched";
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaPrefetchModel,
                         testing::Values("tiny-qwen3-Q4_K_M", "tiny-llama-Q8_0", "tiny-qwen35-f16", "tiny-qwen3moe-f16", "tiny-gemma3-f16"),
                         name_of);

// CudaOptions::gemm_cublas (the prefill GEMM through cuBLASLt on whole-matrix FP16 weights) on whole models.
// (1) The golden prompt with gemm_cublas_min_rows 9: every F16/BF16 projection of its 24 rows takes cuBLASLt
//     (quantized weights keep MMQ / the GEMV up to 64 rows, so only F16 files reach it); CUDA default mode vs
//     the CPU's default mode within LogitsMatchCpu's bounds for F16 files.
// (2) A 200-token prompt with gemm_cublas_min_rows 65, quantized files too: on vs off (the tensor-core kernel,
//     same 16-bit operands: only summation order differs; F16 files ≤ 0.01, quantized files within the default-
//     mode bounds, where an order change can flip an 8-bit activation rounding downstream), and on vs the CPU
//     within the default-mode bounds — or, where the tensor-core kernel itself is further off on this longer
//     prompt, no more than 1.5x its distance. A wrong product is off by whole logits.
// (3) Graph capture: a 24-row forward recorded with cuBLASLt calls inside and replayed equals the eager one.
const std::vector<int32_t>& long_prompt() {
  static const std::vector<int32_t> p = [] {
    std::vector<int32_t> v(200);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 37 + 11) % 500 + 1);
    return v;
  }();
  return p;
}

CudaOptions cublas_options(const CudaBackend& be, bool on, int min_rows) {
  CudaOptions o = be.options();
  o.gemm_cublas = on;
  o.gemm_cublas_min_rows = min_rows;
  return o;
}

class CudaGemmCublasF16Model : public testing::TestWithParam<std::string> {};

TEST_P(CudaGemmCublasF16Model, LogitsMatchCpu) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/" + GetParam() + ".gguf").string();
  auto cpu = test::make_cpu_exact();
  const Logits ref32 = run(*cpu, path, DType::F32, 15, {});
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend cpu_default(co);
  const Logits ref16 = run(cpu_default, path, DType::F16, 15, ref32.tokens);
  auto gpu = test::make_cuda(false);
  gpu->set_options(cublas_options(*gpu, true, 9));
  const int64_t c0 = gpu->gemm_cublas_calls();
  const Diff d = diff(run(*gpu, path, DType::F16, 15, ref32.tokens), ref16);
  const int64_t calls = gpu->gemm_cublas_calls() - c0;
  std::printf("%-22s gemm_cublas (24 rows): max %.2e rms %.2e, %lld cuBLASLt calls\n", GetParam().c_str(), d.max, d.rms,
              static_cast<long long>(calls));
  EXPECT_GT(calls, 0) << "no matmul took cuBLASLt";
  EXPECT_LE(d.max, 0.05);
  EXPECT_LE(d.rms, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaGemmCublasF16Model,
                         testing::Values("tiny-llama-f16", "tiny-qwen3-f16", "tiny-qwen2-f16", "tiny-qwen3moe-f16", "tiny-gemma3-f16",
                                         "tiny-qwen35-f16", "tiny-qwen35moe-f16"),
                         name_of);

class CudaGemmCublasModel : public testing::TestWithParam<std::string> {};

TEST_P(CudaGemmCublasModel, LongPromptMatchesGemmKernelAndCpu) {
  PG_REQUIRE_GPU();
  const std::string stem = GetParam();
  const std::string path = test::shared_path("golden/models/" + stem + ".gguf").string();
  const std::vector<int32_t>& prompt = long_prompt();
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend cpu_default(co);
  const Logits ref = run(cpu_default, path, DType::F16, 8, {}, prompt);
  auto gpu = test::make_cuda(false);
  gpu->set_options(cublas_options(*gpu, false, 65));
  const Logits off = run(*gpu, path, DType::F16, 8, ref.tokens, prompt);
  gpu->set_options(cublas_options(*gpu, true, 65));
  const int64_t c0 = gpu->gemm_cublas_calls();
  const Logits on = run(*gpu, path, DType::F16, 8, ref.tokens, prompt);
  const int64_t calls = gpu->gemm_cublas_calls() - c0;
  const Diff d_on_off = diff(on, off), d_on = diff(on, ref), d_off = diff(off, ref);
  std::printf("%-22s 200-row prompt: on vs off max %.2e rms %.2e | vs CPU: on max %.2e rms %.2e, off max %.2e rms %.2e | %lld calls\n",
              stem.c_str(), d_on_off.max, d_on_off.rms, d_on.max, d_on.rms, d_off.max, d_off.rms, static_cast<long long>(calls));
  EXPECT_GT(calls, 0) << "no matmul took cuBLASLt";
  const bool f16_file = stem.find("-f16") != std::string::npos;
  // LogitsMatchCpu's default-mode bounds with the tensor-core attention on (its fa_prompt case).
  const double bmax = f16_file ? 0.05 : 0.3, brms = f16_file ? 0.01 : 0.05;
  EXPECT_LE(d_on_off.max, f16_file ? 0.01 : bmax) << "cuBLASLt vs the tensor-core kernel";
  EXPECT_LE(d_on_off.rms, f16_file ? 0.002 : brms) << "cuBLASLt vs the tensor-core kernel";
  EXPECT_LE(d_on.max, std::max(bmax, 1.5 * d_off.max)) << "vs the CPU";
  EXPECT_LE(d_on.rms, std::max(brms, 1.5 * d_off.rms)) << "vs the CPU";
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaGemmCublasModel,
                         testing::Values("tiny-llama-f16", "tiny-llama-Q8_0", "tiny-llama-Q4_0", "tiny-llama-Q5_1", "tiny-llama-Q4_K_M",
                                         "tiny-llama-IQ4_XS", "tiny-qwen3-Q4_K_M", "tiny-qwen3-Q6_K", "tiny-qwen3-Q2_K",
                                         "tiny-qwen3-Q3_K_M", "tiny-qwen3-f16", "tiny-qwen3moe-f16", "tiny-gemma3-f16",
                                         "tiny-qwen35-f16"),
                         name_of);

TEST(CudaGemmCublasGraph, CapturedPromptReplaysEager) {
  PG_REQUIRE_GPU();
  const std::string path = test::shared_path("golden/models/tiny-qwen3-f16.gguf").string();
  auto gpu = test::make_cuda(false);
  CudaOptions o = cublas_options(*gpu, true, 9);
  o.graphs = true;
  o.graph_max_rows = 64;
  gpu->set_options(o);
  auto model = Model::load(path, *gpu);
  // The same 24-row forward three times on one cache emptied in between (a new cache would give the model a
  // new workspace, which drops its recordings): eager (the model's first run of a step shape), then recorded
  // and replayed, then replayed.
  std::vector<float> out[3];
  int64_t calls[3];
  const int graphs0 = gpu->graph_count();
  auto cache = model->make_cache({1, 128, DType::F16, 16});
  for (int k = 0; k < 3; ++k) {
    cache->truncate(0, 0);
    Batch b;
    for (size_t i = 0; i < kPrompt.size(); ++i) b.add(kPrompt[i], static_cast<int>(i), 0, true);
    const int64_t c0 = gpu->gemm_cublas_calls();
    model->forward(b, *cache, out[k]);
    calls[k] = gpu->gemm_cublas_calls() - c0;
  }
  EXPECT_GT(gpu->graph_count(), graphs0) << "the forward was not recorded";
  EXPECT_GT(calls[0], 0) << "the eager forward took no cuBLASLt call";
  EXPECT_EQ(calls[1], calls[0]) << "the recording holds another set of cuBLASLt calls";
  EXPECT_EQ(calls[2], 0) << "a replay issued host-side cuBLASLt calls";
  ASSERT_EQ(out[1].size(), out[0].size());
  ASSERT_EQ(out[2].size(), out[0].size());
  EXPECT_EQ(0, std::memcmp(out[1].data(), out[2].data(), out[1].size() * sizeof(float))) << "two replays differ";
  double max = 0;
  for (size_t i = 0; i < out[0].size(); ++i) max = std::max(max, std::fabs(static_cast<double>(out[1][i]) - out[0][i]));
  std::printf("gemm_cublas graph replay vs eager: max |Δ| %.2e\n", max);
  EXPECT_LE(max, 1e-4);  // as CudaGraphs: eager attention may split its sums differently
}

}  // namespace
}  // namespace pg
