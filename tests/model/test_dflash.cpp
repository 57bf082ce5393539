// DFlash drafts (model/dflash.h): the format loads as written by `gguf synth --dflash` and by the
// training export, bad files fail at load with one clear error, and the bundled draft's logits match
// the PyTorch reference forward (tools/train/dflash_model.py) on the same stored weights.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "gguf/synth_dflash.h"
#include "gguf/writer.h"
#include "model/dflash.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

std::filesystem::path models_dir() { return std::filesystem::path(PEREGRINE_SOURCE_DIR) / "models"; }
std::string bundled_target() { return (models_dir() / "peregrine-demo-target-Q8_0.gguf").string(); }

// The bundled target's shape as a synth config.
gguf::SynthConfig target_shape() {
  gguf::SynthConfig c;
  c.arch = "qwen3";
  c.vocab_family = "qwen";
  c.n_layer = 7;
  c.n_embd = 320;
  c.n_ff = 768;
  c.n_head = 5;
  c.n_head_kv = 1;
  c.head_dim = 64;
  c.n_vocab = 4096;
  c.n_ctx = 1024;
  c.rope_base = 1e6;
  c.rms_eps = 1e-6;
  return c;
}

std::string synth(const test::TempDir& dir, const std::string& name, gguf::SynthConfig c, gguf::DFlashSynthOptions d) {
  const std::string p = (dir.path() / name).string();
  gguf::synth_dflash_write(c, d, gguf::synth_file_type("Q8_0"), 7, p);
  return p;
}

// A copy of `src` without the metadata key `drop`.
std::string without_key(const std::string& src, const std::string& drop, const std::string& dst) {
  auto f = gguf::File::open(src);
  gguf::Writer w;
  for (const auto& [k, v] : f->metadata())
    if (k != drop && k != "general.alignment") w.set(k, v);
  for (const auto& t : f->tensors())
    w.add_tensor_view(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::span<const uint8_t>(t.data, t.nbytes));
  w.write(dst);
  return dst;
}

std::string load_error(const std::string& draft, Model& target) {
  try {
    DFlashModel::load(draft, target);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DFlash, SynthLoadsAndProposes) {
  test::TempDir dir;
  gguf::DFlashSynthOptions d;
  d.n_layer = 2;
  d.target_layers = {1, 3, 5};
  d.mask_token = 100;
  const std::string p = synth(dir, "d.gguf", target_shape(), d);
  auto f = gguf::File::open(p);
  const DFlashConfig c = read_dflash_config(*f);
  EXPECT_EQ(c.arch, "dflash");
  EXPECT_TRUE(c.llama_cpp_layout);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.block_size, 16);
  EXPECT_EQ(c.mask_token, 100);
  EXPECT_EQ(c.target_layers, (std::vector<int>{1, 3, 5}));
  // Stored as llama.cpp's layer inputs.
  EXPECT_EQ(f->get_int_array("dflash.target_layers"), (std::vector<int64_t>{2, 4, 6}));

  CpuBackend be(CpuOptions{});
  auto target = Model::load(bundled_target(), be);
  auto m = DFlashModel::load(p, *target);
  // A context of 5 rows of arbitrary features, two blocks.
  const int n = 5, kvw = m->kv_width();
  std::vector<float> feats(static_cast<size_t>(n) * m->n_feat());
  for (size_t i = 0; i < feats.size(); ++i) feats[i] = std::sin(0.01f * static_cast<float>(i));
  std::vector<int32_t> pos = {0, 1, 2, 3, 4};
  std::vector<std::vector<float>> k(2, std::vector<float>(static_cast<size_t>(n) * kvw)), v = k;
  m->context_kv(feats.data(), pos.data(), n, {k[0].data(), k[1].data()}, {v[0].data(), v[1].data()});
  DFlashBlock b;
  b.anchor = 42;
  b.pos0 = n;
  b.n_ctx = n;
  b.ctx_k = {k[0].data(), k[1].data()};
  b.ctx_v = {v[0].data(), v[1].data()};
  std::vector<DFlashBlock> blocks = {b, b};
  blocks[1].n_ctx = 2;  // a windowed context
  const int n_out = 15, topk = 4;
  std::vector<int32_t> ids(2 * n_out * topk);
  std::vector<float> lps(ids.size());
  m->propose_host(blocks, n_out, topk, ids.data(), lps.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_GE(ids[i], 0);
    EXPECT_LT(ids[i], 4096);
    EXPECT_LE(lps[i], 0.0f);
    if (i % topk) {
      EXPECT_LE(lps[i], lps[i - 1]);
    }
  }
  // Same inputs, same outputs: the block of a batch does not depend on its neighbours.
  std::vector<int32_t> ids1(n_out * topk);
  std::vector<float> lps1(ids1.size());
  m->propose_host(std::span<const DFlashBlock>(blocks.data(), 1), n_out, topk, ids1.data(), lps1.data());
  for (size_t i = 0; i < ids1.size(); ++i) EXPECT_EQ(ids1[i], ids[i]);
}

TEST(DFlash, BadFilesFailAtLoad) {
  test::TempDir dir;
  CpuBackend be(CpuOptions{});
  auto target = Model::load(bundled_target(), be);
  gguf::DFlashSynthOptions d;
  d.n_layer = 1;
  d.target_layers = {1, 7};  // the target has layers 0..6
  d.mask_token = 100;
  gguf::SynthConfig deeper = target_shape();
  deeper.n_layer = 8;  // a draft made for a deeper target
  auto e = load_error(synth(dir, "deep.gguf", deeper, d), *target);
  EXPECT_NE(e.find("reads target layer 7"), std::string::npos) << e;
  EXPECT_NE(e.find("has 7 layers"), std::string::npos) << e;

  d.target_layers = {1, 3};
  gguf::SynthConfig wide = target_shape();
  wide.n_embd = 256;
  wide.head_dim = 64;
  wide.n_head = 4;
  e = load_error(synth(dir, "wide.gguf", wide, d), *target);
  EXPECT_NE(e.find("hidden size 256 does not match"), std::string::npos) << e;

  const std::string ok = synth(dir, "ok.gguf", target_shape(), d);
  EXPECT_EQ(load_error(ok, *target), "");
  e = load_error(without_key(ok, "tokenizer.ggml.mask_token_id", (dir.path() / "nomask.gguf").string()), *target);
  EXPECT_NE(e.find("names no mask token"), std::string::npos) << e;
  e = load_error(without_key(ok, "dflash.target_layers", (dir.path() / "nolayers.gguf").string()), *target);
  EXPECT_NE(e.find("requires 'dflash.target_layers'"), std::string::npos) << e;

  d.mask_token = 5000;  // outside the 4096-token vocabulary (a draft made for a larger one)
  gguf::SynthConfig big_vocab = target_shape();
  big_vocab.n_vocab = 8192;
  e = load_error(synth(dir, "mask.gguf", big_vocab, d), *target);
  EXPECT_NE(e.find("outside"), std::string::npos) << e;
}

TEST(DFlash, DefaultLayerIds) {
  EXPECT_EQ(gguf::dflash_default_layers(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(gguf::dflash_default_layers(64, 5), (std::vector<int>{1, 16, 31, 46, 61}));
  EXPECT_EQ(gguf::dflash_default_layers(24, 5), (std::vector<int>{1, 6, 11, 16, 21}));
  // Tiny targets: the rule would repeat ids; distinct ones instead.
  const auto small = gguf::dflash_default_layers(6, 5);
  EXPECT_EQ(small, (std::vector<int>{1, 2, 3, 4, 5}));
}

// Peregrine's draft logits for the bundled DFlash draft = the PyTorch reference forward of the same
// stored weights, with context features from Peregrine's own target forward (the whole pipeline).
TEST(DFlash, BundledDraftLogitsMatchPyTorch) {
  const auto dir = models_dir();
  const auto ref_json = nlohmann::json::parse(test::read_text(dir / "peregrine-demo-dflash-Q8_0.ref.json"));
  const auto ids = ref_json["token_ids"].get<std::vector<int32_t>>();
  const int p0 = ref_json["anchor"].get<int>();
  const int rows = ref_json["rows"].get<int>();
  const auto ref = test::read_f32(dir / ref_json["logits_file"].get<std::string>());
  CpuOptions co;
  co.exact_f32 = true;
  co.n_threads = 2;
  CpuBackend be(co);
  auto target = Model::load(bundled_target(), be);
  auto m = DFlashModel::load((dir / "peregrine-demo-dflash-Q8_0.gguf").string(), *target);
  ASSERT_EQ(m->config().target_layers, ref_json["target_layers"].get<std::vector<int>>());
  ASSERT_EQ(m->config().mask_token, ref_json["mask_token_id"].get<int>());
  // Target features of the context rows 0..p0-1, from one forward (every row's hidden states).
  auto cache = target->make_cache({1, 256, DType::F32});
  Batch b;
  for (int i = 0; i < p0; ++i) b.add(ids[static_cast<size_t>(i)], i, 0, i + 1 == p0);
  std::vector<float> logits, hidden;
  ForwardOptions fo;
  fo.hidden_layers = m->config().target_layers;
  fo.hidden = &hidden;
  fo.hidden_all_rows = true;
  target->forward(b, *cache, logits, fo);
  ASSERT_EQ(hidden.size(), static_cast<size_t>(p0) * m->n_feat());
  const int L = m->config().n_layer, kvw = m->kv_width();
  std::vector<std::vector<float>> k(static_cast<size_t>(L), std::vector<float>(static_cast<size_t>(p0) * kvw)), v = k;
  std::vector<float*> kp, vp;
  for (int l = 0; l < L; ++l) {
    kp.push_back(k[static_cast<size_t>(l)].data());
    vp.push_back(v[static_cast<size_t>(l)].data());
  }
  std::vector<int32_t> pos(static_cast<size_t>(p0));
  for (int i = 0; i < p0; ++i) pos[static_cast<size_t>(i)] = i;
  m->context_kv(hidden.data(), pos.data(), p0, kp, vp);
  DFlashBlock blk;
  blk.anchor = ids[static_cast<size_t>(p0)];
  blk.pos0 = p0;
  blk.n_ctx = p0;
  blk.ctx_k.assign(kp.begin(), kp.end());
  blk.ctx_v.assign(vp.begin(), vp.end());
  const int nv = target->config().n_vocab;
  std::vector<float> out(static_cast<size_t>(rows) * nv);
  m->propose_host(std::span<const DFlashBlock>(&blk, 1), rows, 0, nullptr, nullptr, out.data());
  ASSERT_EQ(out.size(), ref.size());
  double mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) mx = std::max(mx, static_cast<double>(std::fabs(out[i] - ref[i])));
  EXPECT_LE(mx, 1e-3);
  std::printf("bundled DFlash draft vs PyTorch (host path): max |diff| %.2e over %d x %d logits\n", mx, rows, nv);
  // The Backend-op path (context K/V in the draft's KV cache, tree-masked attention) on the same inputs.
  auto dc = m->make_cache(1, p0 + m->config().block_size);
  ASSERT_TRUE(dc->reserve(0, p0 + m->config().block_size));
  std::vector<int32_t> seq(static_cast<size_t>(p0), 0);
  m->store_context(*dc, hidden.data(), seq.data(), pos.data(), p0);
  blk.seq = 0;
  std::vector<float> out2(out.size());
  m->propose(*dc, std::span<const DFlashBlock>(&blk, 1), rows, 0, nullptr, nullptr, out2.data());
  double mx2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) mx2 = std::max(mx2, static_cast<double>(std::fabs(out2[i] - ref[i])));
  EXPECT_LE(mx2, 1e-3);
  std::printf("bundled DFlash draft vs PyTorch (Backend-op path): max |diff| %.2e\n", mx2);
}

// The Backend-op forward (what the drafter runs, on any backend) gives the host reference path's logits
// and top-k: several sequences of one cache in one pass, different context lengths, a windowed block,
// a sequence whose context rows were first written with other features and then rewritten (positions
// index the cells), and block rows left in the scratch cells by an earlier pass. In exact mode (F32
// activations into the matmuls) to 1e-4 with identical top-k; in the default mode the Q8_0 matmuls
// quantize their input rows to 8 bits, so the attention's different (equally exact) float order can
// round an activation the other way: a few hundredths there, while a wrong mask or window moves logits by O(1).
class DFlashPaths : public testing::TestWithParam<bool> {};

TEST_P(DFlashPaths, BackendPathMatchesHostPath) {
  const bool exact = GetParam();
  const auto dir = models_dir();
  const auto ref_json = nlohmann::json::parse(test::read_text(dir / "peregrine-demo-dflash-Q8_0.ref.json"));
  // The reference sequence, repeated: a context longer than one KV block of the draft cache.
  const auto ref_ids = ref_json["token_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> ids;
  for (int i = 0; i < 121; ++i) ids.push_back(ref_ids[static_cast<size_t>(i) % ref_ids.size()]);
  CpuOptions co;
  co.n_threads = 2;
  co.exact_f32 = exact;
  CpuBackend be(co);
  auto target = Model::load(bundled_target(), be);
  auto m = DFlashModel::load((dir / "peregrine-demo-dflash-Q8_0.gguf").string(), *target);
  const int n = 120;
  auto tcache = target->make_cache({1, 256, DType::F32});
  Batch b;
  for (int i = 0; i < n; ++i) b.add(ids[static_cast<size_t>(i)], i, 0, i + 1 == n);
  std::vector<float> logits, hidden;
  ForwardOptions fo;
  fo.hidden_layers = m->config().target_layers;
  fo.hidden = &hidden;
  fo.hidden_all_rows = true;
  target->forward(b, *tcache, logits, fo);
  const int L = m->config().n_layer, kvw = m->kv_width(), nf = m->n_feat(), bs = m->config().block_size;
  // Host reference: every position's K/V in host arrays.
  std::vector<std::vector<float>> k(static_cast<size_t>(L), std::vector<float>(static_cast<size_t>(n) * kvw)), v = k;
  std::vector<float*> kp, vp;
  for (int l = 0; l < L; ++l) {
    kp.push_back(k[static_cast<size_t>(l)].data());
    vp.push_back(v[static_cast<size_t>(l)].data());
  }
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = i;
  m->context_kv(hidden.data(), pos.data(), n, kp, vp);
  // Blocks: (seq, pos0, n_ctx); seq 2 sees a window of 9 positions.
  struct Spec {
    int seq, pos0, n_ctx;
  };
  const std::vector<Spec> specs = {{0, n, n}, {2, 37, 37}, {1, n - 5, 9}};
  auto dc = m->make_cache(3, n + bs);
  // Seq 1 first gets other features for its context (a rejected or reused history), then the real ones.
  std::vector<float> junk(static_cast<size_t>(n) * nf);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = std::cos(0.37f * static_cast<float>(i));
  for (const Spec& sp : specs) ASSERT_TRUE(dc->reserve(sp.seq, sp.pos0 + bs));
  {
    std::vector<int32_t> s1(static_cast<size_t>(n - 5), 1);
    m->store_context(*dc, junk.data(), s1.data(), pos.data(), n - 5);
  }
  // All sequences' context rows in one pass.
  std::vector<float> feats;
  std::vector<int32_t> sq, ps;
  for (const Spec& sp : specs)
    for (int p = 0; p < sp.pos0; ++p) {
      sq.push_back(sp.seq);
      ps.push_back(p);
      feats.insert(feats.end(), hidden.begin() + static_cast<std::ptrdiff_t>(p) * nf, hidden.begin() + static_cast<std::ptrdiff_t>(p + 1) * nf);
    }
  m->store_context(*dc, feats.data(), sq.data(), ps.data(), static_cast<int>(sq.size()));
  std::vector<DFlashBlock> blocks;
  for (const Spec& sp : specs) {
    DFlashBlock blk;
    blk.anchor = ids[static_cast<size_t>(sp.pos0)];
    blk.pos0 = sp.pos0;
    blk.n_ctx = sp.n_ctx;
    blk.seq = sp.seq;
    for (int l = 0; l < L; ++l) {
      blk.ctx_k.push_back(kp[static_cast<size_t>(l)] + static_cast<size_t>(sp.pos0 - sp.n_ctx) * kvw);
      blk.ctx_v.push_back(vp[static_cast<size_t>(l)] + static_cast<size_t>(sp.pos0 - sp.n_ctx) * kvw);
    }
    blocks.push_back(blk);
  }
  const int nv = target->config().n_vocab, nb = static_cast<int>(blocks.size());
  for (int n_out : {15, 7}) {
    SCOPED_TRACE("n_out " + std::to_string(n_out));
    std::vector<float> host(static_cast<size_t>(nb) * n_out * nv), dev(host.size());
    m->propose_host(blocks, n_out, 0, nullptr, nullptr, host.data());
    m->propose(*dc, blocks, n_out, 0, nullptr, nullptr, dev.data());
    double mx = 0, mag = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      mx = std::max(mx, static_cast<double>(std::fabs(dev[i] - host[i])));
      mag = std::max(mag, static_cast<double>(std::fabs(host[i])));
    }
    EXPECT_LE(mx, exact ? 1e-4 : 0.1);
    EXPECT_GT(mag, 1.0);  // real logits, not zeros on both sides
    std::printf("DFlash Backend-op path vs host path (%s), %d blocks x %d rows: max |diff| %.2e (max |logit| %.1f)\n", exact ? "exact" : "default", nb, n_out, mx, mag);
    // The windowed block differs from the same block over its whole context: the window is applied.
    if (n_out == 15) {
      std::vector<DFlashBlock> full = {blocks[2]};
      full[0].n_ctx = full[0].pos0;
      std::vector<float> f(static_cast<size_t>(n_out) * nv);
      m->propose(*dc, full, n_out, 0, nullptr, nullptr, f.data());
      double d = 0;
      for (size_t i = 0; i < f.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(f[i] - dev[2 * static_cast<size_t>(n_out) * nv + i])));
      EXPECT_GT(d, 1e-3);
    }
    if (!exact) continue;
    const int topk = 4;
    std::vector<int32_t> hi(static_cast<size_t>(nb) * n_out * topk), di(hi.size());
    std::vector<float> hl(hi.size()), dl(hi.size());
    m->propose_host(blocks, n_out, topk, hi.data(), hl.data());
    m->propose(*dc, blocks, n_out, topk, di.data(), dl.data());
    EXPECT_EQ(di, hi);
    for (size_t i = 0; i < hl.size(); ++i) EXPECT_NEAR(dl[i], hl[i], 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(CpuModes, DFlashPaths, testing::Values(true, false), [](const testing::TestParamInfo<bool>& i) {
  return std::string(i.param ? "Exact" : "Default");
});

}  // namespace
}  // namespace pg

namespace pg {
namespace {

// The features can stay on the backend: ForwardOptions::hidden_dev holds what ForwardOptions::hidden
// holds (layer k of row r at row k·n + r), and projecting context rows gathered from it
// (store_context_rows, rows in any order) gives the draft the same K/V as projecting host rows.
TEST(DFlash, DeviceFeaturesEqualHostFeatures) {
  const auto dir = models_dir();
  CpuOptions co;
  co.n_threads = 2;
  CpuBackend be(co);
  auto target = Model::load(bundled_target(), be);
  auto m = DFlashModel::load((dir / "peregrine-demo-dflash-Q8_0.gguf").string(), *target);
  const int n = 90, e = target->config().n_embd, nh = m->config().n_target_layers, bs = m->config().block_size;
  Batch b;
  for (int i = 0; i < n; ++i) b.add(static_cast<int32_t>((i * 37 + 11) % 4096), i, 0, i + 1 == n);
  std::vector<float> logits, hidden;
  ForwardOptions fo;
  fo.hidden_layers = m->config().target_layers;
  fo.hidden = &hidden;
  fo.hidden_all_rows = true;
  auto c1 = target->make_cache({1, 256, DType::F32});
  target->forward(b, *c1, logits, fo);
  Tensor dev = m->feature_buffer(n);
  ForwardOptions fd = fo;
  fd.hidden = nullptr;
  fd.hidden_dev = &dev;
  auto c2 = target->make_cache({1, 256, DType::F32});
  target->forward(b, *c2, logits, fd);
  std::vector<float> got(static_cast<size_t>(nh) * n * e);
  be.download(dev, got.data(), got.size() * sizeof(float));
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < nh; ++k)
      for (int d = 0; d < e; ++d)
        ASSERT_EQ(got[(static_cast<size_t>(k) * n + r) * e + d], hidden[(static_cast<size_t>(r) * nh + k) * e + d]) << "row " << r << " layer " << k;
  // Too small a buffer is refused.
  Tensor small = dev.rows_view(0, static_cast<int64_t>(nh) * n - 1);
  fd.hidden_dev = &small;
  EXPECT_THROW(target->forward(b, *c2, logits, fd), Error);
  // Context rows 0..n-1 stored from host rows and from device rows given in reverse order.
  auto dh = m->make_cache(2, n + bs);
  ASSERT_TRUE(dh->reserve(0, n + bs));
  ASSERT_TRUE(dh->reserve(1, n + bs));
  std::vector<int32_t> pos(static_cast<size_t>(n)), rows(static_cast<size_t>(n)), s0(static_cast<size_t>(n), 0), s1(static_cast<size_t>(n), 1);
  for (int i = 0; i < n; ++i) {
    pos[static_cast<size_t>(i)] = i;
    rows[static_cast<size_t>(i)] = n - 1 - i;
  }
  m->store_context(*dh, hidden.data(), s0.data(), pos.data(), n);
  std::vector<int32_t> rpos(pos.rbegin(), pos.rend());
  m->store_context_rows(*dh, dev, n, rows.data(), s1.data(), rpos.data(), n);
  std::vector<DFlashBlock> blocks(2);
  for (int s = 0; s < 2; ++s) {
    blocks[static_cast<size_t>(s)].anchor = 7;
    blocks[static_cast<size_t>(s)].pos0 = n;
    blocks[static_cast<size_t>(s)].n_ctx = n;
    blocks[static_cast<size_t>(s)].seq = s;
  }
  const int n_out = 15, nv = target->config().n_vocab;
  std::vector<float> out(static_cast<size_t>(2) * n_out * nv);
  m->propose(*dh, blocks, n_out, 0, nullptr, nullptr, out.data());
  for (size_t i = 0; i < static_cast<size_t>(n_out) * nv; ++i) ASSERT_EQ(out[i], out[i + static_cast<size_t>(n_out) * nv]) << i;
  // A row outside the forward is refused.
  std::vector<int32_t> bad = {n};
  EXPECT_THROW(m->store_context_rows(*dh, dev, n, bad.data(), s1.data(), pos.data(), 1), Error);
}

}  // namespace
}  // namespace pg
