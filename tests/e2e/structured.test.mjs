// Structured output and reasoning budgets through the real server and the official SDKs, on the
// bundled demo model (it reasons in <think> and writes Hermes tool calls): every request surface's
// answer parses and follows its schema, bad schemas / grammars are 400s naming the keyword or the
// position, fuzzed grammars and schemas never crash or hang the server, and a reasoning budget of 8
// tokens closes the block (streaming and stop strings included).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { sharedServer, stopSharedServers, startServer, demoArgs, postJson, parseSSE } from './helpers.mjs';

let url, oa, an, budgeted;
before(async () => {
  url = await sharedServer('demo');
  oa = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0 });
  an = new Anthropic({ baseURL: url, apiKey: 'unused', maxRetries: 0 });
  budgeted = await startServer([...demoArgs, '--reasoning-budget', '8']);
});
after(async () => {
  await budgeted?.stop();
  await stopSharedServers();
});

const sum = [{ role: 'user', content: 'What is 12 + 30?' }];
const answerSchema = {
  type: 'object',
  properties: { answer: { type: 'integer' }, unit: { enum: ['none', 'meters'] } },
  required: ['answer', 'unit'],
  additionalProperties: false,
};
function checkAnswer(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v).sort(), ['answer', 'unit'], text);
  assert.ok(Number.isInteger(v.answer), text);
  assert.ok(['none', 'meters'].includes(v.unit), text);
}

test('OpenAI response_format json_schema (strict) and json_object', async () => {
  const r = await oa.chat.completions.create({
    model: 'x', messages: sum, max_tokens: 300, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema: answerSchema } },
  });
  checkAnswer(r.choices[0].message.content);
  assert.equal(r.choices[0].finish_reason, 'stop');
  // The model reasoned first (its own <think> block), then the grammar took over.
  assert.ok(r.choices[0].message.reasoning_content?.length > 0);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
  // json_object leaves strings unbounded and this 8M-parameter model rarely closes a free string:
  // a finished answer must parse; one cut by max_tokens must still be an object's beginning.
  const o = await oa.chat.completions.create({ model: 'x', messages: sum, max_tokens: 120, temperature: 0, response_format: { type: 'json_object' } });
  const oc = o.choices[0].message.content;
  if (o.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(oc), 'object');
  else assert.match(oc, /^\{/);
});

test('llama-server json_schema and grammar fields, streamed', async () => {
  const r = await postJson(url + '/v1/chat/completions', { messages: sum, max_tokens: 300, temperature: 0, json_schema: answerSchema });
  assert.equal(r.status, 200, r.text);
  checkAnswer(r.json.choices[0].message.content);
  const g = await fetch(url + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: sum, max_tokens: 300, temperature: 0, stream: true, grammar: 'root ::= "yes" | "no" | [0-9]{1,3}' }),
  });
  let content = '';
  for (const ev of parseSSE(await g.text())) content += ev.data?.choices?.[0]?.delta?.content ?? '';
  assert.match(content, /^(yes|no|[0-9]{1,3})$/);
  const c = await postJson(url + '/v1/completions', { prompt: 'The answer is', max_tokens: 20, grammar: 'root ::= " " [0-9]{2} "."' });
  assert.equal(c.status, 200, c.text);
  assert.match(c.json.choices[0].text, /^ [0-9]{2}\.$/);
});

test('Responses text.format and Anthropic output_format', async () => {
  const r = await oa.responses.create({ model: 'x', input: 'What is 12 + 30?', max_output_tokens: 300, temperature: 0,
    text: { format: { type: 'json_schema', name: 'answer', strict: true, schema: answerSchema } } });
  checkAnswer(r.output_text);
  const m = await postJson(url + '/v1/messages', { model: 'm', max_tokens: 300, messages: sum, output_format: { type: 'json_schema', schema: answerSchema } });
  assert.equal(m.status, 200, m.text);
  checkAnswer(m.json.content.find((b) => b.type === 'text').text);
});

test('tool calls: required and a named strict function follow the parameters schema', async () => {
  const tool = { type: 'function', function: { name: 'get_weather', strict: true, parameters: {
    type: 'object', properties: { city: { type: 'string', maxLength: 24 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'], additionalProperties: false } } };
  const other = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 12 } }, required: ['zone'] } } };
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await oa.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Weather in Lyon for 3 days?' }],
      tools: [tool, other], tool_choice, max_tokens: 200, temperature: 0 });
    const calls = r.choices[0].message.tool_calls;
    assert.equal(calls.length, 1, JSON.stringify(r.choices[0].message));
    const a = JSON.parse(calls[0].function.arguments);
    if (calls[0].function.name === 'get_weather') {
      assert.equal(typeof a.city, 'string');
      assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 7, calls[0].function.arguments);
    } else {
      assert.equal(calls[0].function.name, 'get_time');
      assert.equal(typeof a.zone, 'string');
    }
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
  }
});

test('tool_choice auto: a strict tool call the model opens is constrained to its schema (streamed too)', async () => {
  // Unconstrained (main before lazy grammars), this 8M model answers this prompt with the call
  // arguments {"city": "Law", "arguments": {"city": "Cairo"}} (days missing, an extra key): only the
  // lazy grammar makes them validate (days 1..3, a city of 1..12 letters).
  const tool = { type: 'function', function: { name: 'get_weather', strict: true, parameters: {
    type: 'object', properties: { city: { type: 'string', pattern: '^[A-Za-z]{1,12}$' }, days: { type: 'integer', minimum: 1, maximum: 3 } },
    required: ['city', 'days'], additionalProperties: false } } };
  const messages = [{ role: 'user', content: 'Weather in Lyon for 3 days? Use the tool.' }];
  let calls = 0;
  for (const parallel_tool_calls of [true, false]) {
    const r = await oa.chat.completions.create({ model: 'x', messages, tools: [tool], max_tokens: 300, temperature: 0, parallel_tool_calls });
    const m = r.choices[0].message;
    // With parallel calls this model keeps calling until max_tokens: a call cut by the limit is
    // unfinished (the grammar never got to close it), every finished one must validate.
    const finished = r.choices[0].finish_reason === 'length' ? (m.tool_calls ?? []).slice(0, -1) : (m.tool_calls ?? []);
    for (const c of finished) {
      ++calls;
      assert.equal(c.function.name, 'get_weather');
      const a = JSON.parse(c.function.arguments);
      assert.deepEqual(Object.keys(a).sort(), ['city', 'days'], c.function.arguments);
      assert.match(a.city, /^[A-Za-z]{1,12}$/, c.function.arguments);
      assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 3, c.function.arguments);
    }
    if (!parallel_tool_calls) assert.ok((m.tool_calls ?? []).length <= 1, JSON.stringify(m));
    if (!parallel_tool_calls && m.tool_calls?.length) assert.equal(r.choices[0].finish_reason, 'tool_calls');
  }
  assert.ok(calls > 0, 'the demo model opens a tool call for this prompt');
  // Streamed: the same call through deltas.
  const st = await oa.chat.completions.create({ model: 'x', messages, tools: [tool], max_tokens: 300, temperature: 0, stream: true, parallel_tool_calls: false });
  let args = '', name = '', n = 0;
  for await (const ch of st) {
    for (const tc of ch.choices[0]?.delta?.tool_calls ?? []) {
      n = Math.max(n, tc.index + 1);
      if (tc.function?.name) name = tc.function.name;
      args += tc.function?.arguments ?? '';
    }
  }
  assert.equal(n, 1);
  assert.equal(name, 'get_weather');
  const a = JSON.parse(args);
  assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 3, args);
});

test('llama-server lazy grammar (grammar_lazy + grammar_triggers) on /v1/completions, plain and streamed', async () => {
  const base = { prompt: 'Once upon a time, there was a', max_tokens: 60, temperature: 0 };
  const free = await postJson(url + '/v1/completions', base);
  assert.equal(free.status, 200, free.text);
  const text = free.json.choices[0].text;
  // A word the model writes anyway: the grammar takes over from its first occurrence.
  const word = (text.slice(4).match(/[A-Za-z]{3,8}/) ?? [])[0];
  assert.ok(word, text);
  const at = text.indexOf(word);
  const grammar = `root ::= "${word}" " is " [0-9]{2} "."`;
  const lazy = { ...base, grammar, grammar_lazy: true, grammar_triggers: [{ type: 'word', value: word }] };
  const r = await postJson(url + '/v1/completions', lazy);
  assert.equal(r.status, 200, r.text);
  const t = r.json.choices[0].text;
  assert.equal(t.slice(0, at), text.slice(0, at), 'free before the trigger');
  assert.match(t.slice(at), new RegExp(`^${word} is [0-9]{2}\\.$`), t);
  assert.equal(r.json.choices[0].finish_reason, 'stop');
  // A pattern with a capture group: the grammar starts at the group.
  const p = await postJson(url + '/v1/completions', { ...lazy, grammar_triggers: [{ type: 'pattern', value: `[\\s\\S]*?(${word})` }] });
  assert.equal(p.json.choices[0].text, t);
  // Streamed: the same text.
  const sres = await fetch(url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...lazy, stream: true }) });
  let st = '';
  for (const ev of parseSSE(await sres.text())) st += ev.data?.choices?.[0]?.text ?? '';
  assert.equal(st, t);
  // A trigger that never matches: the output is the unconstrained one.
  const n = await postJson(url + '/v1/completions', { ...base, grammar: 'root ::= "x"', grammar_lazy: true, grammar_triggers: [{ type: 'word', value: 'qzqzqz' }] });
  assert.equal(n.json.choices[0].text, text);
  // Bad triggers: 400 naming the field.
  for (const [b, re] of [
    [{ grammar_triggers: [{ type: 'regex', value: 'a' }] }, /grammar_triggers\[0\]\.type/],
    [{ grammar_triggers: [{ type: 'pattern', value: 'a(' }] }, /regex: missing '\)'/],
    [{ grammar_triggers: [{ type: 'token', value: 99999999 }] }, /out of range/],
    [{ grammar_triggers: [] }, /grammar_lazy/],
  ]) {
    const e = await postJson(url + '/v1/completions', { ...base, grammar, grammar_lazy: true, ...b });
    assert.equal(e.status, 400, e.text);
    assert.match(e.json.error.message, re);
  }
});

test('refusals name the schema keyword or the grammar position', async () => {
  const bad = async (body, re) => {
    const r = await postJson(url + '/v1/chat/completions', { messages: sum, max_tokens: 8, ...body });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, re);
  };
  await bad({ json_schema: { type: 'object', patternProperties: { a: {} } } }, /patternProperties/);
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', if: {} } } } }, /'if'/);
  await bad({ grammar: 'root ::= "a" (' }, /line 1 col/);
  await bad({ grammar: 'root ::= missing' }, /undefined rule 'missing'/);
});

test('reasoning budget 8: a closed <think> block and a normal answer (plain, streamed, with a stop string)', async () => {
  const q = [{ role: 'user', content: 'What is 4821 + 3907?' }];
  const base = { messages: q, max_tokens: 300, temperature: 0 };
  const full = await postJson(url + '/v1/chat/completions', base);
  const cut = await postJson(budgeted.url + '/v1/chat/completions', base);
  const perReq = await postJson(url + '/v1/chat/completions', { ...base, reasoning_budget_tokens: 8 });
  for (const r of [cut, perReq]) {
    const m = r.json.choices[0].message;
    assert.ok(m.reasoning_content.length > 0 && m.reasoning_content.length < full.json.choices[0].message.reasoning_content.length);
    assert.ok(m.content.length > 0, JSON.stringify(m));
    assert.ok(!m.content.includes('</think>'));
    assert.equal(r.json.choices[0].finish_reason, 'stop');
    const rt = r.json.usage.completion_tokens_details.reasoning_tokens;
    assert.ok(rt >= 8 && rt <= 11, `reasoning_tokens ${rt}`);
  }
  // Anthropic thinking.budget_tokens, honoured as given.
  const a = await an.messages.create({ model: 'm', max_tokens: 300, messages: q, thinking: { type: 'enabled', budget_tokens: 4 } });
  assert.equal(a.content[0].type, 'thinking');
  assert.ok(a.content.find((b) => b.type === 'text').text.length > 0);
  // Streamed, with a stop string inside the answer: reasoning then content, cut at the stop.
  let reasoning = '', content = '';
  for await (const ch of await oa.chat.completions.create({ ...base, model: 'x', reasoning_budget_tokens: 8, stream: true, stop: ['892'] })) {
    reasoning += ch.choices[0]?.delta?.reasoning_content ?? '';
    content += ch.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, perReq.json.choices[0].message.reasoning_content);
  assert.ok(!content.includes('892') && content.length > 0, content);
  assert.ok(perReq.json.choices[0].message.content.startsWith(content));
});

test('fuzzed grammars and schemas never crash or hang the server', async () => {
  let seed = 7;
  const rnd = (n) => ((seed = (seed * 1103515245 + 12345) % 2147483648) % n);
  const pieces = ['root', ' ::= ', '"a"', '[a-z]', '*', '+', '?', '(', ')', '|', '{2,5}', 'x', ' ', '\n', '"\\"', '[^"]', '{99999}', '::='];
  const keys = ['type', 'properties', 'items', 'anyOf', '$ref', 'enum', 'minItems', 'pattern', 'required', 'additionalProperties', 'format'];
  const vals = [() => 'string', () => 'object', () => ({}), () => [], () => -1, () => '#/x', () => '(a|b)*c', () => ({ type: 'integer' }), () => [1, 'a', null]];
  const t0 = Date.now();
  for (let i = 0; i < 60; ++i) {
    let body;
    if (i % 2) {
      let g = '';
      for (let k = 0; k < 2 + rnd(10); ++k) g += pieces[rnd(pieces.length)];
      body = { grammar: g };
    } else {
      const s = {};
      for (let k = 0; k < 1 + rnd(4); ++k) s[keys[rnd(keys.length)]] = vals[rnd(vals.length)]();
      body = { json_schema: s };
    }
    const r = await postJson(url + '/v1/chat/completions', { messages: sum, max_tokens: 12, ...body });
    assert.ok(r.status === 200 || r.status === 400, `${r.status} ${JSON.stringify(body)}: ${r.text.slice(0, 200)}`);
  }
  assert.ok(Date.now() - t0 < 120000, 'fuzzed requests took too long');
  const ok = await postJson(url + '/v1/chat/completions', { messages: sum, max_tokens: 4 });
  assert.equal(ok.status, 200);
});
