#!/usr/bin/env node
// Prefix-cache benchmark: an agent-shaped conversation (a long system prompt with tools, then short
// turns) against `peregrine serve`, TTFT of every turn with the prefix cache off, in RAM, and from the
// disk tier after a restart.
//
//   node bench/prefix_bench.mjs [--bin build/src/cli/peregrine] [-m MODEL] [-t THREADS] [-c CTX]
//        [--gen 16] [--turns 6] [--rounds 3] [--user-chars 80] [--server-args "--kv-block-size 16"] [--whole] [--json out.json]
//
// The conversation is tau-bench's airline task 0 (../shared/testdata/bench/tau_bench): its system
// prompt (the airline policy, cut to fit the context), four of its tools, and its user messages (cut to
// --user-chars) as the turns; the assistant turns are the model's own answers sent back, as an agent
// does (greedy, so every mode sends the same requests). Each round runs, interleaved:
//   off  — --cache-ram 0: every turn prefills everything;
//   ram  — the default RAM prefix cache: turn 1 misses, turns 2.. reuse the previous turn; then turn 1
//          again (a RAM hit of the whole first prompt, the reference for the restart);
//   disk — --kv-cache-dir: the conversation once, the server stopped and restarted on the same
//          directory, then turn 1 again (the restarted server's first repeat, from disk) and the rest;
//   whole — with --whole: the RAM cache with --no-partial-blocks (whole blocks only), for an A/B of
//          partial-block reuse in the same rounds.
// TTFT is the engine's (timings.ttft_ms: submission to first token); the median over rounds is shown.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..');

function parseArgs(argv) {
  const a = { bin: path.join(repo, 'build/src/cli/peregrine'), model: '', threads: 0, ctx: 1024, gen: 16, turns: 6, rounds: 3, json: '', userChars: 80, serverArgs: [],
    // ../shared next to the checkout, or PEREGRINE_SHARED (as the e2e tests take it) for a worktree elsewhere.
    data: path.join(process.env.PEREGRINE_SHARED || path.resolve(repo, '../shared'), 'testdata/bench/tau_bench/gpt-4o-airline.json') };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i], v = argv[i + 1];
    const take = () => { i++; return v; };
    if (k === '--bin') a.bin = take();
    else if (k === '-m' || k === '--model') a.model = take();
    else if (k === '-t' || k === '--threads') a.threads = Number(take());
    else if (k === '-c' || k === '--ctx') a.ctx = Number(take());
    else if (k === '--gen') a.gen = Number(take());
    else if (k === '--turns') a.turns = Number(take());
    else if (k === '--rounds') a.rounds = Number(take());
    else if (k === '--json') a.json = take();
    else if (k === '--data') a.data = take();
    else if (k === '--user-chars') a.userChars = Number(take());
    else if (k === '--server-args') a.serverArgs = take().split(' ').filter(Boolean);
    else if (k === '--whole') a.whole = true;
    else throw new Error(`unknown argument ${k}`);
  }
  if (!fs.existsSync(a.bin)) throw new Error(`no peregrine binary at ${a.bin} (use --bin)`);
  return a;
}

async function startServer(a, extra) {
  const args = ['serve', ...(a.model ? ['-m', a.model] : []), '-t', String(a.threads), '--port', '0', '-np', '1', '-c', String(a.ctx), ...a.serverArgs, ...extra];
  const proc = spawn(a.bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
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
  return { url, log: () => log, stop: () => new Promise((r) => { proc.on('exit', r); proc.kill('SIGTERM'); }) };
}

async function post(url, route, body) {
  const r = await fetch(url + route, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const j = await r.json();
  if (!r.ok) throw new Error(`${route}: ${r.status} ${JSON.stringify(j)}`);
  return j;
}

// The conversation: system + tools, then (user, assistant) pairs from the trajectory.
function conversation(a, systemChars) {
  const task = JSON.parse(fs.readFileSync(a.data, 'utf8'))[0];
  const traj = task.traj;
  const system = traj.find((m) => m.role === 'system').content.slice(0, systemChars);
  const users = traj.filter((m) => m.role === 'user' && m.content).map((m) => m.content.slice(0, a.userChars));
  // Placeholders of about an answer's length for fitting the context; the runs send the model's answers.
  const assistants = Array.from({ length: a.turns }, () => 'x'.repeat(a.gen * 3));
  const tools = (task.info?.tools ?? []).slice(0, 4);
  const fallbackTools = ['get_user_details', 'get_reservation_details', 'search_direct_flight', 'book_reservation'].map((name) => ({
    type: 'function', function: { name, description: `Airline tool ${name.replace(/_/g, ' ')}.`, parameters: { type: 'object', properties: { id: { type: 'string' } } } } }));
  return { system, users, assistants, tools: tools.length ? tools : fallbackTools };
}

function messagesFor(conv, turn, answers = conv.assistants) {
  const m = [{ role: 'system', content: conv.system }];
  for (let i = 0; i <= turn; i++) {
    m.push({ role: 'user', content: conv.users[i % conv.users.length] });
    if (i < turn) m.push(typeof answers[i] === 'string' ? { role: 'assistant', content: answers[i] } : answers[i]);
  }
  return m;
}

// Turn k of the conversation; `answers` collects the model's answers (the assistant messages of later turns).
async function turn(url, a, conv, k, answers) {
  const j = await post(url, '/v1/chat/completions', { messages: messagesFor(conv, k, answers), tools: conv.tools, max_tokens: a.gen, temperature: 0 });
  const msg = j.choices[0].message;
  if (answers.length === k) answers.push({ role: 'assistant', content: msg.content ?? '', ...(msg.tool_calls ? { tool_calls: msg.tool_calls } : {}) });
  return { ttft: j.timings.ttft_ms, prompt_ms: j.timings.prompt_ms, prompt: j.usage.prompt_tokens, cached: j.usage.prompt_tokens_details.cached_tokens };
}

const median = (xs) => { const s = [...xs].sort((x, y) => x - y); return s.length ? s[Math.floor((s.length - 1) / 2)] : NaN; };

async function main() {
  const a = parseArgs(process.argv.slice(2));
  // Fit the system prompt so the last turn plus its answer stays inside the context.
  let conv = conversation(a, 100000);
  {
    const s = await startServer(a, ['--cache-ram', '0']);
    let lo = 200, hi = conv.system.length;
    while (hi - lo > 50) {
      const mid = Math.floor((lo + hi) / 2);
      const c = conversation(a, mid);
      const r = await post(s.url, '/v1/chat/completions', { messages: messagesFor(c, a.turns - 1), tools: c.tools, max_tokens: 1, temperature: 0 })
        .catch(() => null);
      if (r && r.usage.prompt_tokens + 2 * a.gen + 16 <= a.ctx) lo = mid; else hi = mid;
    }
    conv = conversation(a, lo);
    await s.stop();
  }
  const res = { off: [], ram: [], ram_repeat: [], disk: [], disk_cold: [], disk_populate: [], whole: [], whole_repeat: [] };
  const load = [];
  for (let r = 0; r < a.rounds; r++) {
    {
      const s = await startServer(a, ['--cache-ram', '0']);
      const row = [];
      for (let k = 0, ans = []; k < a.turns; k++) row.push(await turn(s.url, a, conv, k, ans));
      res.off.push(row);
      await s.stop();
    }
    load.push(os.loadavg()[0]);
    {
      const s = await startServer(a, []);
      const row = [];
      for (let k = 0, ans = []; k < a.turns; k++) row.push(await turn(s.url, a, conv, k, ans));
      res.ram.push(row);
      res.ram_repeat.push(await turn(s.url, a, conv, 0, [{}]));
      await s.stop();
    }
    if (a.whole) {
      const s = await startServer(a, ['--no-partial-blocks']);
      const row = [];
      for (let k = 0, ans = []; k < a.turns; k++) row.push(await turn(s.url, a, conv, k, ans));
      res.whole.push(row);
      res.whole_repeat.push(await turn(s.url, a, conv, 0, [{}]));
      await s.stop();
    }
    {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-prefix-bench-'));
      let s = await startServer(a, ['--kv-cache-dir', dir]);
      const pop = [];
      for (let k = 0, ans = []; k < a.turns; k++) pop.push(await turn(s.url, a, conv, k, ans));
      res.disk_populate.push(pop);
      await s.stop();
      // The first request of a cold process (model pages, workspaces) is slow whatever it hits: once
      // cold, then on a second restart after one unrelated long request (a server that has served anything).
      s = await startServer(a, ['--kv-cache-dir', dir]);
      res.disk_cold.push(await turn(s.url, a, conv, 0, [{}]));
      await s.stop();
      s = await startServer(a, ['--kv-cache-dir', dir]);
      await post(s.url, '/v1/completions', { prompt: 'An unrelated request warms the process up. '.repeat(40), max_tokens: 2, temperature: 0 });
      const row = [];
      for (let k = 0, ans = []; k < a.turns; k++) row.push(await turn(s.url, a, conv, k, ans));
      res.disk.push(row);
      await s.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
  const col = (rows, k, f = 'ttft') => median(rows.map((row) => row[k][f]));
  console.log(`server args: ${a.serverArgs.join(' ') || '(defaults)'}`);
  console.log(`agent conversation: system ${conv.system.length} chars + ${conv.tools.length} tools, ${a.turns} turns, user turns of ${a.userChars} chars, ${a.gen} tokens per answer, ` +
    `context ${a.ctx}, ${a.rounds} rounds (median TTFT, engine ms)\n`);
  const W = a.whole;
  console.log(`| turn | prompt tokens | off: TTFT | RAM: TTFT (cached) |${W ? ' RAM, whole blocks: TTFT (cached) |' : ''} restarted, disk: TTFT (cached) |`);
  console.log(`|---|---|---|---|${W ? '---|' : ''}---|`);
  for (let k = 0; k < a.turns; k++)
    console.log(`| ${k + 1} | ${res.off[0][k].prompt} | ${col(res.off, k).toFixed(1)} | ${col(res.ram, k).toFixed(1)} (${res.ram[0][k].cached}) | ` +
      (W ? `${col(res.whole, k).toFixed(1)} (${res.whole[0][k].cached}) | ` : '') +
      `${col(res.disk, k).toFixed(1)} (${res.disk[0][k].cached}) |`);
  const t1 = col(res.ram, 0), t2 = col(res.ram, 1), rep = median(res.ram_repeat.map((x) => x.ttft)), disk1 = col(res.disk, 0);
  console.log(`\nturn 2 / turn 1 (RAM): ${(100 * t2 / t1).toFixed(1)} %  (target ≤ 10 %)`);
  // Per round too (the machine's load moves the medians): turn 2 / turn 1 of the same server.
  console.log(`  per round: ${res.ram.map((r) => (100 * r[1].ttft / r[0].ttft).toFixed(1)).join(', ')} %`);
  if (W) {
    console.log(`turn 2 / turn 1 (RAM, whole blocks): ${(100 * col(res.whole, 1) / col(res.whole, 0)).toFixed(1)} %; per round: ` +
      `${res.whole.map((r) => (100 * r[1].ttft / r[0].ttft).toFixed(1)).join(', ')} %`);
    for (let k = 1; k < a.turns; k++) {
      const pr = median(res.ram.map((r) => r[k].prompt - r[k].cached)), pw = median(res.whole.map((r) => r[k].prompt - r[k].cached));
      console.log(`  turn ${k + 1}: prefilled ${pr} tokens (partial) vs ${pw} (whole blocks)`);
    }
    console.log(`turn 1 repeated, whole blocks: ${median(res.whole_repeat.map((x) => x.ttft)).toFixed(1)} ms (cached ${res.whole_repeat[0].cached})`);
  }
  // Where turn 2's time goes: waiting for admission (TTFT − prompt_ms), and admission → first token
  // (the lookup and copy, the prefill of the uncached rows, the first token's sampling).
  for (const [name, rows] of [['RAM', res.ram], ...(W ? [['whole blocks', res.whole]] : []), ['off', res.off]]) {
    const q = median(rows.map((r) => r[1].ttft - r[1].prompt_ms)), pm = median(rows.map((r) => r[1].prompt_ms));
    const n = median(rows.map((r) => r[1].prompt - r[1].cached));
    console.log(`turn 2, ${name}: queue ${q.toFixed(2)} ms, admission to first token ${pm.toFixed(1)} ms for ${n} prefilled tokens (${(pm / n).toFixed(3)} ms/token)`);
  }
  console.log(`1-minute load average at the start of each round: ${load.map((x) => x.toFixed(1)).join(', ')} (${os.cpus().length} cores)`);
  const cold = median(res.disk_cold.map((x) => x.ttft));
  console.log(`turn 1 repeated: RAM hit ${rep.toFixed(1)} ms (cached ${res.ram_repeat[0].cached}), restarted server (disk) ${disk1.toFixed(1)} ms ` +
    `(cached ${res.disk[0][0].cached}): ${(disk1 / rep).toFixed(2)}x  (target ≤ 2x); as the cold process's very first request ${cold.toFixed(1)} ms ` +
    `(cached ${res.disk_cold[0].cached}), off-mode cold turn 1 ${col(res.off, 0).toFixed(1)} ms`);
  if (a.json) fs.writeFileSync(a.json, JSON.stringify({ args: a, conv: { system_chars: conv.system.length }, res }, null, 1));
}

main().catch((e) => { console.error(e); process.exit(1); });
