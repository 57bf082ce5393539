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
  m->propose(blocks, n_out, topk, ids.data(), lps.data());
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
  m->propose(std::span<const DFlashBlock>(blocks.data(), 1), n_out, topk, ids1.data(), lps1.data());
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
  m->propose(std::span<const DFlashBlock>(&blk, 1), rows, 0, nullptr, nullptr, out.data());
  ASSERT_EQ(out.size(), ref.size());
  double mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) mx = std::max(mx, static_cast<double>(std::fabs(out[i] - ref[i])));
  EXPECT_LE(mx, 1e-3);
  std::printf("bundled DFlash draft vs PyTorch: max |diff| %.2e over %d x %d logits\n", mx, rows, nv);
}

}  // namespace
}  // namespace pg
