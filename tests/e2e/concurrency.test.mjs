// Continuous batching seen from clients: concurrent streams give exactly the one-at-a-time outputs,
// a client that disconnects frees its slot (visible in /metrics), requests beyond -np wait their turn.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, storiesModel, chatmlTemplate, getText, metric, sleep } from './helpers.mjs';

const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

async function server(args) {
  const s = await startServer(['-m', storiesModel(), '--chat-template-file', chatmlTemplate(), ...args]);
  servers.push(s);
  return { s, client: new OpenAI({ baseURL: s.url + '/v1', apiKey: 'unused', maxRetries: 0 }) };
}

const prompts = [
  'Tell me a story about a cat.', 'What did the dog do?', 'Lily went to the park.', 'Tim had a big red ball.',
  'The sun was hot.', 'Once there was a frog.', 'Sue liked to bake.', 'Ben saw a bird in the tree.',
];

async function streamText(client, content, max_tokens) {
  const s = await client.chat.completions.create({
    model: 'x', messages: [{ role: 'user', content }], max_tokens, temperature: 0, logit_bias: { 2: -100 },
    stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null, finish = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    if (ch.choices[0]?.delta?.content) text += ch.choices[0].delta.content;
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { text, usage, finish };
}

// Counters are updated at the end of the engine step that emitted the last token, which can be just
// after the client has read its final event: wait (briefly) until the step has been accounted.
async function metricsAfter(url, name, value) {
  let text = '';
  for (let i = 0; i < 200; i++) {
    text = (await getText(url + '/metrics')).text;
    if (metric(text, name) >= value) return text;
    await new Promise((r) => setTimeout(r, 10));
  }
  return text;
}

// Usage without the cached-token counts: how much of a repeated prompt the prefix cache serves
// depends on what ran before (partial blocks reuse all but the last token of a repeat).
const withoutCached = (u) => JSON.parse(JSON.stringify(u, (k, v) => (k === 'cached_tokens' ? undefined : v)));

test('8 concurrent streams equal the same requests run one at a time (greedy)', async () => {
  const { s, client } = await server(['-np', '4', '-c', '512']);
  const sequential = [];
  for (const p of prompts) sequential.push(await streamText(client, p, 150));
  const m1 = await metricsAfter(s.url, 'peregrine_generated_tokens_total', 8 * 150);
  const concurrent = await Promise.all(prompts.map((p) => streamText(client, p, 150)));
  for (let i = 0; i < prompts.length; i++) {
    assert.equal(concurrent[i].text, sequential[i].text, prompts[i]);
    assert.deepEqual(withoutCached(concurrent[i].usage), withoutCached(sequential[i].usage), prompts[i]);
    assert.equal(concurrent[i].finish, sequential[i].finish);
  }
  const m = await metricsAfter(s.url, 'peregrine_generated_tokens_total', 16 * 150);
  assert.equal(metric(m, 'peregrine_requests_total'), 16);
  assert.equal(sequential[0].usage.completion_tokens, 150);
  // Run together, the 8 × 150 tokens took far fewer steps than tokens: steps carried several sequences.
  const steps = metric(m, 'peregrine_steps_total') - metric(m1, 'peregrine_steps_total');
  const tokens = metric(m, 'peregrine_generated_tokens_total') - metric(m1, 'peregrine_generated_tokens_total');
  assert.equal(tokens, 8 * 150);
  assert.ok(steps < tokens * 0.75, `${steps} steps for ${tokens} tokens`);
  assert.equal(metric(m, 'peregrine_sequences_active'), 0);
  assert.equal(metric(m, 'peregrine_kv_blocks_used'), 0);
});

test('a client that disconnects frees its slot', async () => {
  const { s, client } = await server(['-np', '1', '-c', '16384']);
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model: 'x', messages: [{ role: 'user', content: 'Tell me a long story.' }], max_tokens: 16000, logit_bias: { 2: -100 }, stream: true },
    { signal: ac.signal },
  );
  let chunks = 0;
  try {
    for await (const ch of stream) {
      if (ch.choices[0]?.delta?.content) chunks++;
      if (chunks === 5) ac.abort();
    }
  } catch (e) {
    assert.ok(ac.signal.aborted, String(e));
  }
  let m;
  for (let i = 0; i < 100; i++) {
    m = (await getText(s.url + '/metrics')).text;
    if (metric(m, 'peregrine_requests_finished_total', '{reason="cancelled"}') === 1 && metric(m, 'peregrine_sequences_active') === 0) break;
    await sleep(20);
  }
  assert.equal(metric(m, 'peregrine_requests_finished_total', '{reason="cancelled"}'), 1, m);
  assert.equal(metric(m, 'peregrine_sequences_active'), 0);
  assert.equal(metric(m, 'peregrine_kv_blocks_used'), 0);
  // The only slot is free again: a new request is served at once.
  const t0 = Date.now();
  const r = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 });
  assert.ok(r.choices[0].message.content !== undefined);
  assert.ok(Date.now() - t0 < 5000);

  // The same for a non-streaming request whose client gives up.
  const ac2 = new AbortController();
  const p = client.chat.completions.create(
    { model: 'x', messages: [{ role: 'user', content: 'Tell me a long story.' }], max_tokens: 16000, logit_bias: { 2: -100 } },
    { signal: ac2.signal },
  );
  await sleep(300);
  ac2.abort();
  await assert.rejects(p);
  for (let i = 0; i < 100; i++) {
    m = (await getText(s.url + '/metrics')).text;
    if (metric(m, 'peregrine_requests_finished_total', '{reason="cancelled"}') === 2) break;
    await sleep(20);
  }
  assert.equal(metric(m, 'peregrine_requests_finished_total', '{reason="cancelled"}'), 2, m);
  assert.equal(metric(m, 'peregrine_sequences_active'), 0);
});

test('requests beyond the slots queue and all finish', async () => {
  const { s, client } = await server(['-np', '1', '-c', '512']);
  const rs = await Promise.all(prompts.slice(0, 4).map((p) => streamText(client, p, 20)));
  for (const r of rs) assert.ok(r.usage.completion_tokens > 0);
  const m = (await getText(s.url + '/metrics')).text;
  assert.equal(metric(m, 'peregrine_requests_total'), 4);
  assert.equal(metric(m, 'peregrine_queue_wait_seconds_count'), 4);
  assert.equal(metric(m, 'peregrine_sequences_queued'), 0);
});
