// live_test.mjs - what the chat page's live view reads, checked against the server's own
// numbers (run by run_server_tests.sh):
//   - the prompt's progress in SSE comments on all three streaming APIs, beside each API's own
//     keep-alive (Anthropic's ping event, the Responses keepalive event);
//   - /metrics moving while a request runs (the engine's counters refreshed between forward
//     passes; the running job's prompt ids done of its total);
//   - GET /v1/routes: the route counts of the rows a reply evaluated (each MoE layer's counts sum
//     to k x the rows, the rows equal the positions /metrics counted for the request);
//   - GET /v1/plan: the plan, its text, the model's numbers and its card (the model folder's
//     README.md, byte for byte; null when there is none).
// DELTAFIN_URL_PREFILL: a server evaluating one position per pass (--batch 1 --threads 1
// --ping-ms 100) on the tiny test model, idle; DELTAFIN_BIN starts one on models/k3-mini for the card.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

const U = process.env.DELTAFIN_URL_PREFILL ?? 'http://127.0.0.1:8080';
const BIN = process.env.DELTAFIN_BIN ?? 'build/deltafin';

async function metrics(url = U) {
  const t = await (await fetch(url + '/metrics')).text();
  const m = {};
  for (const l of t.split('\n')) if (l && l[0] !== '#') m[l.slice(0, l.lastIndexOf(' '))] = Number(l.slice(l.lastIndexOf(' ') + 1));
  return m;
}

// POST a streaming request; polls /metrics every 50 ms while it runs.  Returns the raw SSE text
// and the readings taken before the stream ended.
async function streamWithReadings(path, body) {
  const readings = [];
  let done = false;
  const poller = (async () => {
    while (!done) {
      const m = await metrics();
      if (!done) readings.push(m);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  const r = await fetch(U + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  assert.equal(r.status, 200);
  const text = await r.text();
  done = true;
  await poller;
  return { text, readings };
}

const progress = (text) => text.split('\n').filter((l) => l.startsWith(': ping {')).map((l) => JSON.parse(l.slice(7)));
const longText = 'the quick brown fox jumps over the lazy dog '.repeat(120);

function checkProgress(p, total) {
  assert.ok(p.length >= 2, `${p.length} progress comments`);
  for (const x of p) assert.equal(x.prompt_total, total);
  for (let i = 1; i < p.length; i++) assert.ok(p[i].prompt_done >= p[i - 1].prompt_done, 'ids done never go back');
  assert.ok(p.some((x) => x.prompt_done > 0 && x.prompt_done < total), 'a comment inside the prompt');
}

test('/v1/messages: progress comments beside Anthropic\'s ping events; /metrics moves during the prompt; the reply\'s routes', async () => {
  const m0 = await metrics();
  const { text, readings } = await streamWithReadings('/v1/messages',
    { model: 'x', max_tokens: 3, stream: true, messages: [{ role: 'user', content: longText + 'one' }] });
  const start = JSON.parse(text.split('\n').find((l) => l.startsWith('data: {"type":"message_start"')).slice(6)).message;
  const total = start.usage.input_tokens + start.usage.cache_read_input_tokens;
  checkProgress(progress(text), total);
  assert.ok(text.includes('event: ping\ndata: {"type":"ping"}'), 'Anthropic\'s own ping events still come');
  // every event the SDK reads is still an event: a comment never sits inside one
  for (const block of text.split('\n\n').filter((b) => b.trim()))
    assert.ok(block.startsWith(': ping') || block.startsWith('event: '), `a block that is neither: ${block.slice(0, 80)}`);
  const m1 = await metrics();
  // a reading taken while the prompt was evaluated: the job's progress, and the engine's counters
  // already past their value before the request (they used to change only when a job ended)
  const mid = readings.filter((m) => m.deltafin_running_prompt_total === total && m.deltafin_running_prompt_done < total);
  assert.ok(mid.length >= 1, `no reading inside the prompt: ${JSON.stringify(readings.map((m) => m.deltafin_running_prompt_done))}`);
  assert.ok(mid.some((m) => m.deltafin_positions_evaluated_total > m0.deltafin_positions_evaluated_total
    && m.deltafin_positions_evaluated_total < m1.deltafin_positions_evaluated_total), 'positions evaluated move during the request');
  assert.equal(m1.deltafin_running_prompt_total, 0, 'no job running: the gauges are 0');
  // the routes of the rows this request evaluated
  const rt = await (await fetch(`${U}/v1/routes?id=${start.id}`)).json();
  assert.equal(rt.id, start.id);
  assert.equal(rt.rows, m1.deltafin_positions_evaluated_total - m0.deltafin_positions_evaluated_total, 'rows = positions evaluated');
  assert.equal(rt.counts.length, rt.moe_layers.length);
  for (const row of rt.counts) {
    assert.equal(row.length, rt.experts);
    assert.equal(row.reduce((a, b) => a + b, 0), rt.rows * rt.top_k, 'each MoE layer: k routes a row');
  }
  const last = await (await fetch(`${U}/v1/routes`)).json();
  assert.equal(last.id, start.id, 'without ?id: the last reply finished');
  const gone = await fetch(`${U}/v1/routes?id=msg_nosuch`);
  assert.equal(gone.status, 404);
  assert.match((await gone.json()).error.message, /no routes kept for msg_nosuch/);
});

test('/v1/responses and /v1/chat/completions: progress comments during the prompt (Responses: beside its keepalive events)', async () => {
  const { text } = await streamWithReadings('/v1/responses', { model: 'x', max_output_tokens: 2, stream: true, input: longText + 'two' });
  const p = progress(text);
  assert.ok(text.includes('event: keepalive'), 'keepalive events still come');
  const done = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6))).find((e) => e.type === 'response.completed' || e.type === 'response.incomplete');
  checkProgress(p, done.response.usage.input_tokens);
  const c = await streamWithReadings('/v1/chat/completions', { max_tokens: 2, stream: true, messages: [{ role: 'user', content: longText + 'three' }] });
  assert.ok(progress(c.text).length >= 2);
});

async function freePort() {
  return new Promise((res) => { const s = createServer(); s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); }); });
}

test('GET /v1/plan: the plan, its text and the model card (the model folder\'s README.md, or null)', async () => {
  const tiny = await (await fetch(U + '/v1/plan')).json();
  assert.equal(tiny.card, null, 'the test checkpoint has no README.md');
  assert.equal(tiny.plan.ok, true);
  assert.equal(tiny.plan.ctx, tiny.info.context);
  assert.match(tiny.plan_text, /memory plan for --mem/);
  assert.ok(tiny.info.layers > 0 && tiny.info.experts > 0 && tiny.info.experts_per_token > 0);
  const port = await freePort();
  const srv = spawn(BIN, ['serve', '--model', 'models/k3-mini', '--port', String(port), '--ctx', '2048'], { stdio: 'ignore' });
  try {
    let plan;
    for (let i = 0; i < 100 && !plan; i++) {
      await new Promise((r) => setTimeout(r, 100));
      try { const r = await fetch(`http://127.0.0.1:${port}/v1/plan`); if (r.ok) plan = await r.json(); } catch { /* not up yet */ }
    }
    assert.ok(plan, 'the k3-mini server answered');
    assert.equal(plan.card, readFileSync('models/k3-mini/README.md', 'utf8'));
    assert.equal(plan.plan.ctx, 2048);
    assert.equal(plan.path, 'models/k3-mini');
  } finally { srv.kill(); }
});
