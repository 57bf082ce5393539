#!/usr/bin/env node
// Server benchmark: N concurrent streaming clients against `peregrine serve`, compared with
// `peregrine bench` (the engine alone) on the same model and thread count.
//
//   node bench/server_bench.mjs [--bin build/src/cli/peregrine] [-m MODEL] [--prompt 256] [--gen 128]
//        [--clients 1,2,4,8] [-t THREADS] [--device DEV] [--reps 2] [--json out.json]
//
// Reports, for each N: aggregate generated tok/s, per-client decode tok/s, mean TTFT and mean
// inter-token latency as the clients see them; and for N = 1 the server's overhead over the engine:
// per token (client inter-token latency − engine ms/token) and on TTFT (client TTFT − engine time
// to prefill the prompt). Prompts are exact token-id lists (/v1/completions) with ignore_eos, so
// every request generates exactly --gen tokens. Only loopback traffic; it stops by itself.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..');

function parseArgs(argv) {
  const a = { bin: path.join(repo, 'build/src/cli/peregrine'), model: '', prompt: 256, gen: 128, clients: [1, 2, 4, 8],
    threads: 0, device: 'auto', reps: 2, json: '' };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i], v = argv[i + 1];
    const take = () => { i++; return v; };
    if (k === '--bin') a.bin = take();
    else if (k === '-m' || k === '--model') a.model = take();
    else if (k === '--prompt') a.prompt = Number(take());
    else if (k === '--gen') a.gen = Number(take());
    else if (k === '--clients') a.clients = take().split(',').map(Number);
    else if (k === '-t' || k === '--threads') a.threads = Number(take());
    else if (k === '--device') a.device = take();
    else if (k === '--reps') a.reps = Number(take());
    else if (k === '--json') a.json = take();
    else if (k === '-h' || k === '--help') {
      console.log(fs.readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\n').slice(1, 12).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
      process.exit(0);
    } else throw new Error(`unknown argument ${k}`);
  }
  if (!fs.existsSync(a.bin)) throw new Error(`no peregrine binary at ${a.bin} (use --bin)`);
  if (!(a.prompt > 0 && a.gen > 1 && a.clients.every((n) => n >= 1))) throw new Error('bad --prompt/--gen/--clients');
  return a;
}

const modelArgs = (a) => [...(a.model ? ['-m', a.model] : []), '-t', String(a.threads), '--device', a.device];

// The engine alone: pp (prompt tok/s) and tg (generation tok/s, ms/token).
function engineBench(a) {
  const r = spawnSync(a.bin, ['bench', ...modelArgs(a), '-p', String(a.prompt), '-n', String(a.gen), '-r', String(Math.max(a.reps, 1))],
    { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`peregrine bench failed:\n${r.stderr}`);
  const row = (name) => {
    const line = r.stdout.split('\n').find((l) => l.startsWith(`| ${name} `));
    if (!line) throw new Error(`no ${name} row in:\n${r.stdout}`);
    const cells = line.split('|').map((c) => c.trim());
    return { tps: Number(cells[3]), ms: Number(cells[4]) };
  };
  return { pp: row(`pp${a.prompt}`), tg: row(`tg${a.gen}`), text: r.stdout };
}

async function startServer(a, slots) {
  const ctx = a.prompt + a.gen + 64;
  const proc = spawn(a.bin, ['serve', ...modelArgs(a), '--port', '0', '-np', String(slots), '-c', String(ctx)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 120000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/\S+)/);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    proc.on('exit', (c) => { clearTimeout(t); reject(new Error(`server exited (${c}):\n${log}`)); });
  });
  proc.removeAllListeners('exit');
  return { url, stop: () => new Promise((r) => { proc.on('exit', r); proc.kill('SIGTERM'); }) };
}

// One streaming completion; timestamps of the request and of every token chunk.
async function streamOne(url, prompt, gen) {
  const t0 = performance.now();
  const res = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: gen, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const dec = new TextDecoder();
  let buf = '', first = 0, last = 0, tokens = 0;
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices?.[0]?.text) {
        const now = performance.now();
        if (!first) first = now;
        last = now;
      }
    }
  }
  return { ttft: first - t0, decode: last - first, tokens, end: performance.now() };
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const eng = engineBench(a);
  const maxN = Math.max(...a.clients);
  const srv = await startServer(a, maxN);
  const rows = [];
  try {
    // An exact-length prompt: token ids of a text, cycled (BOS handling is the client's business here).
    const tk = await (await fetch(srv.url + '/tokenize', { method: 'POST', body: JSON.stringify({ content: 'The quick brown fox jumps over the lazy dog. ' }) })).json();
    const base = tk.tokens;
    const prompts = (n) => Array.from({ length: n }, (_, c) => Array.from({ length: a.prompt }, (_, i) => base[(i + c) % base.length]));
    await streamOne(srv.url, prompts(1)[0], 4);  // warm-up
    for (const n of a.clients) {
      let best = null;
      for (let r = 0; r < a.reps; r++) {
        const t0 = performance.now();
        const rs = await Promise.all(prompts(n).map((p) => streamOne(srv.url, p, a.gen)));
        const wall = Math.max(...rs.map((x) => x.end)) - t0;
        const total = rs.reduce((s, x) => s + x.tokens, 0);
        const row = {
          clients: n,
          aggregate_tps: total / (wall / 1000),
          client_tps: rs.reduce((s, x) => s + (x.tokens - 1) / (x.decode / 1000), 0) / n,
          ttft_ms: rs.reduce((s, x) => s + x.ttft, 0) / n,
          itl_ms: rs.reduce((s, x) => s + x.decode / (x.tokens - 1), 0) / n,
          tokens: total,
        };
        if (!best || row.aggregate_tps > best.aggregate_tps) best = row;
      }
      rows.push(best);
    }
  } finally {
    await srv.stop();
  }
  const one = rows.find((r) => r.clients === 1);
  const enginePrefillMs = (a.prompt / eng.pp.tps) * 1000;
  const f = (x, d = 2) => x.toFixed(d);
  console.log(`model: ${a.model || 'bundled demo model'}, prompt ${a.prompt} tokens, ${a.gen} generated per request, threads ${a.threads || 'all'}`);
  console.log(`engine (peregrine bench): pp ${f(eng.pp.tps)} tok/s, tg ${f(eng.tg.tps)} tok/s (${f(eng.tg.ms, 3)} ms/token)\n`);
  console.log('| clients | aggregate tok/s | per-client tok/s | mean TTFT ms | mean inter-token ms |');
  console.log('|---:|---:|---:|---:|---:|');
  for (const r of rows) console.log(`| ${r.clients} | ${f(r.aggregate_tps)} | ${f(r.client_tps)} | ${f(r.ttft_ms)} | ${f(r.itl_ms, 3)} |`);
  if (one) {
    console.log(`\nserver overhead at 1 client: ${f(one.itl_ms - eng.tg.ms, 3)} ms per token (${f(100 * (one.itl_ms / eng.tg.ms - 1), 1)} %), ` +
      `${f(one.ttft_ms - enginePrefillMs)} ms on TTFT (engine prefill ${f(enginePrefillMs)} ms, client TTFT ${f(one.ttft_ms)} ms)`);
  }
  if (a.json) fs.writeFileSync(a.json, JSON.stringify({ args: a, engine: { pp: eng.pp, tg: eng.tg }, rows }, null, 2));
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
