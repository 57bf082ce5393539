// The prefix cache as clients see it: a repeated long prompt is served from cached blocks (same
// output), and every API reports it — OpenAI cached_tokens (chat, completions, Responses), Anthropic
// cache_read_input_tokens, llama-server timings.cache_n — with /metrics and /props agreeing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sharedServer, stopSharedServers, startServer, storiesModel, chatmlTemplate, postJson, getText, metric } from './helpers.mjs';

let base;
before(async () => {
  base = await sharedServer('stories');
});
after(stopSharedServers);

const story = Array.from({ length: 5 }, (_, i) =>
  `Once upon a time, in a small town number ${i}, there lived a girl named Lily who loved to play with her red ball in the park.`).join(' ');

test('completions: a repeated long prompt hits the cache and answers the same', async () => {
  const body = { prompt: story, max_tokens: 8, temperature: 0 };
  let m1Cached = '';
  const m1Text = () => m1Cached;
  const m0 = (await getText(base + '/metrics')).text;
  const a = await postJson(base + '/v1/completions', body);
  const b = await postJson(base + '/v1/completions', body);
  assert.equal(a.status, 200);
  assert.equal(b.status, 200);
  assert.equal(b.json.choices[0].text, a.json.choices[0].text);
  m1Cached = (await getText(base + '/metrics')).text;
  const n = b.json.usage.prompt_tokens;
  const cached = b.json.usage.prompt_tokens_details.cached_tokens;
  assert.ok(n > 128, `prompt of ${n} tokens`);
  // Partial blocks: the repeat reuses all but its last token (the first request's last partly filled
  // block is copied), so only the last prompt row is computed.
  assert.equal(cached, n - 1, `cached ${cached} of ${n}`);
  assert.ok(metric(m1Text(), 'peregrine_prefix_cache_partial_hit_tokens_total') >= cached % 64);
  assert.equal(b.json.timings.cache_n, cached);
  assert.equal(b.json.timings.prompt_n, n - cached);
  const m1 = m1Text();
  assert.ok(metric(m1, 'peregrine_prefix_cache_ram_hit_tokens_total') - metric(m0, 'peregrine_prefix_cache_ram_hit_tokens_total') >= cached);
  assert.ok(metric(m1, 'peregrine_prefix_cache_lookups_total') - metric(m0, 'peregrine_prefix_cache_lookups_total') >= 2);
  assert.equal(metric(m1, 'peregrine_prefix_cache_disk_hit_tokens_total'), 0);
});

test('chat, Responses and Anthropic report cached prompt tokens', async () => {
  const messages = [{ role: 'system', content: story }, { role: 'user', content: 'Tell me more.' }];
  await postJson(base + '/v1/chat/completions', { messages, max_tokens: 4, temperature: 0 });
  const c = await postJson(base + '/v1/chat/completions', { messages, max_tokens: 4, temperature: 0 });
  assert.equal(c.status, 200);
  assert.ok(c.json.usage.prompt_tokens_details.cached_tokens >= 64);

  const input = [{ role: 'system', content: story }, { role: 'user', content: 'And then?' }];
  await postJson(base + '/v1/responses', { input, max_output_tokens: 4, temperature: 0 });
  const r = await postJson(base + '/v1/responses', { input, max_output_tokens: 4, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.ok(r.json.usage.input_tokens_details.cached_tokens >= 64);

  const msg = { model: 'x', system: story, messages: [{ role: 'user', content: 'What happened next?' }], max_tokens: 4, temperature: 0 };
  await postJson(base + '/v1/messages', msg);
  const an = await postJson(base + '/v1/messages', msg);
  assert.equal(an.status, 200, an.text);
  const u = an.json.usage;
  assert.ok(u.cache_read_input_tokens >= 64);
  assert.equal(u.cache_creation_input_tokens, 0);
  assert.ok(u.input_tokens > 0 && u.input_tokens < 64 + 16, 'input_tokens is the uncached part');
});

test('chat: the next turn reuses the previous turn, its answer included', async () => {
  const m1 = [{ role: 'system', content: story }, { role: 'user', content: 'Who is Lily?' }];
  const t1 = await postJson(base + '/v1/chat/completions', { messages: m1, max_tokens: 12, temperature: 0 });
  assert.equal(t1.status, 200, t1.text);
  const answer = t1.json.choices[0].message.content;
  const m2 = [...m1, { role: 'assistant', content: answer }, { role: 'user', content: 'And her ball?' }];
  const t2 = await postJson(base + '/v1/chat/completions', { messages: m2, max_tokens: 4, temperature: 0 });
  assert.equal(t2.status, 200, t2.text);
  const cached = t2.json.usage.prompt_tokens_details.cached_tokens;
  // Everything turn 1 ran: its prompt and its answer but the last sampled token (never run). The chat
  // template re-renders this plain-text answer as the same tokens; whole blocks would stop at 320.
  const u1 = t1.json.usage;
  assert.equal(cached, u1.prompt_tokens + u1.completion_tokens - 1, `cached ${cached}, turn 1 ${u1.prompt_tokens} + ${u1.completion_tokens}`);
});

test('props describe the prefix cache', async () => {
  const p = JSON.parse((await getText(base + '/props')).text);
  assert.equal(p.prefix_cache.enabled, true);
  assert.ok(p.prefix_cache.ram_budget_blocks > 0);
  assert.equal(p.prefix_cache.block_size, 64);
  assert.equal(p.prefix_cache.partial_blocks, true);
  assert.equal(p.prefix_cache.disk_dir, null);
  assert.equal(p.prefix_cache.disk_enabled, false);
});

test('disk tier: a restarted server repeats a prompt from its block file, the partial tail included', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'peregrine-e2e-disk-'));
  const args = ['-m', storiesModel(), '--chat-template-file', chatmlTemplate(), '-np', '1', '-c', '512', '--kv-cache-dir', dir];
  const body = { prompt: story, max_tokens: 8, temperature: 0 };
  try {
    let s = await startServer(args);
    const a = await postJson(s.url + '/v1/completions', body);
    assert.equal(a.status, 200, a.text);
    await s.stop();  // the writer thread finishes its queue before the process exits
    s = await startServer(args);
    try {
      const b = await postJson(s.url + '/v1/completions', body);
      assert.equal(b.status, 200, b.text);
      assert.equal(b.json.choices[0].text, a.json.choices[0].text, 'the same greedy answer');
      const n = b.json.usage.prompt_tokens, cached = b.json.usage.prompt_tokens_details.cached_tokens;
      assert.ok((n - 1) % 64 !== 0 && n > 128, `prompt of ${n} tokens`);
      // As a RAM hit: all but the last prompt token, the last partly filled block from the file's tail.
      assert.equal(cached, n - 1, `cached ${cached} of ${n}`);
      const m = (await getText(s.url + '/metrics')).text;
      assert.equal(metric(m, 'peregrine_prefix_cache_disk_hit_tokens_total'), cached);
      assert.equal(metric(m, 'peregrine_prefix_cache_partial_hit_tokens_total'), cached % 64);
    } finally {
      await s.stop();
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
