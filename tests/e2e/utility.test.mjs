// /health, /props, /metrics, /tokenize, /detokenize.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { sharedServer, stopSharedServers, postJson, getText, metric } from './helpers.mjs';

let base;
before(async () => {
  base = await sharedServer('stories');
});
after(stopSharedServers);

test('health and props', async () => {
  const h = await getText(base + '/health');
  assert.equal(h.status, 200);
  assert.deepEqual(JSON.parse(h.text), { status: 'ok' });
  const p = JSON.parse((await getText(base + '/props')).text);
  assert.equal(p.model, 'stories260K.gguf');
  assert.equal(p.n_ctx, 512);
  assert.equal(p.total_slots, 4);
  assert.equal(p.n_vocab, 512);
  assert.match(p.chat_template, /im_start/);
  assert.equal(p.chat_format, 'hermes');
  assert.equal(typeof p.build_info, 'string');
  assert.equal(p.runtime.backend, 'cpu');
  assert.equal(p.runtime.api_key_required, false);
  assert.equal(p.runtime.host, '127.0.0.1');
  assert.equal(typeof p.default_generation_settings.params.temperature, 'number');
});

test('metrics: Prometheus text that counts requests and tokens', async () => {
  const before_ = (await getText(base + '/metrics')).text;
  const r = await postJson(base + '/v1/completions', { prompt: 'Once upon a time', max_tokens: 7, temperature: 0, logit_bias: { 2: -100 } });
  assert.equal(r.status, 200);
  const m = await getText(base + '/metrics');
  assert.match(m.headers.get('content-type'), /^text\/plain/);
  const after_ = m.text;
  assert.equal(metric(after_, 'peregrine_requests_total') - metric(before_, 'peregrine_requests_total'), 1);
  assert.equal(metric(after_, 'peregrine_generated_tokens_total') - metric(before_, 'peregrine_generated_tokens_total'), 7);
  assert.equal(
    // prefilled tokens: the prompt less what the prefix cache served
    metric(after_, 'peregrine_prompt_tokens_total') - metric(before_, 'peregrine_prompt_tokens_total'),
    r.json.usage.prompt_tokens - (r.json.usage.prompt_tokens_details?.cached_tokens ?? 0));
  assert.equal(metric(after_, 'peregrine_time_to_first_token_seconds_count') - metric(before_, 'peregrine_time_to_first_token_seconds_count'), 1);
  assert.ok(metric(after_, 'peregrine_inter_token_latency_seconds_count') >= 6);
  assert.ok(metric(after_, 'peregrine_time_to_first_token_seconds_bucket', '{le="+Inf"}') >= 1);
  for (const name of ['peregrine_sequences_active', 'peregrine_sequences_queued', 'peregrine_kv_blocks_used', 'peregrine_kv_blocks_total',
    'peregrine_generation_tokens_per_second', 'peregrine_prompt_tokens_per_second', 'peregrine_kv_usage_ratio'])
    assert.notEqual(metric(after_, name), undefined, name);
  assert.ok(metric(after_, 'peregrine_kv_blocks_total') > 0);
  assert.ok(metric(after_, 'peregrine_generation_tokens_per_second') > 0);
  // Every sample line is "name{labels} number".
  for (const line of after_.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    assert.match(line, /^[a-z_]+(\{[a-z_]+="[^"]*"\})? [-+0-9.eE]+$/, line);
  }
});

test('tokenize and detokenize round trip', async () => {
  const t = await postJson(base + '/tokenize', { content: 'Once upon a time' });
  assert.equal(t.status, 200);
  assert.ok(t.json.tokens.length >= 3);
  const withBos = await postJson(base + '/tokenize', { content: 'Once upon a time', add_special: true });
  assert.equal(withBos.json.tokens[0], 1);
  assert.deepEqual(withBos.json.tokens.slice(1), t.json.tokens);
  const pieces = await postJson(base + '/tokenize', { content: 'Once upon', with_pieces: true });
  assert.equal(pieces.json.tokens.map((p) => p.piece).join('').trim(), 'Once upon');
  const d = await postJson(base + '/detokenize', { tokens: t.json.tokens });
  assert.equal(d.json.content, 'Once upon a time');
});
