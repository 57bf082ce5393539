// The bundled demo model (models/, the default when no -m is given) writes real reasoning in
// <think> blocks and real Hermes-style tool calls, so the parsed output paths of every API are
// exercised end to end: reasoning_content deltas, automatic tool calls, Anthropic thinking and
// tool_use blocks, Responses reasoning and function_call items.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { sharedServer, stopSharedServers } from './helpers.mjs';

let oa, an;
before(async () => {
  const url = await sharedServer('demo');
  oa = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0 });
  an = new Anthropic({ baseURL: url, apiKey: 'unused', maxRetries: 0 });
});
after(stopSharedServers);

const sum = [{ role: 'user', content: 'What is 123 + 456?' }];
const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const askWeather = [{ role: 'user', content: 'What is the weather in Lyon?' }];

test('reasoning_content is split from the answer, streamed first', async () => {
  const r = await oa.chat.completions.create({ model: 'x', messages: sum, max_tokens: 300, temperature: 0 });
  const m = r.choices[0].message;
  assert.ok(m.reasoning_content?.length > 0, JSON.stringify(m));
  assert.ok(m.content.length > 0);
  assert.ok(!m.content.includes('<think>') && !m.content.includes('</think>'));
  assert.equal(r.choices[0].finish_reason, 'stop');
  let reasoning = '', content = '', sawContentBeforeReasoning = false;
  for await (const ch of await oa.chat.completions.create({ model: 'x', messages: sum, max_tokens: 300, temperature: 0, stream: true })) {
    const d = ch.choices[0]?.delta ?? {};
    if (d.reasoning_content) {
      if (content) sawContentBeforeReasoning = true;
      reasoning += d.reasoning_content;
    }
    if (d.content) content += d.content;
  }
  assert.equal(reasoning, m.reasoning_content);
  assert.equal(content, m.content);
  assert.ok(!sawContentBeforeReasoning);
});

test('automatic tool calls: parsed, streamed as argument deltas, finish_reason tool_calls', async () => {
  const args = { model: 'x', messages: askWeather, tools: [weather], max_tokens: 200, temperature: 0 };
  const r = await oa.chat.completions.create(args);
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  const a = JSON.parse(m.tool_calls[0].function.arguments);
  assert.equal(typeof a.city, 'string');
  // Output the reader has not collected yet is merged into one event (engine/request.h), and a speculative
  // step emits several tokens at once, so on a loaded machine a short call can arrive in one delta: every
  // stream must carry the same call, and at least one of three must show it arriving in pieces.
  let most = 0;
  for (let attempt = 0; attempt < 3 && most <= 1; attempt++) {
    const calls = [];
    let pieces = 0, finish = null;
    for await (const ch of await oa.chat.completions.create({ ...args, stream: true })) {
      const c = ch.choices[0];
      if (!c) continue;
      for (const t of c.delta.tool_calls ?? []) {
        if (t.id) calls[t.index] = { id: t.id, name: t.function.name, arguments: '' };
        calls[t.index].arguments += t.function.arguments ?? '';
        pieces++;
      }
      finish = c.finish_reason ?? finish;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, 'get_weather');
    assert.deepEqual(JSON.parse(calls[0].arguments), a);
    most = Math.max(most, pieces);
  }
  assert.ok(most > 1, 'arguments arrive in several deltas');
  // tool_choice "none": no call is parsed, and no tools are shown to the model.
  const none = await oa.chat.completions.create({ ...args, tool_choice: 'none' });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  // The result goes back and the model answers from it.
  const follow = await oa.chat.completions.create({
    ...args,
    messages: [...askWeather, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"temperature": 21, "sky": "sunny"}' }],
  });
  assert.equal(follow.choices[0].finish_reason, 'stop');
  assert.ok(follow.choices[0].message.content.length > 0);
});

test('Anthropic: thinking and tool_use blocks, streamed', async () => {
  const t = await an.messages.create({ model: 'claude-x', max_tokens: 300, temperature: 0, messages: sum });
  assert.equal(t.content[0].type, 'thinking');
  assert.ok(t.content[0].thinking.length > 0);
  assert.equal(t.content[1].type, 'text');
  assert.equal(t.stop_reason, 'end_turn');
  const deltas = [];
  const s = an.messages.stream({ model: 'claude-x', max_tokens: 300, temperature: 0, messages: sum });
  s.on('streamEvent', (e) => e.type === 'content_block_delta' && deltas.push(e.delta.type));
  const fin = await s.finalMessage();
  assert.equal(fin.content[0].thinking, t.content[0].thinking);
  assert.equal(fin.content[1].text, t.content[1].text);
  assert.ok(deltas.indexOf('signature_delta') > deltas.indexOf('thinking_delta'));
  assert.ok(deltas.lastIndexOf('thinking_delta') < deltas.indexOf('text_delta'));

  const tools = [{ name: 'get_weather', description: 'Get the current weather of a city', input_schema: weather.function.parameters }];
  const u = await an.messages.create({ model: 'claude-x', max_tokens: 200, temperature: 0, tools, messages: askWeather });
  assert.equal(u.stop_reason, 'tool_use');
  const tu = u.content.find((b) => b.type === 'tool_use');
  assert.equal(tu.name, 'get_weather');
  assert.equal(typeof tu.input.city, 'string');
  const s2 = an.messages.stream({ model: 'claude-x', max_tokens: 200, temperature: 0, tools, messages: askWeather });
  const f2 = await s2.finalMessage();
  assert.deepEqual(f2.content.find((b) => b.type === 'tool_use').input, tu.input);
  assert.equal(f2.stop_reason, 'tool_use');
  const answer = await an.messages.create({
    model: 'claude-x', max_tokens: 200, temperature: 0, tools,
    messages: [...askWeather, { role: 'assistant', content: u.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: 'sunny, 21 degrees' }] }],
  });
  assert.equal(answer.stop_reason, 'end_turn');
});

test('Responses: reasoning item, message, function_call', async () => {
  const r = await oa.responses.create({ model: 'x', input: 'What is 123 + 456?', max_output_tokens: 300, temperature: 0 });
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.ok(r.output[0].content[0].text.length > 0);
  assert.ok(r.output_text.length > 0);
  const tools = [{ type: 'function', name: 'get_weather', description: 'Get the current weather of a city', parameters: weather.function.parameters }];
  const types = [];
  let final = null;
  for await (const ev of await oa.responses.create({ model: 'x', input: 'What is the weather in Lyon?', tools, max_output_tokens: 200, temperature: 0, stream: true })) {
    types.push(ev.type);
    if (ev.type === 'response.completed') final = ev.response;
  }
  const call = final.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.arguments).city, 'string');
  assert.ok(types.includes('response.function_call_arguments.delta'));
  assert.ok(types.includes('response.function_call_arguments.done'));
});
