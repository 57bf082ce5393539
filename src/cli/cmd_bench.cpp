// peregrine bench: prompt-processing and generation speed, with the bytes each generated token
// reads so that speed can be judged against the memory-bandwidth roofline.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/scheduler.h"
#include <fstream>

namespace pg::cli {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// "512,4096" → {512, 4096}: llama-bench's list form, so one model load serves a whole table.
std::vector<int> int_list(const std::string& text, const char* flag) {
  std::vector<int> v;
  size_t p = 0;
  while (p <= text.size()) {
    const size_t q = std::min(text.find(',', p), text.size());
    const std::string item = text.substr(p, q - p);
    char* end = nullptr;
    const long x = std::strtol(item.c_str(), &end, 10);
    PG_CHECK(!item.empty() && end && *end == '\0' && x >= 0 && x <= (1 << 24),
             std::string(flag) + ": '" + item + "' is not a non-negative integer (a comma-separated list is allowed)");
    v.push_back(static_cast<int>(x));
    p = q + 1;
  }
  return v;
}

// Chat prompts of the bundled demo's domains (models/README.md): arithmetic, string tasks, letter
// counts, unit conversion, small Python functions, small talk.
const char* const kDemoPrompts[] = {
    "What is 4821 + 377?", "What is 9034 - 2716?", "What is 56 * 12?", "Reverse the word lantern.",
    "Write the word harbor in upper case.", "How many letters are in the word meadow?", "What is the first letter of copper?",
    "How many times does the letter s appear in mississippi?", "Convert 7 kilometers to meters.", "Convert 3 hours to minutes.",
    "Write a Python function that returns the sum of a list.", "Write a Python function that reverses a string.",
    "Write a Python function that returns the maximum of a list.", "Write a Python function that counts the vowels in a string.",
    "Hello! How are you today?", "What can you help me with?", "What is 1234 + 8765?", "Reverse the word violet.",
    "What is the last letter of quartz?", "Convert 5 kilograms to grams.",
};

struct SpecRun {
  double tps = 0;
  int tokens = 0, drafted = 0, accepted = 0, rounds = 0;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> margins;  // with want_margins: per token, top-1 − top-2 log-prob
  engine::MetricsSnapshot phases;           // speculative modes: SchedulerOptions::spec_phases' sums (phase_*)
};

// Greedy chat answers to every prompt, one at a time, through the engine's step loop.
SpecRun spec_run(Model& model, const tok::Tokenizer& tok, const LoadedModel& lm, int n_batch, const engine::SpecOptions& spec,
                 const std::vector<std::vector<int32_t>>& prompts, int n_gen, bool want_margins = false) {
  engine::SchedulerOptions so = lm.scheduler_options(1, n_batch, spec);
  so.spec_phases = spec.on();  // the spec-phases line (one device sync per phase of a verify step)
  engine::Scheduler sched(model, tok, so);
  SpecRun r;
  double decode_s = 0;
  for (const auto& p : prompts) {
    engine::RequestSpec rs;
    rs.prompt = p;
    rs.sampling.temperature = 0;
    rs.max_tokens = n_gen;
    if (want_margins) rs.logprobs = 2;
    auto h = sched.submit(rs);
    engine::Event e;
    std::vector<int32_t> ids;
    std::vector<float> margins;
    for (;;) {
      if (!h->next(e, std::chrono::milliseconds(100))) continue;
      for (auto& t : e.tokens) {
        ids.push_back(t.id);
        if (want_margins) margins.push_back(t.top.size() >= 2 ? t.top[0].logprob - t.top[1].logprob : INFINITY);
      }
      if (e.done) break;
    }
    PG_CHECK(e.finish != engine::FinishReason::kError, "generation failed: " + e.error);
    // Decode speed: tokens after the first over the time after the first (prefill excluded, as tg).
    if (e.stats.n_generated > 1) {
      decode_s += e.stats.decode_ms / 1000.0;
      r.tokens += e.stats.n_generated - 1;
    }
    r.drafted += e.stats.draft_n;
    r.accepted += e.stats.draft_n_accepted;
    r.rounds += e.stats.draft_rounds;
    r.ids.push_back(std::move(ids));
    r.margins.push_back(std::move(margins));
  }
  r.tps = decode_s > 0 ? r.tokens / decode_s : 0;
  if (spec.on()) {
    sched.shutdown();  // the last step's counters land after its tokens are delivered
    r.phases = sched.metrics();
  }
  return r;
}

// peregrine bench --draft FILE | --spec-type ngram: AR vs speculative decode on chat prompts.
int bench_spec(const ModelFlags& mf_in, const SpecFlags& spf, int n_gen, int reps, const std::string& prompt_file, bool bundled) {
  ModelFlags mf = mf_in;
  mf.ctx = std::max(mf.ctx, 1024);
  auto lm = load_model(mf);
  auto draft = load_spec(spf, mf, lm, mf.model, bundled);
  PG_CHECK(draft.opt.on(), "nothing to compare: give a draft model (--draft FILE) or --spec-type ngram");
  std::vector<std::string> qs;
  if (!prompt_file.empty()) {
    std::ifstream f(prompt_file);
    PG_CHECK(f.good(), "cannot read prompt file '" + prompt_file + "'");
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) qs.push_back(line);
  } else {
    qs.assign(std::begin(kDemoPrompts), std::end(kDemoPrompts));
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& q : qs)
    prompts.push_back(lm.tokenizer->encode("<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n", false, true));
  engine::SpecOptions ar;
  std::vector<std::pair<std::string, engine::SpecOptions>> modes = {{"AR", ar}};
  engine::SpecOptions chain = draft.opt;
  chain.tree = false;
  modes.push_back({"chain n-max " + std::to_string(chain.n_max), chain});
  if (draft.opt.tree) modes.push_back({"ddtree budget " + std::to_string(draft.opt.budget) + " depth " + std::to_string(draft.opt.n_max), draft.opt});
  std::printf("model: %s, draft: %s (%s), %zu chat prompts, greedy, up to %d tokens each, median of %d runs\n",
              lm.model->config().name.c_str(), draft.path.empty() ? "none" : draft.path.c_str(), spec::spec_type_name(draft.opt.type),
              prompts.size(), n_gen, reps);
  std::printf("| mode | tok/s | vs AR | drafted | accepted | steps | mean_accept_len | same text |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  // Modes alternate within each repetition and every speculative mode is compared with the AR run of
  // the same repetition: on a shared machine the load drifts, and a ratio of neighbours drifts less.
  spec_run(*lm.model, *lm.tokenizer, lm, mf.batch, ar, {prompts[0]}, 8);  // warm-up
  std::vector<std::vector<double>> tps(modes.size()), ratio(modes.size());
  std::vector<SpecRun> last(modes.size());
  for (int r = 0; r < reps; ++r)
    for (size_t m = 0; m < modes.size(); ++m) {
      last[m] = spec_run(*lm.model, *lm.tokenizer, lm, mf.batch, modes[m].second, prompts, n_gen);
      tps[m].push_back(last[m].tps);
      ratio[m].push_back(tps[0].back() > 0 ? last[m].tps / tps[0].back() : 0.0);
    }
  for (size_t m = 0; m < modes.size(); ++m) {
    const SpecRun& l = last[m];
    int same = 0;
    for (size_t i = 0; i < l.ids.size(); ++i) same += l.ids[i] == last[0].ids[i];
    std::printf("| %s | %.1f | %.2fx | %d | %d | %d | %.2f | %d/%zu |\n", modes[m].first.c_str(), median(tps[m]), median(ratio[m]), l.drafted,
                l.accepted, l.rounds, l.rounds ? static_cast<double>(l.accepted + l.rounds) / l.rounds : 0.0, same, prompts.size());
  }
  std::printf("(tok/s: median over repetitions; vs AR: median of the per-repetition ratio to that repetition's AR run)\n");
  // Where a speculative step's time goes (the last repetition; steps with verify rows only, host clock,
  // the device synchronised after each phase).
  for (size_t m = 1; m < modes.size(); ++m) {
    const engine::MetricsSnapshot& p = last[m].phases;
    const double k = p.phase_steps ? 1000.0 / static_cast<double>(p.phase_steps) : 0.0;
    std::printf("spec-phases: draft %.3f ms verify %.3f ms commit %.3f ms other %.3f ms (per step; %s, %llu steps)\n", p.phase_draft_s * k,
                p.phase_verify_s * k, p.phase_commit_s * k, p.phase_other_s * k, modes[m].first.c_str(),
                static_cast<unsigned long long>(p.phase_steps));
  }
  // A text that differs from AR: where, and how close plain decoding's top two were there. Verification runs
  // many rows per matmul and AR one, so on a GPU the logits differ by rounding and a near-tie may flip; a
  // large margin at the first difference would be a real bug.
  bool any_diff = false;
  for (size_t m = 1; m < modes.size(); ++m)
    for (size_t i = 0; i < last[m].ids.size(); ++i) any_diff |= last[m].ids[i] != last[0].ids[i];
  if (any_diff) {
    const SpecRun ref = spec_run(*lm.model, *lm.tokenizer, lm, mf.batch, ar, prompts, n_gen, true);
    for (size_t m = 1; m < modes.size(); ++m)
      for (size_t i = 0; i < last[m].ids.size(); ++i) {
        const auto &a = ref.ids[i], &b = last[m].ids[i];
        if (b == last[0].ids[i]) continue;
        size_t j = 0;
        while (j < a.size() && j < b.size() && a[j] == b[j]) ++j;
        const float margin = j < ref.margins[i].size() ? ref.margins[i][j] : NAN;
        std::printf("differs: %s, prompt %zu, first at token %zu of %zu; plain decoding's top-2 log-prob margin there %.4g\n",
                    modes[m].first.c_str(), i, j, a.size(), margin);
      }
  }
  return 0;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  ModelFlags mf;
  std::string prompts = "512", gens = "128", depths = "0";
  int reps = 3;
  double bandwidth = 0;
  Args a("bench", "Measure prompt processing (pp) and generation (tg) speed. Prints tok/s (median of -r runs), the\n"
                  "bytes read per generated token, the achieved GB/s and, given --bandwidth, the fraction of the roofline.\n"
                  "-p, -n and -d take comma-separated lists (as llama-bench): every pp and tg test runs at every depth.");
  mf.add_to(a, false);
  a.opt("-p,--n-prompt", &prompts, "prompt tokens for the pp test (0 = skip)");
  a.opt("-n,--n-gen", &gens, "generated tokens for the tg test (0 = skip)");
  a.opt("-r,--repetitions", &reps, "repetitions (the median is reported)");
  a.opt("-d,--depth", &depths, "tokens already in the KV cache before each test");
  a.opt("--bandwidth", &bandwidth, "memory bandwidth in GB/s for the roofline fraction (0 = not shown)");
  SpecFlags spf;
  std::string spec_prompts;
  spf.add_to(a);
  a.opt("--spec-prompts", &spec_prompts, "speculative test: one chat prompt per line (default: 20 built-in demo prompts)", "FILE");
  a.footer("With a draft model (--draft FILE) or --spec-type ngram, bench instead measures speculative decoding: greedy chat answers\n"
           "(-n tokens at most) to each prompt, AR vs chain (vs DDTree with --ddtree), tok/s and mean accepted length.");
  if (!a.parse(argc, argv)) return 0;
  spf.validate();
  if (!spf.draft.empty() || (!spf.type.empty() && spf.type != "none")) {
    const bool bundled = mf.model.empty() && !std::getenv("PEREGRINE_MODEL");
    if (mf.model.empty()) mf.model = default_model_path();
    const std::vector<int> ng = int_list(gens, "-n");
    return bench_spec(mf, spf, ng.empty() || ng[0] == 0 ? 128 : ng[0], reps, spec_prompts, bundled);
  }
  const std::vector<int> n_prompts = int_list(prompts, "-p"), n_gens = int_list(gens, "-n"), ds = int_list(depths, "-d");
  PG_CHECK(reps > 0, "-r must be positive");
  const int max_p = *std::max_element(n_prompts.begin(), n_prompts.end()), max_n = *std::max_element(n_gens.begin(), n_gens.end());
  PG_CHECK(max_p + max_n > 0, "nothing to measure: -p and -n are all 0");
  mf.ctx = *std::max_element(ds.begin(), ds.end()) + std::max(max_p, max_n) + 1;
  auto lm = load_model(mf, false);
  const auto& c = lm.model->config();
  const auto bytes = lm.model->bytes();
  auto cache = lm.model->make_cache(lm.kv_options(1, mf.ctx));
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, c.n_vocab - 1);
  std::vector<float> logits;

  auto fill_depth = [&](int depth) {
    cache->clear(0);
    for (int p0 = 0; p0 < depth; p0 += mf.batch) {
      Batch b;
      for (int p = p0; p < std::min(depth, p0 + mf.batch); ++p) b.add(tok(rng), p, 0, false);
      lm.model->forward(b, *cache, logits);
    }
    // A forward with no output rows returns with its work still queued (the engine overlaps the next chunk's
    // set-up with it), so without this wait the test timed next would include the fill's last prefill chunk:
    // until 2026-12-04 every tg and pp figure at a depth > 0 on the GPU did (qwen3-8b tg128 at depth 4096: the
    // 512-row chunk at depth 3584, ~90 ms, spread over the 128 tokens, ~0.7 ms each). llama-bench waits here too.
    lm.backend->synchronize();
    lm.backend->profile_take();  // op profiling (PEREGRINE_CUDA_PROFILE=1): the fill is not part of a test
  };
  // Op profiling: the measured runs' ops, summed over the repetitions, printed per token after the test.
  std::vector<Backend::OpTime> prof;
  auto prof_add = [&] {
    for (Backend::OpTime& t : lm.backend->profile_take()) {
      auto it = std::find_if(prof.begin(), prof.end(), [&](const Backend::OpTime& p) { return p.key == t.key; });
      if (it == prof.end())
        prof.push_back(std::move(t));
      else
        it->calls += t.calls, it->ms += t.ms;
    }
  };
  std::vector<std::string> prof_tables;
  auto prof_table = [&](const std::string& test, double tokens) {
    if (prof.empty()) return;
    std::sort(prof.begin(), prof.end(), [](const Backend::OpTime& a, const Backend::OpTime& b) { return a.ms > b.ms; });
    double total = 0.0;
    for (const auto& t : prof) total += t.ms;
    std::string tab = "ops of " + test + " (device time per token, CUDA events around each op, graphs off): " +
                      std::to_string(total * 1000.0 / tokens) + " us/token in ops\n| op | calls/token | us/token | % |\n|---|---:|---:|---:|\n";
    for (size_t i = 0; i < prof.size() && i < 40; ++i) {
      char line[320];
      std::snprintf(line, sizeof line, "| %s | %.2f | %.1f | %.1f |\n", prof[i].key.c_str(), prof[i].calls / tokens, prof[i].ms * 1000.0 / tokens,
                    100.0 * prof[i].ms / total);
      tab += line;
    }
    prof_tables.push_back(tab);
    prof.clear();
  };

  std::printf("model: %s (%s), %.3f GB file, %.3f GB of weights read per generated token\n", c.name.c_str(), c.arch.c_str(),
              bytes.file / 1e9, bytes.per_token / 1e9);
  std::printf("backend: %s, threads: %d, KV: %s, batch: %d\n", lm.backend->name().c_str(), mf.threads, mf.kv_types().c_str(), mf.batch);
  std::printf("| test | depth | t/s | ms/token | GB/s | roofline |\n|---|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> notes;
  using clock = std::chrono::steady_clock;
  for (const int depth : ds) {
    for (const int n_prompt : n_prompts) {
      if (n_prompt == 0) continue;
      std::vector<double> tps;
      for (int r = 0; r < reps + 1; ++r) {  // first run warms up
        fill_depth(depth);
        Batch b;
        for (int p = 0; p < n_prompt; ++p) b.add(tok(rng), depth + p, 0, p == n_prompt - 1);
        auto t0 = clock::now();
        lm.model->forward(b, *cache, logits);
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (r > 0) tps.push_back(n_prompt / s);
        if (r > 0) prof_add();
      }
      prof_table("pp" + std::to_string(n_prompt) + " @ " + std::to_string(depth), static_cast<double>(n_prompt) * reps);
      const double t = median(tps);
      std::printf("| pp%d | %d | %.2f | %.3f | - | - |\n", n_prompt, depth, t, 1000.0 / t);
      std::fflush(stdout);
    }
    for (const int n_gen : n_gens) {
      if (n_gen == 0) continue;
      std::vector<double> tps, waits;  // waits: per rep, host seconds blocked on the device (Backend::wait_take)
      for (int r = 0; r < reps + 1; ++r) {
        fill_depth(depth);
        lm.backend->wait_take();  // the fill's waits are not part of the test
        auto t0 = clock::now();
        int32_t next = tok(rng);
        // Greedy decoding as the engine does it: the token is picked on the backend.
        int32_t greedy = -1;
        const uint8_t only = 1;
        ForwardOptions fopt;
        fopt.argmax = &greedy;
        fopt.argmax_only = &only;
        for (int i = 0; i < n_gen; ++i) {
          Batch b;
          b.add(next, depth + i, 0, true);
          lm.model->forward(b, *cache, logits, fopt);
          next = greedy;
        }
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        const double wait = lm.backend->wait_take();
        if (r > 0) tps.push_back(n_gen / s), waits.push_back(wait / n_gen);
        if (r > 0) prof_add();
      }
      prof_table("tg" + std::to_string(n_gen) + " @ " + std::to_string(depth), static_cast<double>(n_gen) * reps);
      const double t = median(tps);
      // Each step reads the weights once plus the KV cache written so far (mean depth over the run), and a
      // hybrid model's recurrent state (conv window + delta state of every linear-attention layer) is read
      // and written once.
      const double kv = static_cast<double>(cache->bytes_per_token()) * (depth + n_gen / 2.0);
      const double state = cache->recurrent() ? 2.0 * static_cast<double>(cache->recurrent()->slot_bytes()) : 0.0;
      const double per_tok = static_cast<double>(bytes.per_token) + kv + state;
      const double gbs = per_tok * t / 1e9;
      char roof[32] = "-";
      if (bandwidth > 0) std::snprintf(roof, sizeof roof, "%.1f%%", 100.0 * gbs / bandwidth);
      std::printf("| tg%d | %d | %.2f | %.3f | %.2f | %s |\n", n_gen, depth, t, 1000.0 / t, gbs, roof);
      std::fflush(stdout);
      char line[256];
      if (state > 0)
        std::snprintf(line, sizeof line, "bytes per generated token (tg%d @ %d): %.0f (weights %zu + KV %.0f + recurrent state read and written %.0f)",
                      n_gen, depth, per_tok, bytes.per_token, kv, state);
      else
        std::snprintf(line, sizeof line, "bytes per generated token (tg%d @ %d): %.0f (weights %zu + KV %.0f)", n_gen, depth, per_tok,
                      bytes.per_token, kv);
      notes.push_back(line);
      // Where a step's time goes: the host's own work (batch set-up, uploads, launches or graph replay) and
      // the device time it then waited for. Only a backend with a queue reports waits (CUDA).
      if (const double w = median(waits); w > 0.0) {
        const double ms = 1000.0 / t, wait_ms = 1000.0 * w;
        std::snprintf(line, sizeof line, "host / device (tg%d @ %d): %.3f ms/token waiting for the device, %.3f ms/token on the host", n_gen, depth,
                      wait_ms, std::max(0.0, ms - wait_ms));
        notes.push_back(line);
      }
    }
  }
  for (const std::string& n : notes) std::printf("%s\n", n.c_str());
  for (const std::string& t : prof_tables) std::printf("\n%s", t.c_str());
  return 0;
}

}  // namespace pg::cli
