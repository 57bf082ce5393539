// Malformed and hostile requests: each gets the right 4xx status in the error shape of its API,
// and the server stays up. Plus authentication and CORS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { sharedServer, stopSharedServers, startServer, storiesModel, chatmlTemplate, postJson, getText } from './helpers.mjs';

let base;
const servers = [];
before(async () => {
  base = await sharedServer('stories');
});
after(async () => {
  for (const s of servers) await s.stop();
  await stopSharedServers();
});

const user = [{ role: 'user', content: 'hi' }];
const chat = (extra) => ({ messages: user, max_tokens: 4, ...extra });
const msgs = (extra) => ({ model: 'm', max_tokens: 4, messages: user, ...extra });
const longText = 'Once upon a time there was a little cat. '.repeat(80);

// [path, body (object or raw string), status, param/message fragment, code]
const table = [
  ['/v1/chat/completions', '{"messages": [', 400, 'not valid JSON'],
  ['/v1/chat/completions', '[1,2,3]', 400, 'JSON object'],
  ['/v1/chat/completions', '{"messages": [], "temperature": 1e400}', 400, 'not valid JSON'],
  ['/v1/chat/completions', '{"x":' + '['.repeat(100000) + ']'.repeat(100000) + '}', 400, 'levels deep'],
  ['/v1/chat/completions', '', 400, 'not valid JSON'],
  ['/v1/chat/completions', {}, 400, 'messages'],
  ['/v1/chat/completions', { messages: [] }, 400, 'messages'],
  ['/v1/chat/completions', { messages: 'hi' }, 400, 'messages'],
  ['/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }, 400, 'messages[0].role'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 42 }] }, 400, 'messages[0].content'],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }] }, 400, 'messages[0].content[0]'],
  ['/v1/chat/completions', chat({ max_tokens: -1 }), 400, 'max_tokens'],
  ['/v1/chat/completions', chat({ max_tokens: 0 }), 400, 'max_tokens'],
  ['/v1/chat/completions', chat({ max_tokens: 'ten' }), 400, 'max_tokens'],
  ['/v1/chat/completions', chat({ max_tokens: 1e300 }), 400, 'max_tokens'],
  ['/v1/chat/completions', chat({ temperature: -1 }), 400, 'temperature'],
  ['/v1/chat/completions', chat({ temperature: 'hot' }), 400, 'temperature'],
  ['/v1/chat/completions', chat({ top_p: 2 }), 400, 'top_p'],
  ['/v1/chat/completions', chat({ n: 3 }), 400, 'n'],
  ['/v1/chat/completions', chat({ stream: 'yes' }), 400, 'stream'],
  ['/v1/chat/completions', chat({ stop: 7 }), 400, 'stop'],
  ['/v1/chat/completions', chat({ response_format: { type: 'json_schema', json_schema: {} } }), 400, 'response_format'],
  ['/v1/chat/completions', chat({ tool_choice: 'required' }), 400, 'tool_choice'],
  ['/v1/chat/completions', chat({ logit_bias: { abc: 3 } }), 400, 'logit_bias'],
  ['/v1/chat/completions', chat({ logit_bias: { 100000: 3 } }), 400, 'logit_bias token id'],
  ['/v1/chat/completions', chat({ top_logprobs: 2 }), 400, 'top_logprobs'],
  ['/v1/chat/completions', chat({ max_tokens: 100000 }), 400, 'max_tokens', 'context_length_exceeded'],
  ['/v1/chat/completions', chat({ messages: [{ role: 'user', content: longText }] }), 400, 'messages', 'context_length_exceeded'],
  ['/v1/completions', { prompt: [1, 99999] }, 400, 'prompt'],
  ['/v1/completions', {}, 400, 'prompt'],
  ['/v1/completions', { prompt: 'a', suffix: 'b' }, 400, 'suffix'],
  ['/v1/completions', { prompt: 'a', max_tokens: -3 }, 400, 'max_tokens'],
  ['/v1/responses', { input: 'x', previous_response_id: 'resp_1' }, 400, 'previous_response_id'],
  ['/v1/responses', {}, 400, 'input'],
  ['/v1/responses', { input: [{ type: 'message', role: 'robot', content: 'x' }] }, 400, 'input[0].role'],
  ['/v1/responses', { input: 'x', max_output_tokens: -1 }, 400, 'max_output_tokens'],
  ['/v1/messages', '{bad json', 400, 'not valid JSON'],
  ['/v1/messages', { model: 'm', messages: user }, 400, 'max_tokens'],
  ['/v1/messages', msgs({ messages: [{ role: 'robot', content: 'x' }] }), 400, 'messages[0].role'],
  ['/v1/messages', msgs({ messages: [{ role: 'system', content: 'only a system turn' }] }), 400, 'messages'],
  ['/v1/messages', msgs({ messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }), 400, 'messages[0].content[0]'],
  ['/v1/messages', msgs({ max_tokens: -5 }), 400, 'max_tokens'],
  ['/v1/messages', msgs({ temperature: 'x' }), 400, 'temperature'],
  ['/v1/messages', msgs({ tools: [{ name: 'f' }] }), 400, 'input_schema'],
  ['/v1/messages', msgs({ tool_choice: { type: 'tool', name: 'nope' } }), 400, 'tool_choice'],
  ['/v1/messages', msgs({ max_tokens: 100000 }), 400, 'max_tokens'],
  ['/v1/messages/count_tokens', { messages: 'x' }, 400, 'messages'],
  ['/tokenize', { content: 5 }, 400, 'content'],
  ['/detokenize', { tokens: [1, -2] }, 400, 'tokens'],
  ['/detokenize', { tokens: [1, 100000] }, 400, 'tokens'],
];

test('malformed requests: status and error shape per API', async () => {
  for (const [path, body, status, fragment, code] of table) {
    const r = await postJson(base + path, body);
    const label = `${path} ${typeof body === 'string' ? body : JSON.stringify(body).slice(0, 120)}`;
    assert.equal(r.status, status, `${label}: ${r.text}`);
    assert.equal(r.headers.get('content-type'), 'application/json', label);
    if (path.startsWith('/v1/messages')) {
      assert.equal(r.json.type, 'error', label);
      assert.equal(r.json.error.type, 'invalid_request_error', label);
      assert.ok(r.json.error.message.includes(fragment), `${label}: ${r.json.error.message}`);
    } else {
      assert.equal(r.json.error.type, 'invalid_request_error', label);
      const where = `${r.json.error.param ?? ''} ${r.json.error.message}`;
      assert.ok(where.includes(fragment), `${label}: ${where}`);
      if (code) assert.equal(r.json.error.code, code, label);
    }
  }
  // Unknown routes and wrong methods.
  let r = await getText(base + '/v1/nope');
  assert.equal(r.status, 404);
  assert.equal(JSON.parse(r.text).error.type, 'not_found_error');
  r = await postJson(base + '/v1/messages/nope', {});
  assert.equal(r.status, 404);
  assert.equal(r.json.error.type, 'not_found_error');
  assert.equal(r.json.type, 'error');
  r = await getText(base + '/v1/chat/completions');
  assert.equal(r.status, 405);
  r = await getText(base + '/v1/models/some-other-model');
  assert.equal(r.status, 404);
  // Still healthy after all that.
  assert.equal((await getText(base + '/health')).status, 200);
  const ok = await postJson(base + '/v1/chat/completions', chat({}));
  assert.equal(ok.status, 200);
});

test('unknown fields are accepted and reported back', async () => {
  const r = await postJson(base + '/v1/chat/completions', chat({ brand_new_option: true, user: 'u' }));
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-peregrine-ignored-fields'), 'brand_new_option');
});

test('oversized bodies get 413', async () => {
  const s = await startServer(['-m', storiesModel(), '--chat-template-file', chatmlTemplate(), '--max-body', '4096']);
  servers.push(s);
  const r = await postJson(s.url + '/v1/chat/completions', { messages: [{ role: 'user', content: 'x'.repeat(10000) }] });
  assert.equal(r.status, 413);
  assert.match(r.json.error.message, /--max-body/);
  const a = await postJson(s.url + '/v1/messages', { model: 'm', max_tokens: 3, messages: [{ role: 'user', content: 'x'.repeat(10000) }] });
  assert.equal(a.status, 413);
  assert.equal(a.json.error.type, 'request_too_large');
  assert.equal((await getText(s.url + '/health')).status, 200);
});

test('API key on every route but /health; CORS only when asked for', async () => {
  const s = await startServer(['-m', storiesModel(), '--chat-template-file', chatmlTemplate(), '--api-key', 'sekret', '--cors', 'http://app.example']);
  servers.push(s);
  assert.equal((await getText(s.url + '/health')).status, 200);
  let r = await getText(s.url + '/v1/models');
  assert.equal(r.status, 401);
  assert.equal(JSON.parse(r.text).error.type, 'authentication_error');
  for (const path of ['/props', '/metrics', '/v1/models']) {
    assert.equal((await getText(s.url + path)).status, 401, path);
    assert.equal((await getText(s.url + path, { authorization: 'Bearer sekret' })).status, 200, path);
  }
  assert.equal((await getText(s.url + '/v1/models', { 'x-api-key': 'sekret' })).status, 200);
  assert.equal((await getText(s.url + '/v1/models', { authorization: 'Bearer wrong' })).status, 401);
  r = await postJson(s.url + '/v1/messages', { model: 'm', max_tokens: 3, messages: user });
  assert.equal(r.status, 401);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, 'authentication_error');
  r = await postJson(s.url + '/v1/messages', { model: 'm', max_tokens: 3, messages: user }, { 'x-api-key': 'sekret' });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('access-control-allow-origin'), 'http://app.example');
  const pre = await fetch(s.url + '/v1/chat/completions', {
    method: 'OPTIONS',
    headers: { origin: 'http://app.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization' },
  });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get('access-control-allow-origin'), 'http://app.example');
  assert.match(pre.headers.get('access-control-allow-headers'), /Authorization/);
  // The props never reveal the key.
  const props = await getText(s.url + '/props', { authorization: 'Bearer sekret' });
  assert.ok(!props.text.includes('sekret'));
  assert.equal(JSON.parse(props.text).runtime.api_key_required, true);
  // The shared server runs without --cors: no CORS headers at all.
  const plain = await postJson(base + '/v1/chat/completions', chat({}));
  assert.equal(plain.headers.get('access-control-allow-origin'), null);
});
