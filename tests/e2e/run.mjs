#!/usr/bin/env node
// CTest entry for the end-to-end tests: checks that the npm packages are installed (a missing
// install is a failure, never a skip), makes the tiny Qwen3-vocabulary model with `peregrine gguf
// synth`, starts the shared servers (stories260K, the Qwen3-vocabulary model, the bundled demo model), runs every *.test.mjs with node's test runner, stops the servers.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { here, peregrineBin, sharedPath, startServer, storiesModel, chatmlTemplate, qwen3Template, demoArgs } from './helpers.mjs';

for (const pkg of ['openai', '@anthropic-ai/sdk']) {
  if (!fs.existsSync(path.join(here, 'node_modules', pkg, 'package.json'))) {
    console.error(`tests/e2e/node_modules/${pkg} is missing: run scripts/install-npm.sh (npm ci in tests/e2e)`);
    console.log('0 passed, 1 failed');
    process.exit(1);
  }
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'peregrine-e2e-'));
const qwen3 = path.join(tmp, 'qwen3-tiny.gguf');
const synth = spawnSync(peregrineBin(), [
  'gguf', 'synth', '--arch', 'qwen3', '--layers', '2', '--dim', '64', '--ffn', '128', '--heads', '4', '--kv-heads', '2',
  '--head-dim', '16', '--ctx', '4096', '--type', 'F16', '--seed', '7', '--name', 'qwen3-tiny',
  '--vocab-from', sharedPath('testdata/tokenizer/ggml-vocab-qwen3.gguf'), '-o', qwen3,
], { encoding: 'utf8' });
if (synth.status !== 0) {
  console.error(`peregrine gguf synth failed (${synth.status}):\n${synth.stdout}\n${synth.stderr}`);
  console.log('0 passed, 1 failed');
  process.exit(1);
}

const servers = [];
let code = 1;
try {
  const stories = await startServer(['-m', storiesModel(), '--chat-template-file', chatmlTemplate(), '-np', '4', '-c', '512']);
  servers.push(stories);
  const q = await startServer(['-m', qwen3, '--chat-template-file', qwen3Template(), '-np', '2', '-c', '1024']);
  servers.push(q);
  const demo = await startServer(demoArgs);
  servers.push(demo);
  const files = fs.readdirSync(here).filter((f) => f.endsWith('.test.mjs')).sort().map((f) => path.join(here, f));
  const env = { ...process.env, E2E_STORIES_URL: stories.url, E2E_QWEN3_URL: q.url, E2E_QWEN3_MODEL: qwen3, E2E_DEMO_URL: demo.url };
  const child = spawn(process.execPath, ['--test', '--test-concurrency=1', ...files], { stdio: 'inherit', env });
  code = await new Promise((r) => child.on('exit', (c) => r(c ?? 1)));
} catch (e) {
  console.error(e);
  code = 1;
} finally {
  for (const s of servers) {
    const c = await s.stop();
    // A server that crashed during the tests fails the run even when every assertion passed.
    if (c !== 0 && c !== 'SIGTERM') {
      console.error(`server ${s.url} exited with ${c}:\n${s.log().slice(-4000)}`);
      code = 1;
    }
  }
  fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(code);
