// responses_test.mjs - POST /v1/responses with the `openai` SDK (run by run_server_tests.sh).
//
// Talks to a running server started with --ctx 16384 --max-tokens 64 --parallel 2 --ping-ms 10
// (DELTAFIN_URL_RESP): the Codex-shaped fixture needs the larger context, --max-tokens caps
// the replies of requests that send no max_output_tokens (as Codex does), and the short ping
// interval makes keepalive events arrive during any prompt of a few thousand tokens.
// The test model has random weights: it never finishes a message or calls a tool, so replies
// are cut (status "incomplete") and the tool-call output path is test_server_emit.c's; these
// tests check shapes, event order, what is rendered (by input token counts) and prefix reuse.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const URL_ = process.env.DELTAFIN_URL_RESP ?? 'http://127.0.0.1:8080';
const oa = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'unused', maxRetries: 0 });
const fixture = JSON.parse(readFileSync(new URL('./fixtures/responses.codex_first_turn.json', import.meta.url), 'utf8'));
const user = (text, id) => ({ type: 'message', ...(id ? { id } : {}), role: 'user', content: [{ type: 'input_text', text }] });
const weather = { type: 'function', name: 'get_weather', description: 'The weather in a city', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
const inputTokens = async (p) => (await oa.responses.create({ model: 'x', max_output_tokens: 1, ...p })).usage.input_tokens;

// A raw SSE body: its events as {event, data} with data parsed (comment blocks, the progress
// pings during a prompt, are skipped as every SSE reader skips them).
function sse(text) {
  return text.split('\n\n').filter((b) => b.trim() && !b.split('\n').every((l) => l.startsWith(':'))).map((b) => {
    const ev = b.split('\n').find((l) => l.startsWith('event: '))?.slice(7);
    const data = b.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
    return { event: ev, data: JSON.parse(data) };
  });
}

// The rules the SDK's accumulator and Codex rely on.
function checkStream(events) {
  assert.equal(events[0].data.type, 'response.created');
  let seq = -1, open = 0;
  for (const { event, data } of events) {
    assert.equal(event, data.type, 'the event: line names the type');
    assert.equal(typeof data.sequence_number, 'number');
    assert.ok(data.sequence_number > seq, `sequence_number ${data.sequence_number} after ${seq}`);
    seq = data.sequence_number;
    if (data.type === 'response.output_item.added') assert.equal(data.output_index, open++);
  }
  const last = events.at(-1).data;
  assert.match(last.type, /^response\.(completed|incomplete)$/);
  assert.equal(last.response.output.length, open);
  const done = events.filter((e) => e.data.type === 'response.output_item.done').map((e) => e.data.item);
  assert.deepEqual(last.response.output, done, 'response.completed carries every finished item');
  return last.response;
}

test('responses.create: a Response object with reasoning, usage and the echoed request', async () => {
  const r = await oa.responses.create({ model: 'x', input: 'Hello there', max_output_tokens: 12, instructions: 'Be brief.' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'incomplete', 'random weights never finish within 12 tokens');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.output[0].type, 'reasoning');
  assert.deepEqual(r.output[0].summary, []);
  assert.equal(r.output[0].content[0].type, 'reasoning_text');
  assert.ok(r.output[0].content[0].text.length > 0);
  assert.equal(r.output[0].encrypted_content, undefined, 'only when include asks for it');
  assert.equal(r.usage.output_tokens, 12);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 12);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 12);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.instructions, 'Be brief.');
  assert.equal(r.max_output_tokens, 12);
  assert.equal(r.error, null);
  // instructions are rendered as a system message first
  assert.ok(r.usage.input_tokens > await inputTokens({ input: 'Hello there' }));
});

test('responses.stream + finalResponse: the SDK accepts the events; the same reply as non-streaming (greedy)', async () => {
  const p = { model: 'x', input: [user('Tell me a story', 'msg_1')], max_output_tokens: 16 };
  const a = await oa.responses.create(p);
  const stream = oa.responses.stream(p);
  const types = [];
  let deltas = '';
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.reasoning_text.delta') deltas += ev.delta;
  }
  const f = await stream.finalResponse();
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  for (const t of ['response.output_item.added', 'response.content_part.added', 'response.reasoning_text.done',
    'response.content_part.done', 'response.output_item.done'])
    assert.ok(types.includes(t), t);
  assert.equal(types.at(-1), 'response.incomplete');
  assert.equal(f.id.startsWith('resp_'), true);
  assert.deepEqual(f.output.map((o) => o.content), a.output.map((o) => o.content));
  assert.equal(deltas, a.output[0].content[0].text);
  const { input_tokens_details: _, ...usage } = f.usage, { input_tokens_details: __, ...usageA } = a.usage;
  assert.deepEqual(usage, usageA);
  assert.ok(f.usage.input_tokens_details.cached_tokens > 0, 'the second request reused the first one\'s prompt');
});

test('raw SSE: event lines, increasing sequence_number, output_index in order', async () => {
  // 12 streams: a keepalive (every 10 ms here) whose wait timed out just as an event was written once
  // went out before that event, numbered after it (seen once in CI; server.c's stream_reader re-checks)
  for (let i = 0; i < 12; i++) {
    const r = await fetch(`${URL_}/v1/responses`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ input: 'hi', max_output_tokens: 8, stream: true }) });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('content-type'), 'text/event-stream');
    const resp = checkStream(sse(await r.text()));
    assert.equal(resp.status, 'incomplete');
    assert.equal(resp.usage.output_tokens, 8);
  }
});

test('a function_call and its function_call_output (as Codex sends them back) render and answer', async () => {
  const call = { type: 'function_call', id: 'fc_1', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' };
  const out = { type: 'function_call_output', call_id: 'call_1', output: 'sunny, 21 C' };
  const base = { tools: [weather], input: [user('Weather in Paris?')] };
  const r = await oa.responses.create({ model: 'x', max_output_tokens: 4, ...base, input: [...base.input, call, out] });
  assert.ok(['incomplete', 'completed'].includes(r.status));
  assert.ok(r.usage.input_tokens > await inputTokens(base) + 10, 'the call and its result are in the prompt');
  // output as a list of input_text parts renders as the string does
  const parts = { ...out, output: [{ type: 'input_text', text: 'sunny, 21 C' }] };
  assert.equal(await inputTokens({ ...base, input: [...base.input, call, parts] }), r.usage.input_tokens);
});

test('namespace tools: offered as <namespace>__<name>; an incoming namespaced call maps back the same way', async () => {
  const inner = { type: 'function', name: 'spawn_agent', description: 'Spawn a sub-agent', strict: false,
    parameters: { type: 'object', properties: { task: { type: 'string' } }, required: ['task'] } };
  const ns = { type: 'namespace', name: 'multi_agent_v1', description: 'Sub-agents', tools: [inner] };
  const flat = { ...inner, name: 'multi_agent_v1__spawn_agent' };
  const input = [user('Start a helper')];
  const none = await inputTokens({ input });
  const withNs = await inputTokens({ input, tools: [ns] });
  assert.ok(withNs > none, `the namespace's tool is rendered (${withNs} > ${none})`);
  assert.equal(await inputTokens({ input, tools: [flat] }), withNs, 'exactly as a function named multi_agent_v1__spawn_agent');
  const callNs = { type: 'function_call', call_id: 'c1', name: 'spawn_agent', namespace: 'multi_agent_v1', arguments: '{"task":"x"}' };
  const callFlat = { type: 'function_call', call_id: 'c1', name: 'multi_agent_v1__spawn_agent', arguments: '{"task":"x"}' };
  const result = { type: 'function_call_output', call_id: 'c1', output: 'started' };
  const a = await inputTokens({ input: [...input, callNs, result], tools: [ns] });
  assert.equal(a, await inputTokens({ input: [...input, callFlat, result], tools: [ns] }));
  const r = await oa.responses.create({ model: 'x', max_output_tokens: 1, input, tools: [ns] });
  assert.deepEqual(r.tools.map((t) => t.type), ['namespace'], 'the applied tools are echoed');
});

test('web_search (with external_web_access) is accepted, left out of the prompt and named in a header', async () => {
  const input = [user('Search the web')];
  const { data, response } = await oa.responses.create({ model: 'x', max_output_tokens: 1, input,
    tools: [weather, { type: 'web_search', external_web_access: false }] }).withResponse();
  assert.equal(response.headers.get('x-deltafin-omitted-tools'), 'web_search');
  assert.equal(data.usage.input_tokens, await inputTokens({ input, tools: [weather] }));
  assert.deepEqual(data.tools.map((t) => t.type), ['function']);
  const plain = await oa.responses.create({ model: 'x', max_output_tokens: 1, input, tools: [weather] }).withResponse();
  assert.equal(plain.response.headers.get('x-deltafin-omitted-tools'), null);
});

test('reasoning items round-trip: encrypted_content decodes to the text, and the next turn reuses the prefix', async () => {
  const first = [user('Hello there')];
  const r1 = await oa.responses.create({ model: 'x', input: first, max_output_tokens: 12, store: false,
    include: ['reasoning.encrypted_content'] });
  const rs = r1.output[0];
  assert.equal(rs.type, 'reasoning');
  assert.match(rs.encrypted_content, /^dfr1:/);
  assert.equal(Buffer.from(rs.encrypted_content.slice(5), 'base64').toString('utf8'), rs.content[0].text);
  const second = [...first, ...r1.output, user('Tell me more')];
  const r2 = await oa.responses.create({ model: 'x', input: second, max_output_tokens: 4, store: false });
  const cached = r2.usage.input_tokens_details.cached_tokens;
  assert.ok(cached > 0 && cached >= r1.usage.input_tokens - 16,
    `${cached} cached of ${r2.usage.input_tokens}; the first prompt was ${r1.usage.input_tokens}`);
  // the text comes from encrypted_content when present, else from content; both render the same
  const onlyContent = { ...rs, encrypted_content: undefined };
  const onlyEnc = { ...rs, content: undefined };
  const n = r2.usage.input_tokens;
  assert.equal(await inputTokens({ input: [...first, onlyContent, user('Tell me more')] }), n);
  assert.equal(await inputTokens({ input: [...first, onlyEnc, user('Tell me more')] }), n);
  const empty = { type: 'reasoning', summary: [] };
  assert.ok(await inputTokens({ input: [...first, empty, user('Tell me more')] }) < n, 'the reasoning is rendered');
});

test('previous_response_id continues a stored conversation; an unknown id is previous_response_not_found', async () => {
  const r1 = await oa.responses.create({ model: 'x', input: 'First question', max_output_tokens: 6 });
  const r2 = await oa.responses.create({ model: 'x', previous_response_id: r1.id, input: 'Second question', max_output_tokens: 1 });
  const explicit = await inputTokens({ input: [{ role: 'user', content: 'First question' }, ...r1.output, user('Second question')] });
  assert.equal(r2.usage.input_tokens, explicit);
  assert.equal(r2.previous_response_id, r1.id);
  await assert.rejects(oa.responses.create({ model: 'x', previous_response_id: 'resp_nope', input: 'x' }),
    (e) => e.status === 400 && e.code === 'previous_response_not_found' && e.param === 'previous_response_id');
  // store: false is not kept
  const r3 = await oa.responses.create({ model: 'x', input: 'Unstored', max_output_tokens: 1, store: false });
  await assert.rejects(oa.responses.create({ model: 'x', previous_response_id: r3.id, input: 'x' }), (e) => e.status === 400);
});

test('reasoning.effort: none turns thinking off; the levels map onto low/high/max', async () => {
  const r = await oa.responses.create({ model: 'x', input: 'Hi', max_output_tokens: 4, reasoning: { effort: 'none' } });
  assert.ok(r.output.every((o) => o.type !== 'reasoning'), JSON.stringify(r.output));
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(r.reasoning.effort, 'none');
  for (const effort of ['minimal', 'low', 'medium', 'high', 'xhigh'])
    assert.equal((await oa.responses.create({ model: 'x', input: 'Hi', max_output_tokens: 1, reasoning: { effort, summary: 'auto' } })).object, 'response');
  // minimal and low render the same prompt, medium and high too
  const n = (effort) => inputTokens({ input: 'Hi', reasoning: { effort } });
  assert.equal(await n('minimal'), await n('low'));
  assert.equal(await n('medium'), await n('high'));
});

test('refused by name: keywords a strict tool cannot guarantee, image parts, unsupported items and fields', async () => {
  const bad = async (p, re, param) => {
    await assert.rejects(oa.responses.create({ model: 'x', max_output_tokens: 1, ...p }), (e) => {
      assert.equal(e.status, 400, String(e));
      assert.match(e.message, re);
      if (param) assert.equal(e.param, param);
      return true;
    });
  };
  await bad({ input: 'hi', tools: [{ ...weather, strict: true, parameters: { type: 'object', properties: {
    city: { type: 'string', contentMediaType: 'text/plain' } } } }] }, /"contentMediaType"/, 'tools');
  await bad({ input: [{ role: 'user', content: [{ type: 'input_text', text: 'look' },
    { type: 'input_image', image_url: 'data:image/png;base64,AAAA' }] }] }, /input_image/, 'input');
  await bad({ input: [{ type: 'item_reference', id: 'msg_1' }] }, /item_reference/, 'input');
  await bad({ input: 'hi', tool_choice: { type: 'function', name: 'get_rain' }, tools: [weather] }, /get_rain/, 'tool_choice');
  await bad({ input: 'hi', tool_choice: { type: 'allowed_tools', tools: [] }, tools: [weather] }, /tool_choice/, 'tool_choice');
  await bad({ input: 'hi', text: { format: { type: 'json_schema', name: 's', schema: { type: 'object', minProperties: 1 },
    strict: true } } }, /"minProperties"/, 'text.format');
  await bad({ input: 'hi', truncation: 'auto' }, /truncation/, 'truncation');
  await bad({ input: 'hi', conversation: 'conv_1' }, /conversation/, 'conversation');
  await bad({ input: 'hi', tools: [{ type: 'custom', name: 'apply_patch' }] }, /custom/, 'tools');
});

test('keepalive events arrive while a long prompt is evaluated (--ping-ms 10)', async () => {
  const stream = oa.responses.stream({ model: 'x', input: 'hello world '.repeat(200), max_output_tokens: 2 });
  let keepalive = 0, seq = -1;
  for await (const ev of stream) {
    if (ev.type === 'keepalive') keepalive++;
    assert.ok(ev.sequence_number > seq);
    seq = ev.sequence_number;
  }
  assert.ok(keepalive >= 1, `${keepalive} keepalive events`);
  assert.equal((await stream.finalResponse()).usage.output_tokens, 2);
});

test('a prompt past the context: response.failed with context_length_exceeded when streaming, else a 400', async () => {
  const input = 'hello world '.repeat(20000);
  const r = await fetch(`${URL_}/v1/responses`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ input, stream: true }) });
  assert.equal(r.status, 200);
  const ev = sse(await r.text());
  assert.deepEqual(ev.map((e) => e.data.type), ['response.created', 'response.failed']);
  assert.equal(ev[1].data.response.status, 'failed');
  assert.equal(ev[1].data.response.error.code, 'context_length_exceeded');
  await assert.rejects(oa.responses.create({ model: 'x', input }), (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

test('the recorded Codex-shaped first request gets a complete stream', async () => {
  assert.equal(fixture.input.length, 4);
  const r = await fetch(`${URL_}/v1/responses`, { method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream', originator: 'codex_exec' },
    body: JSON.stringify(fixture) });
  const text = await r.text();
  assert.equal(r.status, 200, text.slice(0, 300));
  assert.equal(r.headers.get('x-deltafin-omitted-tools'), 'web_search');
  const events = sse(text);
  const resp = checkStream(events);
  assert.ok(events.some((e) => e.data.type === 'keepalive'), 'keepalives during the prompt');
  assert.equal(resp.usage.output_tokens, 64, 'capped by --max-tokens 64 (Codex sends no max_output_tokens)');
  assert.ok(resp.usage.input_tokens > 1000);
  assert.match(resp.output[0].encrypted_content, /^dfr1:/, 'Codex asks for reasoning.encrypted_content');
  assert.deepEqual(resp.output[0].summary, []);
  assert.equal(resp.store, false);
  assert.deepEqual(resp.tools.map((t) => t.type), [...Array(7).fill('function'), 'namespace']);
  // the SDK parses the same stream
  const s = oa.responses.stream({ ...fixture, stream: undefined });
  const f = await s.finalResponse();
  assert.deepEqual(f.output.map((o) => o.type), resp.output.map((o) => o.type));
});
