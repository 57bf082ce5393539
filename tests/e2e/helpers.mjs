// Shared helpers: start a real `peregrine serve` on a free loopback port, raw HTTP helpers, SSE parsing.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '../..');

export function peregrineBin() {
  const bin = process.env.PEREGRINE_BIN;
  if (!bin || !fs.existsSync(bin)) throw new Error(`PEREGRINE_BIN (${bin}) does not name the built peregrine executable`);
  return bin;
}

export function sharedPath(rel) {
  const root = process.env.PEREGRINE_SHARED || path.resolve(repo, '../shared');
  const p = path.join(root, rel);
  if (!fs.existsSync(p)) throw new Error(`shared test data missing: ${p}`);
  return p;
}

export const storiesModel = () => sharedPath('testdata/models/stories260K.gguf');
export const chatmlTemplate = () => path.join(repo, 'tests/server/chatml.jinja');
export const qwen3Template = () => sharedPath('testdata/chat_templates/llama.cpp/Qwen-Qwen3-0.6B.jinja');

// Starts the server and resolves once it listens. args: extra CLI flags.
export async function startServer(args, { timeoutMs = 60000 } = {}) {
  const proc = spawn(peregrineBin(), ['serve', '--port', '0', '-t', '2', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in time:\n${log}`)), timeoutMs);
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/listening on (http:\/\/[^\s]+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    };
    proc.stderr.on('data', onData);
    proc.stdout.on('data', onData);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code} before listening:\n${log}`));
    });
  });
  proc.removeAllListeners('exit');
  return {
    url,
    proc,
    log: () => log,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      const done = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
      const code = await done;
      clearTimeout(t);
      return code;
    },
  };
}

// The bundled demo model is the default without -m.
export const demoArgs = ['-np', '2', '-c', '2048'];

// Servers started once by run.mjs and shared by the test files (URLs in the environment), or started
// here when a file runs on its own.
const started = new Map();
export async function sharedServer(name) {
  const env = { stories: 'E2E_STORIES_URL', qwen3: 'E2E_QWEN3_URL', demo: 'E2E_DEMO_URL' }[name];
  if (process.env[env]) return process.env[env];
  if (!started.has(name)) {
    const args = {
      stories: ['-m', storiesModel(), '--chat-template-file', chatmlTemplate(), '-np', '4', '-c', '512'],
      qwen3: ['-m', process.env.E2E_QWEN3_MODEL, '--chat-template-file', qwen3Template(), '-np', '2', '-c', '1024'],
      demo: demoArgs,
    }[name];
    started.set(name, await startServer(args));
  }
  return started.get(name).url;
}
export async function stopSharedServers() {
  for (const s of started.values()) await s.stop();
  started.clear();
}

export async function postJson(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, headers: res.headers, text, json };
}

export async function getText(url, headers = {}) {
  const res = await fetch(url, { headers });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

// Parses an SSE body into [{event, data}] (data JSON-parsed when possible).
export function parseSSE(text) {
  const out = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    let event = null;
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) continue;
      if (line.startsWith('event:')) event = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (!data.length && !event) continue;
    const raw = data.join('\n');
    let parsed = raw;
    try {
      parsed = JSON.parse(raw);
    } catch {}
    out.push({ event, data: parsed });
  }
  return out;
}

// A Prometheus sample value, or undefined.
export function metric(text, name, labels = '') {
  const esc = (t) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const re = new RegExp(`^${esc(name)}${esc(labels)} (\\S+)$`, 'm');
  const m = text.match(re);
  return m ? Number(m[1]) : undefined;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
