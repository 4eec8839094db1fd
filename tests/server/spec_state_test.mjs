// spec_state_test.mjs - --spec-state in `serve` and `chat` (run by run_server_tests.sh).
//
// What the drafts' cost model and guard learned is kept in a file across runs
// (src/app/spec_state.c; `run` is tested in tests/test_spec.c cli_spec_state).
// Here the same two states are handed to a server and to an interactive chat:
// one where drafting paid (every width one pass, every draft right: drafts from
// the first token) and one where the guard held drafts off.  The first request
// must follow the state it was given, the reply must not change, and the file
// must be written back with what this run learned, other models' entries kept.
// Environment: DELTAFIN_BIN, DELTAFIN_MODEL.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.DELTAFIN_BIN ?? 'build/deltafin';
const MODEL = process.env.DELTAFIN_MODEL ?? 'testdata/k3-tiny-a/checkpoint';
const DRAFT = `model:${MODEL}`; // the model drafting for itself: every draft right

const VERDICTS = { paid: '"choice":1,"rounds":2,"last":1', held: '"choice":0,"rounds":2,"last":0' };
function stateFile(path, verdict) {
  const real = realpathSync(MODEL);
  writeFileSync(path, '{"deltafin_spec_state":1,"entries":[{"model":"/elsewhere","drafter":"ngram","kmax":1},\n' +
    `{"model":${JSON.stringify(real)},"drafter":${JSON.stringify(DRAFT)},"kmax":8,` +
    '"t_pass":[0,0.01,0.01,0.01,0.01,0.01,0.01,0.01,0.01,0.01],"t_count":[0,9,9,9,9,9,9,9,9,9],"acc":1,"acc_w":40,' +
    `"draft_tok_sec":0,"sh_cost":0,"guard":{"hold":5000,"hold_len":5000,${VERDICTS[verdict]},"mean":[0.01,0.005]}}]}\n`);
}
function checkWritten(path) {
  const body = readFileSync(path, 'utf8');
  assert.ok(body.includes('"model":"/elsewhere"'), `another model's entry was lost: ${body}`);
  assert.ok(body.includes(JSON.stringify(realpathSync(MODEL))), body);
  assert.ok(!body.includes('"hold":5000,"hold_len":5000'), `the state was not written back: ${body}`);
}

const freePort = () => new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});

async function withServer(args, fn) {
  const port = await freePort();
  const p = spawn(BIN, ['serve', '--model', MODEL, '--port', String(port), ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  p.stderr.on('data', (d) => { log += d; });
  const url = `http://127.0.0.1:${port}`;
  try {
    for (let i = 0; ; i++) {
      try { if ((await fetch(`${url}/health`)).status === 200) break; } catch { /* not up yet */ }
      assert.ok(i < 200 && p.exitCode === null, `the server did not start: ${log}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    return await fn(url);
  } finally {
    p.kill('SIGTERM');
    await new Promise((r) => (p.exitCode !== null ? r() : p.on('exit', r)));
  }
}

async function metric(url, name) {
  const t = await (await fetch(`${url}/metrics`)).text();
  const m = t.match(new RegExp(`^${name} (\\S+)`, 'm'));
  assert.ok(m, `no ${name} in /metrics`);
  return Number(m[1]);
}

const BODY = { max_tokens: 24, messages: [{ role: 'user', content: 'one two three one two three one two three' }] };

test('serve --spec-state: the first request follows the state given, and the state is written back', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'deltafin-spec-'));
  try {
    const st = join(dir, 'spec.json');
    const replies = {};
    for (const v of ['paid', 'held']) {
      stateFile(st, v);
      await withServer(['--draft', DRAFT, '--spec-state', st, '--parallel', '1'], async (url) => {
        const r = await fetch(`${url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(BODY) });
        assert.equal(r.status, 200);
        replies[v] = (await r.json()).choices[0].message;
        const proposed = await metric(url, 'deltafin_draft_proposed_total');
        if (v === 'paid') assert.ok(proposed > 0, 'a state where drafts paid: no draft in the first request');
        else assert.equal(proposed, 0, 'a state where the guard held drafts off: drafts proposed anyway');
      });
      checkWritten(st);
    }
    assert.deepEqual(replies.paid, replies.held); // drafts never change a token
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('chat --spec-state: the first reply follows the state given, and the state is written back', () => {
  const dir = mkdtempSync(join(tmpdir(), 'deltafin-spec-'));
  try {
    const st = join(dir, 'spec.json');
    const outs = {};
    for (const v of ['paid', 'held']) {
      stateFile(st, v);
      const p = spawnSync(BIN, ['chat', '--model', MODEL, '--draft', DRAFT, '--spec-state', st, '--max-new', '24'],
        { encoding: 'utf8', input: `${BODY.messages[0].content}\n/stats\n/quit\n` });
      assert.equal(p.status, 0, p.stderr);
      const m = p.stdout.match(/drafts \([^)]*\): (\d+) proposed/);
      assert.ok(m, `/stats printed no draft line: ${p.stdout}`);
      if (v === 'paid') assert.ok(Number(m[1]) > 0, p.stdout);
      else assert.equal(Number(m[1]), 0, p.stdout);
      outs[v] = p.stdout.split('\n')[0];
      checkWritten(st);
    }
    assert.equal(outs.paid, outs.held);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
