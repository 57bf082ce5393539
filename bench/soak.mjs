#!/usr/bin/env node
// Soak test: C keep-alive clients hammer `peregrine serve` for a while with a mix of requests
// (streamed and whole chat completions, Anthropic messages, tokenize, health, clients that hang up
// mid-stream), and the server's errors, latency and memory are reported over time.
//
//   node bench/soak.mjs [--bin build/src/cli/peregrine] [-m MODEL] [--clients 64] [--minutes 10]
//        [-t THREADS] [--np 4] [--every 30] [--url http://127.0.0.1:PORT --pid PID]
//
// Without --url it starts its own server (the bundled demo model unless -m) on a free loopback
// port. Every --every seconds it prints: requests done, errors (non-2xx other than the expected
// ones, connection failures, timeouts), p50/p99 latency, the server's RSS and thread count. It exits
// non-zero if any request failed or the final RSS exceeds 2× the RSS after warm-up.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..');

function parseArgs(argv) {
  const a = { bin: path.join(repo, 'build/src/cli/peregrine'), model: '', clients: 64, minutes: 10, threads: 0, np: 4, every: 30, url: '', pid: 0 };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const take = () => argv[++i];
    if (k === '--bin') a.bin = take();
    else if (k === '-m' || k === '--model') a.model = take();
    else if (k === '--clients') a.clients = Number(take());
    else if (k === '--minutes') a.minutes = Number(take());
    else if (k === '-t' || k === '--threads') a.threads = Number(take());
    else if (k === '--np') a.np = Number(take());
    else if (k === '--every') a.every = Number(take());
    else if (k === '--url') a.url = take();
    else if (k === '--pid') a.pid = Number(take());
    else if (k === '-h' || k === '--help') {
      console.log(fs.readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\n').slice(1, 12).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
      process.exit(0);
    } else throw new Error(`unknown argument ${k}`);
  }
  if (!(a.clients >= 1 && a.minutes > 0)) throw new Error('bad --clients/--minutes');
  return a;
}

async function startServer(a) {
  const args = ['serve', '--port', '0', '-np', String(a.np), '-c', '1024', ...(a.model ? ['-m', a.model] : []),
    ...(a.threads ? ['-t', String(a.threads)] : [])];
  const proc = spawn(a.bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 120000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/\S+)/);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    proc.on('exit', (c) => reject(new Error(`server exited ${c}:\n${log}`)));
  });
  proc.removeAllListeners('exit');
  return { url, proc };
}

function procStats(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const n = (k) => Number(s.match(new RegExp(`^${k}:\\s+(\\d+)`, 'm'))[1]);
    return { rss: n('VmRSS') * 1024, threads: n('Threads'), fds: fs.readdirSync(`/proc/${pid}/fd`).length };
  } catch {
    return { rss: NaN, threads: NaN, fds: NaN };
  }
}

const user = (i) => [{ role: 'user', content: `Tell me a story about the number ${i}.` }];

// One request of the mix over the client's keep-alive agent. Resolves with {ok, ms, what}.
function request(base, agent, kind, i) {
  const u = new URL(base);
  let path = '/v1/chat/completions', body = null, hangup = false;
  if (kind === 'stream') body = { messages: user(i), max_tokens: 48, stream: true };
  else if (kind === 'chat') body = { messages: user(i), max_tokens: 24 };
  else if (kind === 'anthropic') { path = '/v1/messages'; body = { model: 'x', max_tokens: 24, messages: user(i), stream: i % 2 === 0 }; }
  else if (kind === 'tokenize') { path = '/tokenize'; body = { content: 'Once upon a time '.repeat(1 + (i % 200)), with_pieces: i % 3 === 0 }; }
  else if (kind === 'hangup') { body = { messages: user(i), max_tokens: 120, stream: true, ignore_eos: true }; hangup = true; }
  else path = '/health';
  const t0 = performance.now();
  return new Promise((resolve) => {
    const req = http.request({ host: u.hostname, port: u.port, path, method: body ? 'POST' : 'GET', agent, timeout: 60000,
      headers: body ? { 'content-type': 'application/json' } : {} }, (res) => {
      let n = 0;
      res.on('data', (d) => {
        n += d.length;
        if (hangup && n > 200) req.destroy();  // a client that leaves mid-stream
      });
      res.on('end', () => resolve({ ok: res.statusCode === 200, ms: performance.now() - t0, what: `${kind} ${res.statusCode}` }));
      res.on('close', () => { if (hangup) resolve({ ok: true, ms: performance.now() - t0, what: kind }); });
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve({ ok: hangup && e.code === 'ECONNRESET', ms: performance.now() - t0, what: `${kind} ${e.code ?? e.message}` }));
    req.end(body ? JSON.stringify(body) : undefined);
  });
}

const kinds = ['stream', 'chat', 'stream', 'tokenize', 'health', 'anthropic', 'chat', 'hangup'];

async function main() {
  const a = parseArgs(process.argv.slice(2));
  let server = null;
  if (!a.url) {
    server = await startServer(a);
    a.url = server.url;
    a.pid = server.proc.pid;
  }
  console.log(`soak: ${a.clients} clients × ${a.minutes} min against ${a.url} (pid ${a.pid || '?'})`);
  const end = Date.now() + a.minutes * 60000;
  let done = 0, failed = 0, inferences = 0;
  const failures = new Map();
  let lat = [];
  const all = [];
  const client = async (c) => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    // Each client walks the whole mix (i alone would give client c the same kind every time).
    for (let k = 0, i = c; Date.now() < end; k++, i += a.clients) {
      const kind = kinds[(c + k) % kinds.length];
      const r = await request(a.url, agent, kind, i);
      if (kind !== 'health' && kind !== 'tokenize') inferences++;
      done++;
      lat.push(r.ms);
      if (!r.ok) {
        failed++;
        failures.set(r.what, (failures.get(r.what) ?? 0) + 1);
      }
    }
    agent.destroy();
  };
  const t0 = Date.now();
  let warm = null;
  const pct = (xs, p) => (xs.length ? xs.slice().sort((x, y) => x - y)[Math.min(xs.length - 1, Math.floor(p * xs.length))] : NaN);
  const report = () => {
    const s = procStats(a.pid);
    if (!warm && Date.now() - t0 > 20000) warm = s.rss;
    const row = { t_s: Math.round((Date.now() - t0) / 1000), done, inferences, failed, p50_ms: Math.round(pct(lat, 0.5)), p99_ms: Math.round(pct(lat, 0.99)),
      rss_mb: Math.round(s.rss / 1e6), threads: s.threads, fds: s.fds };
    all.push(row);
    console.log(JSON.stringify(row));
    lat = [];
  };
  const timer = setInterval(report, a.every * 1000);
  await Promise.all(Array.from({ length: a.clients }, (_, c) => client(c)));
  clearInterval(timer);
  await new Promise((r) => setTimeout(r, 2000));
  report();
  const final = procStats(a.pid).rss;
  console.log(`done: ${done} requests, ${failed} failed${failures.size ? ' ' + JSON.stringify(Object.fromEntries(failures)) : ''}; ` +
    `RSS after warm-up ${Math.round((warm ?? final) / 1e6)} MB, at the end ${Math.round(final / 1e6)} MB`);
  if (server) server.proc.kill('SIGTERM');
  process.exit(failed > 0 || (warm && final > 2 * warm) ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
