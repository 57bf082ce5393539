// The official `openai` SDK against peregrine serve: chat completions (streaming and not), stop
// sequences, logprobs, usage, legacy completions, models, the Responses API, and tools.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { sharedServer, stopSharedServers, postJson } from './helpers.mjs';

let stories, qwen3;
const NO_EOS = { 2: -100 }; // stories260K's </s>: banned where a test needs the full length

before(async () => {
  stories = new OpenAI({ baseURL: (await sharedServer('stories')) + '/v1', apiKey: 'unused', maxRetries: 0 });
  qwen3 = new OpenAI({ baseURL: (await sharedServer('qwen3')) + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(stopSharedServers);

const story = [{ role: 'user', content: 'Tell me a story about a cat.' }];

async function collectChat(stream) {
  let content = '', role = null, finish = null, usage = null, chunks = 0, timings = null;
  const calls = [];
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    if (ch.timings) timings = ch.timings;
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) content += c.delta.content;
    for (const t of c.delta.tool_calls ?? []) {
      if (!calls[t.index]) calls[t.index] = { id: t.id, name: t.function?.name, arguments: '' };
      calls[t.index].arguments += t.function?.arguments ?? '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, role, finish, usage, chunks, calls, timings };
}

test('chat completion: non-streaming shape, usage and timings', async () => {
  const r = await stories.chat.completions.create({ model: 'x', messages: story, max_tokens: 12, temperature: 0, logit_bias: NO_EOS });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
  assert.equal(r.timings.predicted_n, 12);
  assert.ok(r.timings.prompt_ms > 0 && r.timings.predicted_per_second > 0);
});

test('chat completion: streaming gives the same text and usage as non-streaming (greedy)', async () => {
  const args = { model: 'x', messages: story, max_tokens: 24, temperature: 0, logit_bias: NO_EOS };
  const whole = await stories.chat.completions.create(args);
  const s = await collectChat(await stories.chat.completions.create({ ...args, stream: true, stream_options: { include_usage: true } }));
  assert.equal(s.role, 'assistant');
  assert.equal(s.content, whole.choices[0].message.content);
  assert.equal(s.finish, 'length');
  assert.deepEqual(s.usage, whole.usage);
  assert.ok(s.chunks > 3);
  assert.equal(s.timings.predicted_n, 24);
  // Without include_usage no chunk carries usage.
  const t = await collectChat(await stories.chat.completions.create({ ...args, stream: true }));
  assert.equal(t.usage, null);
  assert.equal(t.content, s.content);
});

test('chat completion: stop sequences cut the text and are never emitted', async () => {
  const args = { model: 'x', messages: story, max_tokens: 60, temperature: 0, logit_bias: NO_EOS };
  const base = (await stories.chat.completions.create(args)).choices[0].message.content;
  assert.ok(base.length > 30, base);
  const stop = base.slice(15, 19);
  const want = base.slice(0, base.indexOf(stop)).trim();
  const r = await stories.chat.completions.create({ ...args, stop: ['NEVER', stop] });
  assert.equal(r.choices[0].message.content, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await collectChat(await stories.chat.completions.create({ ...args, stop, stream: true }));
  assert.equal(s.content, want);
  assert.equal(s.finish, 'stop');
});

test('chat completion: logprobs and top_logprobs', async () => {
  const r = await stories.chat.completions.create({
    model: 'x', messages: story, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3, logit_bias: NO_EOS,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 6);
  for (const e of lp) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    // Greedy: the chosen token is the most likely one.
    assert.equal(e.logprob, e.top_logprobs[0].logprob);
  }
  const s = await stories.chat.completions.create({
    model: 'x', messages: story, max_tokens: 6, temperature: 0, logprobs: true, logit_bias: NO_EOS, stream: true,
  });
  let n = 0;
  for await (const ch of s) n += ch.choices[0]?.logprobs?.content?.length ?? 0;
  assert.equal(n, 6);
});

test('chat completion: a seed makes sampling reproducible', async () => {
  const args = { model: 'x', messages: story, max_tokens: 16, temperature: 1.0, top_k: 0, top_p: 1, seed: 42 };
  const a = await stories.chat.completions.create(args);
  const b = await stories.chat.completions.create(args);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('completions: string and token-id prompts, streaming, echo', async () => {
  const args = { model: 'x', prompt: 'Once upon a time', max_tokens: 10, temperature: 0, logit_bias: NO_EOS };
  const r = await stories.completions.create(args);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 10);
  const text = r.choices[0].text;
  assert.ok(text.length > 0);
  let streamed = '';
  let finish = null;
  for await (const ch of await stories.completions.create({ ...args, stream: true })) {
    if (ch.choices[0]) {
      streamed += ch.choices[0].text;
      finish = ch.choices[0].finish_reason ?? finish;
    }
  }
  assert.equal(streamed, text);
  assert.equal(finish, r.choices[0].finish_reason);
  const base = (await sharedServer('stories'));
  const ids = (await postJson(base + '/tokenize', { content: 'Once upon a time', add_special: true })).json.tokens;
  const byIds = await stories.completions.create({ ...args, prompt: ids });
  assert.equal(byIds.choices[0].text, text);
  assert.equal(byIds.usage.prompt_tokens, r.usage.prompt_tokens);
  const echo = await stories.completions.create({ ...args, echo: true });
  assert.equal(echo.choices[0].text, 'Once upon a time' + text);
});

test('models', async () => {
  const list = await stories.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, ['stories260K.gguf']);
  const m = await stories.models.retrieve('stories260K.gguf');
  assert.equal(m.id, 'stories260K.gguf');
});

test('responses: non-streaming shape and usage', async () => {
  const r = await stories.responses.create({ model: 'x', instructions: 'Be nice.', input: 'Tell me a story.', max_output_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].content[0].type, 'output_text');
  assert.equal(r.output_text, r.output[0].content[0].text);
  assert.ok(r.usage.input_tokens > 5);
  assert.ok(r.usage.output_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

// Usage without the cached-token counts: how much of a repeated prompt the prefix cache serves
// depends on what ran before (partial blocks reuse all but the last token of a repeat).
const withoutCached = (u) => JSON.parse(JSON.stringify(u, (k, v) => (k === 'cached_tokens' ? undefined : v)));

test('responses: streaming events in order, text equals the deltas', async () => {
  const args = { model: 'x', input: [{ role: 'user', content: [{ type: 'input_text', text: 'Tell me a story.' }] }], max_output_tokens: 12, temperature: 0 };
  const whole = await stories.responses.create(args);
  const types = [];
  let text = '', seq = -1, final = null;
  for await (const ev of await stories.responses.create({ ...args, stream: true })) {
    types.push(ev.type);
    assert.ok(ev.sequence_number > seq);
    seq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types[2], 'response.output_item.added');
  assert.equal(types[3], 'response.content_part.added');
  assert.ok(types.includes('response.output_text.delta'));
  const tail = types.slice(-4);
  assert.deepEqual(tail.slice(0, 3), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done']);
  assert.equal(text, whole.output_text);
  assert.equal(final.output[0].content[0].text, text);
  assert.deepEqual(withoutCached(final.usage), withoutCached(whole.usage));
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

test('tools are accepted and rendered into the prompt', async () => {
  for (const client of [stories, qwen3]) {
    const plain = await client.chat.completions.create({ model: 'x', messages: story, max_tokens: 1 });
    const withTools = await client.chat.completions.create({ model: 'x', messages: story, max_tokens: 1, tools: [weatherTool], tool_choice: 'auto' });
    assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 10);
    const none = await client.chat.completions.create({ model: 'x', messages: story, max_tokens: 1, tools: [weatherTool], tool_choice: 'none' });
    assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);
  }
  const base = await sharedServer('qwen3');
  const t = await postJson(base + '/apply-template', { messages: story, tools: [weatherTool] });
  assert.equal(t.status, 200);
  assert.match(t.json.prompt, /<tools>[\s\S]*get_weather[\s\S]*<\/tools>/);
  // A tool-call history and tool results render too.
  const history = [
    ...story,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21°C' },
  ];
  const h = await postJson(base + '/apply-template', { messages: history, tools: [weatherTool] });
  assert.match(h.json.prompt, /<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n<\/tool_call>/);
  assert.match(h.json.prompt, /<tool_response>\nsunny, 21°C\n<\/tool_response>/);
  const r = await qwen3.chat.completions.create({ model: 'x', messages: history, tools: [weatherTool], max_tokens: 4 });
  assert.equal(r.usage.prompt_tokens, h.json.n_tokens);
});

test('tool_choice naming a function yields a tool call (qwen3 / Hermes format), streamed as deltas', async () => {
  const args = {
    model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [weatherTool],
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 12, temperature: 0,
  };
  const r = await qwen3.chat.completions.create(args);
  const msg = r.choices[0].message;
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].type, 'function');
  assert.equal(msg.tool_calls[0].function.name, 'get_weather');
  assert.match(msg.tool_calls[0].id, /^call_/);
  assert.equal(typeof JSON.parse(msg.tool_calls[0].function.arguments), 'object');
  const s = await collectChat(await qwen3.chat.completions.create({ ...args, stream: true }));
  assert.equal(s.calls.length, 1);
  assert.equal(s.calls[0].name, 'get_weather');
  assert.match(s.calls[0].id, /^call_/);
  assert.equal(s.calls[0].arguments, msg.tool_calls[0].function.arguments);
  assert.equal(s.finish, r.choices[0].finish_reason);
});

test('responses: a named function tool gives a function_call item with argument deltas', async () => {
  const args = {
    model: 'x', input: 'Weather in Paris?', max_output_tokens: 12, temperature: 0,
    tools: [{ type: 'function', name: 'get_weather', parameters: weatherTool.function.parameters }, { type: 'web_search' }],
    tool_choice: { type: 'function', name: 'get_weather' },
  };
  const r = await qwen3.responses.create(args);
  const call = r.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  assert.match(call.call_id, /^call_/);
  const types = [];
  let args_text = '', done = null;
  for await (const ev of await qwen3.responses.create({ ...args, stream: true })) {
    types.push(ev.type);
    if (ev.type === 'response.function_call_arguments.delta') args_text += ev.delta;
    if (ev.type === 'response.function_call_arguments.done') done = ev.arguments;
  }
  assert.ok(types.includes('response.output_item.added'));
  assert.ok(types.includes('response.function_call_arguments.delta'));
  assert.equal(done, args_text);
  assert.equal(done, call.arguments);
  // The tool result goes back as function_call_output and is accepted.
  const next = await qwen3.responses.create({
    model: 'x', max_output_tokens: 4, tools: args.tools,
    input: [
      { role: 'user', content: 'Weather in Paris?' },
      { type: 'function_call', call_id: call.call_id, name: 'get_weather', arguments: call.arguments },
      { type: 'function_call_output', call_id: call.call_id, output: 'sunny' },
    ],
  });
  assert.ok(next.usage.input_tokens > r.usage.input_tokens);
});
