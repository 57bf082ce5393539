// Utility routes: /props, /metrics (Prometheus), /tokenize, /detokenize, /apply-template.
#include <cstdio>
#include <filesystem>

#include "chat/parse/utf8.h"
#include "server/context.h"
#include "model/dflash.h"
#include "spec/drafter.h"
#include "server/prepare.h"

namespace pg::server {

namespace {

std::string token_text_or_null(const tok::Tokenizer& tok, int32_t id) {
  return id >= 0 && id < tok.n_vocab() ? tok.token_text(id) : std::string();
}

void metric(std::string& out, const char* name, const char* type, const char* help, double v, const std::string& labels = {}) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s%s %.17g\n", name, help, name, type, name, labels.c_str(), v);
  out += buf;
}

void histogram(std::string& out, const char* name, const char* help, const engine::Histogram& h) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  out += buf;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s_bucket{le=\"%g\"} %llu\n", name, h.bounds[i], static_cast<unsigned long long>(h.counts[i]));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                static_cast<unsigned long long>(h.count), name, h.sum, name, static_cast<unsigned long long>(h.count));
  out += buf;
}

}  // namespace

// The prefix cache's configuration (/props) and counters (/metrics); docs/prefix-cache.md.
json prefix_cache_props(const Context& ctx) {
  const PrefixCache* pc = ctx.sched.prefix_cache();
  const auto& po = ctx.sched.options().prefix;
  json j = json::object();
  j["enabled"] = pc != nullptr;
  if (!pc) return j;
  j["ram_budget_blocks"] = pc->budget_blocks();
  j["block_size"] = ctx.sched.options().kv_block_size;
  j["partial_blocks"] = po.partial;
  j["recurrent_snapshots"] = pc->n_snapshots();
  j["disk_dir"] = po.disk_dir.empty() ? json(nullptr) : json(po.disk_dir);
  j["disk_enabled"] = pc->disk_enabled();
  j["disk_budget_bytes"] = po.disk_bytes;
  return j;
}

HttpOut handle_props(Context& ctx, const HttpIn&) {
  const SamplingParams& p = ctx.opt.sampling;
  const auto& so = ctx.sched.options();
  json params = json::object();
  params["temperature"] = p.temperature;
  params["top_k"] = p.top_k;
  params["top_p"] = p.top_p;
  params["min_p"] = p.min_p;
  params["typical_p"] = p.typical_p;
  params["repeat_penalty"] = p.repeat_penalty;
  params["repeat_last_n"] = p.repeat_last_n;
  params["presence_penalty"] = p.presence_penalty;
  params["frequency_penalty"] = p.frequency_penalty;
  params["seed"] = ctx.opt.seed;
  params["max_tokens"] = ctx.opt.default_max_tokens;
  json runtime = json::object();
  if (!ctx.opt.runtime_info_json.empty()) {
    try {
      runtime = json::parse(ctx.opt.runtime_info_json);
    } catch (...) {
      runtime = json::object();
    }
  }
  runtime["n_batch"] = so.n_batch;
  runtime["kv_block_size"] = so.kv_block_size;
  runtime["kv_bytes"] = ctx.sched.kv_bytes();
  runtime["max_queue"] = so.max_queue;
  runtime["api_key_required"] = !ctx.opt.api_key.empty();
  runtime["cors_origin"] = ctx.opt.cors_origin.empty() ? json(nullptr) : json(ctx.opt.cors_origin);
  runtime["timeout_s"] = ctx.opt.timeout_s;
  runtime["max_body_bytes"] = ctx.opt.max_body;
  runtime["clamp_max_tokens"] = ctx.opt.clamp_max_tokens;
  runtime["http_threads"] = ctx.opt.http_threads;
  runtime["host"] = ctx.opt.host;
  json spec = json::object();
  spec["type"] = spec::spec_type_name(so.spec.type);
  spec["draft_model"] = so.spec.draft ? json(so.spec.draft->config().name) : so.spec.dflash ? json(so.spec.dflash->config().name) : json(nullptr);
  if (so.spec.dflash) spec["dflash"] = json{{"block_size", so.spec.dflash->config().block_size}, {"target_layers", so.spec.dflash->config().target_layers},
                                            {"fa_window", so.spec.fa_window}};
  spec["n_max"] = so.spec.n_max;
  spec["n_min"] = so.spec.n_min;
  spec["tree"] = so.spec.tree ? "ddtree" : "chain";
  spec["ddtree_budget"] = so.spec.budget;
  spec["p_min"] = so.spec.p_min;
  spec["adaptive"] = so.spec.adaptive;
  json r = json::object();
  r["model"] = ctx.opt.model_name;
  // The absolute path tells any page or client that can read /props about the host's file
  // system; the file name is what identifies the model.
  r["model_path"] = ctx.opt.props_full ? ctx.opt.model_path : std::filesystem::path(ctx.opt.model_path).filename().string();
  r["n_ctx"] = so.n_ctx;
  r["n_vocab"] = ctx.tok.n_vocab();
  r["total_slots"] = so.n_slots;
  r["chat_template"] = ctx.prompt ? json(ctx.prompt->source()) : json(nullptr);
  r["chat_format"] = ctx.prompt ? json(std::string(ctx.prompt->format().name())) : json(nullptr);
  r["bos_token"] = token_text_or_null(ctx.tok, ctx.tok.bos());
  r["eos_token"] = token_text_or_null(ctx.tok, ctx.tok.eos());
  r["build_info"] = ctx.opt.build_info;
  r["default_generation_settings"] = json{{"n_ctx", so.n_ctx}, {"params", params}};
  r["runtime"] = runtime;
  r["speculative"] = spec;
  r["prefix_cache"] = prefix_cache_props(ctx);
  return HttpOut::json_reply(r);
}

HttpOut handle_metrics(Context& ctx, const HttpIn&) {
  const engine::MetricsSnapshot m = ctx.sched.metrics();
  std::string s;
  metric(s, "peregrine_requests_total", "counter", "Requests accepted into the engine queue.", static_cast<double>(m.requests_submitted));
  metric(s, "peregrine_requests_rejected_total", "counter", "Requests refused before any work (context overflow, bad values, queue full).",
         static_cast<double>(m.requests_rejected));
  s += "# HELP peregrine_requests_finished_total Requests that ended, by reason.\n# TYPE peregrine_requests_finished_total counter\n";
  for (const char* reason : {"eog", "stop", "length", "context", "cancelled", "timeout", "error"}) {
    auto it = m.requests_finished.find(reason);
    char buf[160];
    std::snprintf(buf, sizeof buf, "peregrine_requests_finished_total{reason=\"%s\"} %llu\n", reason,
                  static_cast<unsigned long long>(it == m.requests_finished.end() ? 0 : it->second));
    s += buf;
  }
  metric(s, "peregrine_prompt_tokens_total", "counter", "Prompt tokens prefilled.", static_cast<double>(m.prompt_tokens));
  metric(s, "peregrine_generated_tokens_total", "counter", "Tokens generated.", static_cast<double>(m.generated_tokens));
  metric(s, "peregrine_steps_total", "counter", "Batched forward steps.", static_cast<double>(m.steps));
  metric(s, "peregrine_batch_rows_total", "counter", "Rows evaluated over all steps.", static_cast<double>(m.batch_rows));
  metric(s, "peregrine_busy_seconds_total", "counter", "Time the engine spent in steps.", m.busy_seconds);
  histogram(s, "peregrine_time_to_first_token_seconds", "Submission to first generated token.", m.ttft);
  histogram(s, "peregrine_inter_token_latency_seconds", "Time between consecutive tokens of one sequence.", m.token_latency);
  histogram(s, "peregrine_queue_wait_seconds", "Submission to getting a slot.", m.queue_wait);
  histogram(s, "peregrine_request_duration_seconds", "Submission to the end of the request.", m.request_duration);
  metric(s, "peregrine_prompt_tokens_per_second", "gauge", "Prompt tokens per second over the last 10 seconds.", m.prompt_tps);
  metric(s, "peregrine_generation_tokens_per_second", "gauge", "Generated tokens per second over the last 10 seconds.", m.generation_tps);
  metric(s, "peregrine_spec_steps_total", "counter", "Speculative verify steps (one per speculating sequence and step).",
         static_cast<double>(m.spec_rounds));
  metric(s, "peregrine_spec_draft_tokens_total", "counter", "Tokens drafted for speculative verification.", static_cast<double>(m.spec_drafted));
  metric(s, "peregrine_spec_accepted_tokens_total", "counter", "Drafted tokens the target accepted.", static_cast<double>(m.spec_accepted));
  metric(s, "peregrine_spec_mean_accept_length", "gauge", "Tokens emitted per verify step (accepted drafts + the bonus token), over all steps.",
         m.spec_mean_accept_len());
  metric(s, "peregrine_sequences_active", "gauge", "Sequences holding a slot.", m.active);
  metric(s, "peregrine_sequences_queued", "gauge", "Requests waiting for a slot.", m.queued);
  metric(s, "peregrine_slots", "gauge", "Parallel sequence slots.", m.slots);
  metric(s, "peregrine_kv_blocks_used", "gauge", "KV cache blocks in use.", m.kv_blocks_used);
  metric(s, "peregrine_kv_blocks_total", "gauge", "KV cache blocks in the pool.", m.kv_blocks_total);
  metric(s, "peregrine_kv_usage_ratio", "gauge", "Fraction of the KV cache in use.",
         m.kv_blocks_total > 0 ? static_cast<double>(m.kv_blocks_used) / m.kv_blocks_total : 0.0);
  if (const PrefixCache* pc = ctx.sched.prefix_cache()) {
    const PrefixStats ps = pc->stats();
    const auto d = [](uint64_t v) { return static_cast<double>(v); };
    metric(s, "peregrine_prefix_cache_lookups_total", "counter", "Prompts looked up in the prefix cache.", d(ps.lookups));
    metric(s, "peregrine_prefix_cache_ram_hit_tokens_total", "counter", "Prompt tokens served from RAM prefix blocks.", d(ps.ram_hit_tokens));
    metric(s, "peregrine_prefix_cache_disk_hit_tokens_total", "counter", "Prompt tokens served from disk block files.", d(ps.disk_hit_tokens));
    metric(s, "peregrine_prefix_cache_miss_tokens_total", "counter", "Prompt tokens the prefix cache could not serve (prefilled).",
           d(ps.prompt_tokens - ps.ram_hit_tokens - ps.disk_hit_tokens));
    metric(s, "peregrine_prefix_cache_partial_hit_tokens_total", "counter",
           "Of the hit tokens, cells copied from partly reused blocks (copy-on-write).", d(ps.partial_hit_tokens));
    metric(s, "peregrine_prefix_cache_evicted_blocks_total", "counter", "RAM prefix blocks evicted (LRU).", d(ps.evicted_blocks));
    metric(s, "peregrine_prefix_cache_ram_blocks", "gauge", "Blocks in the RAM prefix index.", d(ps.ram_blocks));
    metric(s, "peregrine_prefix_cache_ram_bytes", "gauge", "RAM budget in use (blocks only the index holds, snapshots).", d(ps.ram_bytes));
    metric(s, "peregrine_prefix_cache_disk_files", "gauge", "Block files in the disk tier.", d(ps.disk_files));
    metric(s, "peregrine_prefix_cache_disk_bytes", "gauge", "Bytes of block files in the disk tier.", d(ps.disk_bytes));
    metric(s, "peregrine_prefix_cache_disk_writes_total", "counter", "Block files written.", d(ps.disk_writes));
  }
  HttpOut o;
  o.content_type = "text/plain; version=0.0.4; charset=utf-8";
  o.body = std::move(s);
  return o;
}

HttpOut handle_tokenize(Context& ctx, const HttpIn& in) {
  const TokenizeRequest r = parse_tokenize(parse_body(in.body));
  const std::vector<int32_t> ids = ctx.tok.encode(r.content, r.add_special, r.parse_special);
  // Written as text, not built as a json tree: a tree costs a few hundred bytes per token (one
  // object, two keys and a string each), which made a 30 MB input peak at 7 GB.
  HttpOut o;
  std::string& out = o.body;
  out.reserve(ids.size() * (r.with_pieces ? 24 : 7) + 16);
  out += "{\"tokens\":[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    if (r.with_pieces) {
      out += "{\"id\":";
      out += std::to_string(ids[i]);
      out += ",\"piece\":";
      out += chat::detail::json_quote(ctx.tok.token_to_piece(ids[i], true));
      out += '}';
    } else {
      out += std::to_string(ids[i]);
    }
  }
  out += "]}";
  return o;
}

HttpOut handle_detokenize(Context& ctx, const HttpIn& in) {
  const std::vector<int32_t> ids = parse_detokenize(parse_body(in.body), ctx.tok.n_vocab());
  return HttpOut::json_reply(json{{"content", ctx.tok.detokenize(ids, true)}});
}

HttpOut handle_apply_template(Context& ctx, const HttpIn& in) {
  ChatRequest req = parse_openai_chat(parse_body(in.body));
  const RenderedPrompt rp = ctx.chat_prompt().render(req);
  return HttpOut::json_reply(json{{"prompt", rp.text}, {"n_tokens", rp.tokens.size()}});
}

}  // namespace pg::server
