// server_test.mjs - client-SDK tests for `deltafin serve` (run by run_server_tests.sh).
//
// Talks to a running server; starts nothing itself except `deltafin run` for the
// greedy comparison.  Environment:
//   DELTAFIN_URL      base URL of a server started with --queue 4 --max-request-bytes 1M
//   DELTAFIN_URL_KEY  base URL of a second server started with --api-key test-key (optional)
//   DELTAFIN_PID      the first server's pid (RSS check; optional)
//   DELTAFIN_BIN, DELTAFIN_MODEL  the binary and model for the `run --chat` comparison
// The test model has random weights: outputs are noise, so the tests check
// shapes, determinism and agreement between paths, never text quality.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL_ = process.env.DELTAFIN_URL ?? 'http://127.0.0.1:8080';
const URL_KEY = process.env.DELTAFIN_URL_KEY;
const PID = process.env.DELTAFIN_PID;
const BIN = process.env.DELTAFIN_BIN ?? 'build/deltafin';
const MODEL = process.env.DELTAFIN_MODEL ?? 'testdata/k3-tiny-a/checkpoint';

const oa = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'unused', maxRetries: 0 });
const an = new Anthropic({ baseURL: URL_, apiKey: 'unused', maxRetries: 0 });
const user = (content) => [{ role: 'user', content }];

async function post(path, body, headers = {}) {
  const r = await fetch(`${URL_}${path}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* SSE or not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

async function metric(name) {
  const t = await (await fetch(`${URL_}/metrics`)).text();
  const m = t.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
  assert.ok(m, `metric ${name} missing`);
  return Number(m[1]);
}

function openaiError(r, param) {
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.type, 'invalid_request_error');
  assert.equal(typeof r.json.error.message, 'string');
  assert.ok('code' in r.json.error && 'param' in r.json.error);
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
}

async function collectChat(params) {
  const stream = await oa.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let reasoning = '', content = '', finish = null, usage = null, roles = 0, n = 0, lp = [];
  for await (const c of stream) {
    n++;
    if (c.usage) { usage = c.usage; assert.equal(c.choices.length, 0); continue; }
    const ch = c.choices[0];
    assert.equal(c.object, 'chat.completion.chunk');
    if (ch.delta.role) roles++;
    if (ch.delta.reasoning_content) reasoning += ch.delta.reasoning_content;
    if (ch.delta.content) content += ch.delta.content;
    if (ch.logprobs?.content) lp.push(...ch.logprobs.content);
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { reasoning, content, finish, usage, roles, n, lp };
}

test('health, models, page, metrics', async () => {
  const h = await fetch(`${URL_}/health`);
  assert.equal(h.status, 200);
  const models = await oa.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].object, 'model');
  // the fixture's trunk is as shipped (F32/BF16): not a quantized one
  assert.match(models.data[0].trunk, /^(f32|bf16)(\+(f32|bf16))?$/);
  assert.equal(models.data[0].trunk_quantized, false);
  // and its experts are the released MXFP4 ones
  assert.equal(models.data[0].experts, 'mxfp4');
  assert.equal(models.data[0].experts_requantized, false);
  const page = await (await fetch(`${URL_}/`)).text();
  // the chat page (web/; page_test.mjs drives it): one file, script and styles inline
  assert.match(page, /<html[ >]/);
  assert.match(page, /getReader/);
  assert.doesNotMatch(page, /<script[^>]*\bsrc=|<link[^>]*\bhref="?https?:|url\(\s*["']?https?:|@import/i,
    'the page loads nothing from elsewhere');
  assert.ok((await metric('deltafin_queue_length')) >= 0);
});

test('chat: non-streaming, reasoning_content separate, usage', async () => {
  const r = await oa.chat.completions.create({ model: 'x', messages: user('Hello there'), max_tokens: 12 });
  assert.equal(r.object, 'chat.completion');
  const m = r.choices[0].message;
  assert.equal(m.role, 'assistant');
  assert.equal(typeof m.reasoning_content, 'string');
  assert.ok(m.reasoning_content.length > 0, 'random weights stay in the think channel');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
});

test('chat: streaming equals non-streaming (greedy), final usage chunk', async () => {
  const p = { model: 'x', messages: user('Tell me a story'), max_tokens: 20 };
  const a = await oa.chat.completions.create(p);
  const s = await collectChat(p);
  assert.equal(s.roles, 1);
  assert.equal(s.reasoning, a.choices[0].message.reasoning_content ?? '');
  assert.equal(s.content, a.choices[0].message.content ?? '');
  assert.equal(s.finish, 'length');
  assert.deepEqual(s.usage.completion_tokens, 20);
  assert.equal(s.usage.prompt_tokens, a.usage.prompt_tokens);
});

test('chat: greedy output equals `deltafin run --chat`', async () => {
  const prompt = 'What is 2+2?', N = 24;
  const r = await oa.chat.completions.create({ model: 'x', messages: user(prompt), max_tokens: N });
  // run --chat: reasoning on stderr after the plan's one log line, the answer on stdout plus a newline
  const p = spawnSync(BIN, ['run', '--model', MODEL, '--chat', '--prompt', prompt, '--max-new', String(N)], { encoding: 'utf8' });
  assert.equal(p.status, 0, p.stderr);
  assert.match(p.stderr, /^deltafin: plan: --mem /);
  const reasoning = p.stderr.replace(/^deltafin: plan: .*\n/, '');
  const m = r.choices[0].message;
  assert.equal((m.reasoning_content ?? '') + '|' + (m.content ?? ''), reasoning + '|' + p.stdout.replace(/\n$/, ''));
});

test('chat: seeded sampling equals `deltafin run --chat --temp --top-p --seed` (one sampler)', async () => {
  const prompt = 'Tell me a story', N = 24;
  const r = await oa.chat.completions.create({ model: 'x', messages: user(prompt), max_tokens: N, temperature: 0.8,
    top_p: 0.9, seed: 42 });
  const p = spawnSync(BIN, ['run', '--model', MODEL, '--chat', '--prompt', prompt, '--max-new', String(N),
    '--temp', '0.8', '--top-p', '0.9', '--seed', '42'], { encoding: 'utf8' });
  assert.equal(p.status, 0, p.stderr);
  const reasoning = p.stderr.replace(/^deltafin: plan: .*\n/, '');
  const m = r.choices[0].message;
  assert.equal((m.reasoning_content ?? '') + '|' + (m.content ?? ''), reasoning + '|' + p.stdout.replace(/\n$/, ''));
  // and the sample differs from greedy
  const g = await oa.chat.completions.create({ model: 'x', messages: user(prompt), max_tokens: N });
  assert.notEqual((g.choices[0].message.reasoning_content ?? '') + (g.choices[0].message.content ?? ''),
    (m.reasoning_content ?? '') + (m.content ?? ''));
});

test('completions: non-streaming and streaming agree', async () => {
  const a = await oa.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 16 });
  assert.equal(a.object, 'text_completion');
  assert.equal(a.usage.completion_tokens, 16);
  const stream = await oa.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 16, stream: true,
    stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) { text += ch.text; if (ch.finish_reason) finish = ch.finish_reason; }
  }
  assert.equal(text, a.choices[0].text);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 16);
});

test('messages: non-streaming and streaming events', async () => {
  const p = { model: 'x', max_tokens: 14, system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }] }], thinking: { type: 'enabled', budget_tokens: 2048 },
    metadata: { user_id: 'u1' } };
  const a = await an.messages.create(p);
  assert.equal(a.type, 'message');
  assert.equal(a.role, 'assistant');
  assert.equal(a.stop_reason, 'max_tokens');
  assert.equal(a.usage.output_tokens, 14);
  assert.equal(a.content[0].type, 'thinking');
  const names = [];
  let thinking = '', text = '';
  const stream = an.messages.stream(p);
  for await (const ev of stream) {
    names.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'thinking_delta') thinking += ev.delta.thinking;
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
  }
  const fin = await stream.finalMessage();
  assert.equal(names[0], 'message_start');
  assert.equal(names.at(-1), 'message_stop');
  assert.equal(names.at(-2), 'message_delta');
  assert.equal(names.filter((n) => n === 'content_block_start').length, names.filter((n) => n === 'content_block_stop').length);
  assert.equal(thinking, a.content[0].thinking);
  assert.equal(fin.stop_reason, 'max_tokens');
  assert.equal(fin.usage.output_tokens, 14);
  const t = a.content.find((b) => b.type === 'text');
  assert.equal(text, t ? t.text : '');
  // without thinking the prompt opens the response channel: text blocks only
  const b = await an.messages.create({ model: 'x', max_tokens: 6, messages: [{ role: 'user', content: 'Hi' }] });
  assert.ok(b.content.every((c) => c.type === 'text'));
});

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

test('tools: OpenAI request path and round trip shape', async () => {
  const plain = await oa.chat.completions.create({ model: 'x', messages: user('Weather in Paris?'), max_tokens: 4 });
  const r = await oa.chat.completions.create({ model: 'x', messages: user('Weather in Paris?'), max_tokens: 8, tools,
    tool_choice: 'required', parallel_tool_calls: false });
  assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens + 20, 'the tool declaration is rendered into the prompt');
  assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
  for (const c of r.choices[0].message.tool_calls ?? []) {
    assert.equal(c.type, 'function');
    JSON.parse(c.function.arguments);
  }
  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
  ];
  const r2 = await oa.chat.completions.create({ model: 'x', messages: history, max_tokens: 8, tools });
  assert.equal(r2.object, 'chat.completion');
  assert.ok(r2.usage.prompt_tokens > r.usage.prompt_tokens);
  const s = await collectChat({ model: 'x', messages: history, max_tokens: 8, tools });
  assert.equal(s.reasoning, r2.choices[0].message.reasoning_content ?? '');
});

test('tools: Anthropic tool_use / tool_result mapping', async () => {
  const atools = [{ name: 'get_weather', description: 'Weather for a city', cache_control: { type: 'ephemeral' },
    input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const r = await an.messages.create({ model: 'x', max_tokens: 8, tools: atools, tool_choice: { type: 'any' },
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: [{ type: 'thinking', thinking: 'call it', signature: 'x' },
        { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '21 C' }] },
    ] });
  assert.equal(r.type, 'message');
  for (const b of r.content) {
    assert.ok(['text', 'thinking', 'tool_use'].includes(b.type));
    if (b.type === 'tool_use') assert.equal(typeof b.input, 'object');
  }
  // a named tool must be one of the tools (forcing one is structured_test.mjs's)
  const bad = await post('/v1/messages', { model: 'x', max_tokens: 4, tool_choice: { type: 'tool', name: 'get_rain' },
    tools: atools, messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.type, 'error');
  assert.match(bad.json.error.message, /get_rain/);
});

test('stop sequences: cut before the stop, not emitted', async () => {
  const full = (await oa.completions.create({ model: 'x', prompt: 'The quick brown fox', max_tokens: 40 })).choices[0].text;
  const cps = [...full];
  const stop = cps.slice(10, 13).join('');
  const expect = full.slice(0, full.indexOf(stop));
  const r = await oa.completions.create({ model: 'x', prompt: 'The quick brown fox', max_tokens: 40, stop: [stop] });
  assert.equal(r.choices[0].text, expect);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const st = await oa.completions.create({ model: 'x', prompt: 'The quick brown fox', max_tokens: 40, stop, stream: true });
  let text = '';
  for await (const c of st) for (const ch of c.choices) text += ch.text;
  assert.equal(text, expect);
  // chat: the reasoning channel is cut the same way
  const chat = await oa.chat.completions.create({ model: 'x', messages: user('Count'), max_tokens: 40 });
  const rc = chat.choices[0].message.reasoning_content;
  const stop2 = [...rc].slice(12, 14).join('');
  const r2 = await oa.chat.completions.create({ model: 'x', messages: user('Count'), max_tokens: 40, stop: stop2 });
  assert.equal(r2.choices[0].message.reasoning_content ?? '', rc.slice(0, rc.indexOf(stop2)));
  assert.equal(r2.choices[0].finish_reason, 'stop');
  const m = await an.messages.create({ model: 'x', max_tokens: 40, thinking: { type: 'enabled', budget_tokens: 1024 },
    messages: user('Count'), stop_sequences: [stop2] });
  if (m.stop_reason === 'stop_sequence') assert.equal(m.stop_sequence, stop2);
});

test('logprobs: log-softmax, top alternatives, greedy picks the best', async () => {
  const r = await oa.chat.completions.create({ model: 'x', messages: user('Hi'), max_tokens: 8, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 8);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    assert.ok(e.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0) <= 1 + 1e-9);
    assert.ok(Array.isArray(e.bytes));
  }
  const s = await collectChat({ model: 'x', messages: user('Hi'), max_tokens: 8, logprobs: true, top_logprobs: 3 });
  assert.deepEqual(s.lp.map((e) => e.logprob), lp.map((e) => e.logprob));
  const c = await oa.completions.create({ model: 'x', prompt: 'abc', max_tokens: 5, logprobs: 2 });
  assert.equal(c.choices[0].logprobs.tokens.length, 5);
  assert.equal(c.choices[0].logprobs.token_logprobs.length, 5);
  assert.equal(Object.keys(c.choices[0].logprobs.top_logprobs[0]).length > 0, true);
});

test('sampling: temperature 0.8 is reproducible for a seed', async () => {
  const p = { model: 'x', prompt: 'Random words:', max_tokens: 30, temperature: 0.8, top_p: 0.95 };
  const a = await oa.completions.create({ ...p, seed: 1234 });
  const b = await oa.completions.create({ ...p, seed: 1234 });
  const c = await oa.completions.create({ ...p, seed: 99 });
  const g = await oa.completions.create({ ...p, temperature: 0 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);
  assert.notEqual(a.choices[0].text, g.choices[0].text);
  const x = await oa.chat.completions.create({ model: 'x', messages: user('Hi'), max_tokens: 20, temperature: 0.8, seed: 7 });
  const y = await collectChat({ model: 'x', messages: user('Hi'), max_tokens: 20, temperature: 0.8, seed: 7 });
  assert.equal(y.reasoning, x.choices[0].message.reasoning_content ?? '');
});

test('conversation reuse: an extended prompt feeds only the new suffix', async () => {
  const ids = Array.from({ length: 40 }, (_, i) => (i * 7) % 200);
  await post('/v1/completions', { prompt: ids, max_tokens: 1 });
  const r = await post('/v1/completions', { prompt: [...ids, 5, 6], max_tokens: 3 });
  assert.equal(r.status, 200);
  assert.equal(r.json.usage.prompt_tokens_details.cached_tokens, 40);
  const r2 = await post('/v1/completions', { prompt: [9, ...ids], max_tokens: 3 });
  assert.equal(r2.json.usage.prompt_tokens_details.cached_tokens, 0);
  // the reused and the fresh paths agree
  const fresh = await post('/v1/completions', { prompt: [...ids, 5, 6], max_tokens: 3 });
  assert.equal(fresh.json.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(fresh.json.choices[0].text, r.json.choices[0].text);
});

test('three turns (OpenAI and Anthropic, reasoning on): later turns evaluate only their new tokens, replies as a fresh session gives', async () => {
  assert.ok(URL_KEY, 'DELTAFIN_URL_KEY (the second server) is set');
  // the second server (--parallel 1) answers each full history with nothing reused (an
  // unrelated request first), the first one reuses its conversation
  const oaFresh = new OpenAI({ baseURL: `${URL_KEY}/v1`, apiKey: 'test-key', maxRetries: 0 });
  const anFresh = new Anthropic({ baseURL: URL_KEY, apiKey: 'test-key', maxRetries: 0 });
  const unrelated = () => oaFresh.completions.create({ model: 'x', prompt: [1, 2, 3], max_tokens: 1 });
  const turns = ['Hello there', 'Tell me more about it', 'And how does it end?'];
  let hist = [], prev = 0;
  for (const [i, t] of turns.entries()) {
    hist.push({ role: 'user', content: t });
    const r = await oa.chat.completions.create({ model: 'x', messages: hist, max_tokens: 16 });
    await unrelated();
    const f = await oaFresh.chat.completions.create({ model: 'x', messages: hist, max_tokens: 16 });
    const m = r.choices[0].message, fm = f.choices[0].message;
    assert.equal(f.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(m.content, fm.content, `turn ${i + 1}`);
    assert.equal(m.reasoning_content, fm.reasoning_content, `turn ${i + 1}`);
    const cached = r.usage.prompt_tokens_details.cached_tokens;
    if (i > 0) {
      // everything up to the end of the previous user message was kept
      assert.ok(cached > prev - 16 && cached < prev, `turn ${i + 1}: ${cached} cached of ${r.usage.prompt_tokens}, previous prompt ${prev}`);
    }
    prev = r.usage.prompt_tokens;
    hist.push({ role: 'assistant', content: m.content ?? '', reasoning_content: m.reasoning_content });
  }
  // the Anthropic API: cache_read_input_tokens, input_tokens the rest
  let msgs = [];
  prev = 0;
  for (const [i, t] of turns.entries()) {
    msgs.push({ role: 'user', content: t });
    const r = await an.messages.create({ model: 'x', max_tokens: 16, messages: msgs });
    await unrelated();
    const f = await anFresh.messages.create({ model: 'x', max_tokens: 16, messages: msgs });
    assert.deepEqual(r.content, f.content, `turn ${i + 1}`);
    assert.equal(f.usage.cache_read_input_tokens, 0);
    const total = r.usage.input_tokens + r.usage.cache_read_input_tokens;
    assert.equal(total, f.usage.input_tokens);
    if (i > 0) assert.ok(r.usage.cache_read_input_tokens > prev - 16, `turn ${i + 1}: ${r.usage.cache_read_input_tokens} read of ${total}`);
    prev = total;
    const text = r.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    msgs.push({ role: 'assistant', content: text || '.' });
  }
});

test('a history edited in the middle reuses everything before the changed message (checkpoints taken inside the pass)', async () => {
  assert.ok(URL_KEY, 'DELTAFIN_URL_KEY (the second server) is set');
  const oaFresh = new OpenAI({ baseURL: `${URL_KEY}/v1`, apiKey: 'test-key', maxRetries: 0 });
  const unrelated = () => oaFresh.completions.create({ model: 'x', prompt: [1, 2, 3], max_tokens: 1 });
  const long = (k) => `Tool output ${k}: ` + 'line of a file that the agent read earlier; '.repeat(12);
  const hist = [
    { role: 'system', content: 'You are a coding agent. ' + 'Follow the rules of the repository. '.repeat(10) },
    { role: 'user', content: 'Look at the first file.' },
    { role: 'assistant', content: long(1) },
    { role: 'user', content: 'Now the second one.' },
    { role: 'assistant', content: long(2) },
    { role: 'user', content: 'And the third.' },
    { role: 'assistant', content: long(3) },
    { role: 'user', content: 'Summarise them.' },
  ];
  const first = await oa.chat.completions.create({ model: 'x', messages: hist, max_tokens: 4 });
  assert.equal(first.choices[0].finish_reason.length > 0, true);
  // the prefix before the edited message, as a prompt: its messages, then the assistant's opening
  const before = await oaFresh.chat.completions.create({ model: 'x', messages: hist.slice(0, 4), max_tokens: 1 });
  // the second file's output cleared, as agents do with old tool results
  const edited = hist.map((m, i) => (i === 4 ? { ...m, content: '[cleared]' } : m));
  const r = await oa.chat.completions.create({ model: 'x', messages: edited, max_tokens: 8 });
  const cached = r.usage.prompt_tokens_details.cached_tokens;
  const upTo = before.usage.prompt_tokens;
  assert.ok(cached > upTo - 16 && cached <= upTo,
    `${cached} cached of ${r.usage.prompt_tokens}: the prefix up to the edited message is ${upTo} tokens (with its opening)`);
  // the same reply as a fresh session
  await unrelated();
  const f = await oaFresh.chat.completions.create({ model: 'x', messages: edited, max_tokens: 8 });
  assert.equal(f.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(r.choices[0].message.content, f.choices[0].message.content);
  assert.equal(r.choices[0].message.reasoning_content, f.choices[0].message.reasoning_content);
});

// Two sessions of one agent that begin alike (the same system prompt and first message) and say
// who they are (prompt_cache_key; Anthropic's metadata.user_id, which names Claude Code's
// session): the second takes the first's prefix into another slot instead of rewinding the first
// one's conversation, so the first one's next turn still reuses all of its own history.
for (const api of ['openai', 'anthropic']) {
  test(`conversation keys (${api === 'openai' ? 'prompt_cache_key' : 'metadata.user_id'}): a session that begins like another does not take its history`, async () => {
    const system = `You are agent ${api}. ` + 'Keep to the task. '.repeat(20);
    const ask = async (key, msgs) => {
      if (api === 'openai') {
        const r = await oa.chat.completions.create({ model: 'x', messages: [{ role: 'system', content: system }, ...msgs],
          max_tokens: 6, prompt_cache_key: key });
        return { cached: r.usage.prompt_tokens_details.cached_tokens, prompt: r.usage.prompt_tokens };
      }
      const r = await an.messages.create({ model: 'x', system, messages: msgs, max_tokens: 6, metadata: { user_id: key } });
      return { cached: r.usage.cache_read_input_tokens, prompt: r.usage.input_tokens + r.usage.cache_read_input_tokens };
    };
    const u1 = { role: 'user', content: 'Read the build script and tell me what it does.' };
    const a1 = { role: 'assistant', content: 'It compiles the sources.' };
    const u2 = { role: 'user', content: 'Which compiler flags does it pass?' };
    const a2 = { role: 'assistant', content: 'Warnings as errors.' };
    const u3 = { role: 'user', content: 'Thanks.' };
    await ask(`${api}-A`, [u1]);
    const t2 = await ask(`${api}-A`, [u1, a1, u2]);
    const b1 = await ask(`${api}-B`, [u1]); // B begins exactly as A did
    assert.ok(b1.cached > 0, `B reuses A's first prompt: ${b1.cached}`);
    const t3 = await ask(`${api}-A`, [u1, a1, u2, a2, u3]);
    assert.ok(t3.cached > t2.prompt - 16, `A's third turn: ${t3.cached} cached of ${t3.prompt}, its second prompt was ${t2.prompt}`);
  });
}

test('two interleaved conversations (--parallel 2) keep their prefixes', async () => {
  const system = 'You are a careful assistant. ' + 'Follow the rules of the house. '.repeat(20);
  const conv = { a: [{ role: 'system', content: system }], b: [{ role: 'system', content: system }] };
  const last = {};
  for (const turn of ['first', 'second', 'third']) {
    for (const k of ['a', 'b']) {
      conv[k].push({ role: 'user', content: `Conversation ${k}, ${turn} question` });
      const r = await oa.chat.completions.create({ model: 'x', messages: conv[k], max_tokens: 8 });
      const cached = r.usage.prompt_tokens_details.cached_tokens;
      if (last[k]) assert.ok(cached > last[k] - 16, `${k}, ${turn} turn: ${cached} cached, previous prompt ${last[k]}`);
      last[k] = r.usage.prompt_tokens;
      const m = r.choices[0].message;
      conv[k].push({ role: 'assistant', content: m.content ?? '', reasoning_content: m.reasoning_content });
    }
  }
  const t = await (await fetch(`${URL_}/metrics`)).text();
  assert.match(t, /^deltafin_conversations_kept 2$/m);
});

test('requests that used to end the server (a number past a double, nesting at the limit) get 400; it keeps serving', async () => {
  const base = { model: 'm', max_tokens: 4, messages: user('hi') };
  const inf = await post('/v1/messages', `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}],`
    + `"tools":[{"name":"t","input_schema":{"x":1e999}}]}`);
  assert.equal(inf.status, 400, inf.text);
  assert.equal(inf.json.type, 'error');
  assert.match(inf.json.error.message, /out of range/);
  const oaInf = await post('/v1/chat/completions', `{"messages":[{"role":"user","content":"hi"}],"temperature":1e999}`);
  openaiError(oaInf);
  let inner = '1';
  for (let i = 0; i < 61; i++) inner = `{"a":${inner}}`;
  const deep = await post('/v1/messages', `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}],`
    + `"tools":[{"name":"t","input_schema":${inner}}]}`);
  assert.equal(deep.status, 400, deep.text);
  assert.equal(deep.json.type, 'error');
  assert.match(deep.json.error.message, /nest/);
  const ok = await post('/v1/messages', base);
  assert.equal(ok.status, 200, ok.text);
  assert.equal((await fetch(`${URL_}/health`)).status, 200);
});

test('a prompt longer than the context can hold is refused by its bytes, before tokenizing', async () => {
  // this server has --max-request-bytes 1M: 900 KB of text passes the body cap and is
  // refused by the context's byte cap (n_ctx x the longest token), at once
  const t0 = Date.now();
  const r = await post('/v1/chat/completions', { messages: user('word '.repeat(180000)) });
  openaiError(r, 'messages');
  assert.equal(r.json.error.code, 'context_length_exceeded');
  assert.match(r.json.error.message, /--ctx/);
  const c = await post('/v1/completions', { prompt: 'x'.repeat(900000), max_tokens: 1 });
  openaiError(c, 'prompt');
  assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`);
});

test('errors: API-shaped 400s naming the field', async () => {
  const malformed = await post('/v1/chat/completions', '{"messages": [');
  openaiError(malformed);
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), max_tokens: 'ten' }), 'max_tokens');
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), frobnicate: 1 }), 'frobnicate');
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), n: 2 }), 'n');
  openaiError(await post('/v1/chat/completions', { messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }] }), 'messages');
  openaiError(await post('/v1/chat/completions', { messages: 'hi' }), 'messages');
  openaiError(await post('/v1/completions', { prompt: 'x', suffix: 'y' }), 'suffix');
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), temperature: 5 }), 'temperature');
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), tools: {} }), 'tools');
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), reasoning_effort: 'extreme' }), 'reasoning_effort');
  // every effort the SDKs allow maps onto K3's low/high/max (medium -> high)
  for (const eff of ['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max'])
    assert.equal((await post('/v1/chat/completions', { messages: user('hi'), reasoning_effort: eff, max_tokens: 1 })).status,
      200, `reasoning_effort ${eff}`);
  // a named tool must be one of the tools; a schema keyword the grammar cannot guarantee is named
  const noTool = await post('/v1/chat/completions', { messages: user('hi'), tool_choice: { type: 'function',
    function: { name: 'nosuch' } }, tools });
  openaiError(noTool, 'tool_choice');
  assert.match(noTool.json.error.message, /nosuch.*not among the tools/);
  const notKw = await post('/v1/chat/completions', { messages: user('hi'), response_format: { type: 'json_schema',
    json_schema: { name: 's', strict: true, schema: { type: 'object', properties: { a: { not: {} } } } } } });
  openaiError(notKw, 'response_format');
  assert.match(notKw.json.error.message, /"not".*properties\/a/);
  const rf = await post('/v1/chat/completions', { messages: user('hi'), max_tokens: 2, store: false, user: 'u',
    metadata: { a: 'b' }, service_tier: 'auto', response_format: { type: 'json_object' } });
  assert.equal(rf.status, 200, rf.text);
  const a = await post('/v1/messages', { messages: user('hi') });
  assert.equal(a.status, 400);
  assert.equal(a.json.type, 'error');
  assert.equal(a.json.error.type, 'invalid_request_error');
  assert.match(a.json.error.message, /max_tokens/);
  const img = await post('/v1/messages', { max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] });
  assert.equal(img.status, 400);
  assert.equal(img.json.type, 'error');
  await assert.rejects(oa.chat.completions.create({ model: 'x', messages: user('hi'), n: 2 }), (e) => e.status === 400);
  await assert.rejects(an.messages.create({ model: 'x', max_tokens: 4, messages: user('hi'), top_k: 5 }),
    (e) => e.status === 400 && e.error?.type === 'error');
  // 413: the server under test was started with --max-request-bytes 1M
  const big = await post('/v1/chat/completions', { messages: user('x'.repeat(2 << 20)) });
  assert.equal(big.status, 413);
  // wrong types are named, not rendered as whatever they happen to be (they used to answer 200)
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), max_tokens: 2, tools: [1] }), 'tools');
  openaiError(await post('/v1/chat/completions', { messages: user('hi'), max_tokens: 2,
    tools: [{ type: 'function', function: { name: 5 } }] }), 'tools');
  const badArgs = await post('/v1/chat/completions', { max_tokens: 2, messages: [...user('hi'),
    { role: 'assistant', tool_calls: [{ id: 'a', type: 'function', function: { name: 'f', arguments: 'not json' } }] },
    { role: 'tool', tool_call_id: 'a', content: 'x' }] });
  openaiError(badArgs, 'messages');
  assert.match(badArgs.json.error.message, /arguments/);
  const huge = await post('/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"max_tokens":99999999999999999999}');
  openaiError(huge, 'max_tokens');
  assert.match(huge.json.error.message, /out of range/);
  const numSchema = await post('/v1/messages', { max_tokens: 2, messages: user('hi'), tools: [{ name: 't', input_schema: 5 }] });
  assert.equal(numSchema.status, 400, numSchema.text);
  assert.match(numSchema.json.error.message, /input_schema/);
  const r404 = await fetch(`${URL_}/v1/nothing`);
  assert.equal(r404.status, 404);
});

test('api key: 401 without it (OpenAI and Anthropic shapes), 200 with it', { skip: !URL_KEY }, async () => {
  const bad = new OpenAI({ baseURL: `${URL_KEY}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: 'x', messages: user('hi'), max_tokens: 2 }), (e) => e.status === 401);
  const none = await fetch(`${URL_KEY}/v1/messages`, { method: 'POST', body: '{}' });
  assert.equal(none.status, 401);
  const j = await none.json();
  assert.equal(j.type, 'error');
  assert.equal(j.error.type, 'authentication_error');
  const good = new OpenAI({ baseURL: `${URL_KEY}/v1`, apiKey: 'test-key', maxRetries: 0 });
  const r = await good.chat.completions.create({ model: 'x', messages: user('hi'), max_tokens: 2 });
  assert.equal(r.usage.completion_tokens, 2);
  const ga = new Anthropic({ baseURL: URL_KEY, apiKey: 'test-key', maxRetries: 0 });
  const m = await ga.messages.create({ model: 'x', max_tokens: 2, messages: user('hi') });
  assert.equal(m.usage.output_tokens, 2);
  assert.equal((await fetch(`${URL_KEY}/health`)).status, 200);
});

test('queue: 50 concurrent requests with --queue 4 give 429s and no crash', async () => {
  const rs = await Promise.all(Array.from({ length: 50 }, (_, i) =>
    post('/v1/chat/completions', { messages: user(`request ${i}`), max_tokens: 24 })));
  const ok = rs.filter((r) => r.status === 200), busy = rs.filter((r) => r.status === 429);
  assert.equal(ok.length + busy.length, 50, rs.map((r) => r.status).join(','));
  assert.ok(busy.length > 0, 'some requests were rejected');
  assert.ok(ok.length >= 1);
  assert.equal(busy[0].headers.get('retry-after'), '1');
  assert.equal(busy[0].json.error.type, 'rate_limit_error');
  for (const r of ok) assert.equal(r.json.usage.completion_tokens, 24);
  assert.equal((await fetch(`${URL_}/health`)).status, 200);
});

test('disconnect mid-stream stops generation; the next request works', async () => {
  const before = await metric('deltafin_generated_tokens_total');
  const ctl = new AbortController();
  const r = await fetch(`${URL_}/v1/chat/completions`, { method: 'POST', signal: ctl.signal,
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: user('Write a long essay'), max_tokens: 3000, stream: true }) });
  const rd = r.body.getReader();
  let got = 0;
  while (got < 5) { const { value, done } = await rd.read(); if (done) break; got += (new TextDecoder().decode(value).match(/data: /g) ?? []).length; }
  ctl.abort();
  await new Promise((res) => setTimeout(res, 500));
  const a = await oa.chat.completions.create({ model: 'x', messages: user('Hello there'), max_tokens: 12 });
  assert.equal(a.usage.completion_tokens, 12);
  const after = await metric('deltafin_generated_tokens_total');
  assert.ok(after - before < 1500, `generation went on after the disconnect (${after - before} tokens)`);
  const b = await oa.chat.completions.create({ model: 'x', messages: user('Hello there'), max_tokens: 12 });
  assert.equal(b.choices[0].message.reasoning_content, a.choices[0].message.reasoning_content);
});

test('a non-streaming client that hangs up cancels its generation', async () => {
  const before = await metric('deltafin_generated_tokens_total');
  const ctl = new AbortController();
  const req = fetch(`${URL_}/v1/chat/completions`, { method: 'POST', signal: ctl.signal,
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: user('Write a long essay'), max_tokens: 3000 }) }).catch(() => null);
  await new Promise((res) => setTimeout(res, 300));
  ctl.abort();
  await req;
  await new Promise((res) => setTimeout(res, 800));
  const a = await oa.chat.completions.create({ model: 'x', messages: user('Hello there'), max_tokens: 4 });
  assert.equal(a.usage.completion_tokens, 4);
  const after = await metric('deltafin_generated_tokens_total');
  assert.ok(after - before < 2000, `generation went on after the hang-up (${after - before} tokens)`);
});

function rssKb() {
  const s = readFileSync(`/proc/${PID}/status`, 'utf8');
  return Number(s.match(/VmRSS:\s+(\d+)/)[1]);
}

test('1000 sequential requests: RSS does not grow', { skip: !PID && 'no DELTAFIN_PID (or a sanitizer build)' }, async () => {
  const one = (i) => (i % 3 === 0
    ? post('/v1/chat/completions', { messages: user(`q${i}`), max_tokens: 2, stream: i % 2 === 0 })
    : i % 3 === 1 ? post('/v1/completions', { prompt: `p${i}`, max_tokens: 2 })
      : post('/v1/messages', { max_tokens: 2, messages: user(`m${i}`), stream: i % 2 === 0 }));
  for (let i = 0; i < 30; i++) assert.equal((await one(i)).status, 200);
  const r0 = rssKb();
  let mid = 0;
  for (let i = 0; i < 1000; i++) {
    const r = await one(i);
    assert.equal(r.status, 200, r.text);
    if (i === 499) mid = rssKb();
  }
  const r1 = rssKb();
  console.log(`# RSS ${r0} kB -> ${mid} kB (500) -> ${r1} kB (1000 requests)`);
  assert.ok(r1 - r0 < 4096, `RSS grew by ${r1 - r0} kB (from ${r0} kB)`);
  assert.ok(r1 - mid < 2048, `RSS grew by ${r1 - mid} kB over the second 500 requests`);
});
