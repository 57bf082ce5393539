// The official `@anthropic-ai/sdk` against peregrine serve: messages (streaming and not), stop
// sequences, count_tokens, tool use, thinking switch.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { sharedServer, stopSharedServers, postJson, parseSSE } from './helpers.mjs';

let stories, qwen3, storiesUrl, qwen3Url;
before(async () => {
  storiesUrl = await sharedServer('stories');
  qwen3Url = await sharedServer('qwen3');
  stories = new Anthropic({ baseURL: storiesUrl, apiKey: 'unused', maxRetries: 0 });
  qwen3 = new Anthropic({ baseURL: qwen3Url, apiKey: 'unused', maxRetries: 0 });
});
after(stopSharedServers);

const ask = [{ role: 'user', content: 'Tell me a story about a dog.' }];

test('messages: non-streaming shape and usage; count_tokens agrees', async () => {
  const m = await stories.messages.create({ model: 'claude-x', max_tokens: 10, temperature: 0, system: 'You tell stories.', messages: ask });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'claude-x');
  assert.match(m.id, /^msg_/);
  assert.ok(['max_tokens', 'end_turn'].includes(m.stop_reason));
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.usage.output_tokens <= 10 && m.usage.output_tokens > 0);
  const c = await stories.messages.countTokens({ model: 'claude-x', system: 'You tell stories.', messages: ask });
  assert.equal(c.input_tokens, m.usage.input_tokens);
});

test('messages: streaming events and the final message equal the non-streaming answer (greedy)', async () => {
  const args = { model: 'claude-x', max_tokens: 16, temperature: 0, messages: ask };
  const whole = await stories.messages.create(args);
  const types = [];
  const stream = stories.messages.stream(args);
  stream.on('streamEvent', (e) => types.push(e.type));
  const fin = await stream.finalMessage();
  assert.deepEqual(fin.content, whole.content);
  assert.equal(fin.stop_reason, whole.stop_reason);
  assert.equal(fin.usage.output_tokens, whole.usage.output_tokens);
  // input_tokens is the uncached part (Anthropic's count): the repeat has more of it cached.
  assert.equal(fin.usage.input_tokens + fin.usage.cache_read_input_tokens, whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.ok(types.includes('content_block_delta'));
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  // ping events are on the wire too (the SDK drops them).
  const raw = await fetch(storiesUrl + '/v1/messages', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...args, stream: true }),
  });
  assert.equal(raw.headers.get('content-type'), 'text/event-stream');
  const evs = parseSSE(await raw.text());
  assert.ok(evs.some((e) => e.event === 'ping'));
  for (const e of evs) assert.equal(e.event, e.data.type);
});

test('messages: stop_sequences', async () => {
  const args = { model: 'claude-x', max_tokens: 60, temperature: 0, messages: ask };
  const base = (await stories.messages.create(args)).content[0].text;
  assert.ok(base.length > 30, base);
  const stop = base.slice(12, 16);
  const m = await stories.messages.create({ ...args, stop_sequences: [stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content[0].text, base.slice(0, base.indexOf(stop)).trim());
});

test('messages: tool_use and tool_result history, system blocks', async () => {
  const m = await stories.messages.create({
    model: 'claude-x', max_tokens: 5,
    system: [{ type: 'text', text: 'You are helpful.', cache_control: { type: 'ephemeral' } }],
    tools: [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' }, { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: 'sunny' }, { type: 'text', text: 'And tomorrow?' }] },
    ],
  });
  assert.equal(m.type, 'message');
  assert.ok(m.usage.input_tokens > 40);
});

test('messages: tool_choice forces a tool_use block (qwen3 / Hermes), streamed with input_json_delta', async () => {
  const args = {
    model: 'claude-x', max_tokens: 12, temperature: 0,
    tools: [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
    tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
  };
  const m = await qwen3.messages.create(args);
  const tu = m.content.find((b) => b.type === 'tool_use');
  assert.ok(tu, JSON.stringify(m.content));
  assert.equal(tu.name, 'get_weather');
  assert.match(tu.id, /^toolu_/);
  assert.equal(typeof tu.input, 'object');
  const types = [];
  const stream = qwen3.messages.stream(args);
  stream.on('streamEvent', (e) => types.push(e.type === 'content_block_delta' ? e.delta.type : e.type));
  const fin = await stream.finalMessage();
  const ftu = fin.content.find((b) => b.type === 'tool_use');
  assert.equal(ftu.name, 'get_weather');
  assert.deepEqual(ftu.input, tu.input);
  assert.ok(types.includes('input_json_delta'), types.join(','));
  assert.equal(fin.stop_reason, m.stop_reason);
});

test('messages: thinking switch reaches the template', async () => {
  const base = { model: 'claude-x', messages: [{ role: 'user', content: 'hi' }] };
  const on = await postJson(qwen3Url + '/v1/messages/count_tokens', { ...base, thinking: { type: 'enabled', budget_tokens: 1024 } });
  const off = await postJson(qwen3Url + '/v1/messages/count_tokens', { ...base, thinking: { type: 'disabled' } });
  assert.equal(on.status, 200);
  assert.equal(off.status, 200);
  // Qwen3's template writes an empty <think></think> block when thinking is off.
  assert.ok(off.json.input_tokens > on.json.input_tokens, `${off.json.input_tokens} vs ${on.json.input_tokens}`);
  const m = await qwen3.messages.create({ ...base, max_tokens: 4, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(m.type, 'message');
});
