// schema_property_test.mjs - property test of JSON-schema-constrained decoding (issue 36), run by
// run_schema_tests.sh against `deltafin serve` on the default model (DELTAFIN_URL_SCHEMA).
//
// Generates random JSON Schemas (schema_gen.mjs, a seeded PRNG: nested objects with required and optional
// properties and additionalProperties: false, arrays with items/minItems/maxItems, enum,
// const, integers and numbers with inclusive and exclusive bounds, strings with
// minLength/maxLength, patterns from a small set and the formats date, date-time, uuid, uri,
// email, anyOf/oneOf of differing types, type lists, $ref into $defs), samples each at
// temperature 1 with several seeds through response_format {type: json_schema, strict: true}
// (one request in three with thinking on, where the constraint starts after the reasoning),
// and once as a forced tool's parameters; every output must parse and validate with ajv.
// A reply cut by max_tokens (finish "length") is not a grammar failure: such replies are
// counted and reported apart, and fail the run only past MAX_CUT (a fraction).
// Then: schemas holding a constraining keyword outside the supported subset are refused with
// 400 naming the keyword (on every API that asks for a guarantee), but accepted when the tool
// is only offered; schemas with only annotation keywords added are accepted and enforced;
// and fixed schemas with the shapes the issue names (Claude Code's uri format, allOf of
// string patterns, ^[\s\S]{0,300}$, maxLength 524288, definitions, recursion).
// Environment: SCHEMAS (default 50), SEEDS (per schema, default 3), SCHEMA_SEED (the
// generator's, default 36), MAX_CUT (default 0.05), CONCURRENCY (default 2).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { errorsOf } from './ajv_check.mjs';
import { generate, mulberry32 } from './schema_gen.mjs';

const URL_ = process.env.DELTAFIN_URL_SCHEMA ?? 'http://127.0.0.1:8080';
const N_SCHEMAS = Number(process.env.SCHEMAS ?? 50);
const N_SEEDS = Number(process.env.SEEDS ?? 3);
const GEN_SEED = Number(process.env.SCHEMA_SEED ?? 36);
const MAX_CUT = Number(process.env.MAX_CUT ?? 0.05);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 2);
const MAX_TOKENS = 2000;

// ---- requests ------------------------------------------------------------------

async function post(path, body) {
  const r = await fetch(`${URL_}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* reported by the caller */ }
  return { status: r.status, text, json };
}

// Runs fns (async thunks) CONCURRENCY at a time, in order of start.
async function pool(fns) {
  const out = new Array(fns.length);
  let next = 0;
  const worker = async () => { while (next < fns.length) { const k = next++; out[k] = await fns[k](); } };
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, fns.length) }, worker));
  return out;
}

const PROMPT = 'Fill in a realistic record as JSON.';

// One constrained sample: {kind: 'ok' | 'cut' | 'bad' | 'http', detail}.  via: 'response_format'
// or 'tool' (the schema as a forced tool's parameters).
async function sample(schema, seed, { via = 'response_format', think = false } = {}) {
  const body = { model: 'x', messages: [{ role: 'user', content: PROMPT }], max_tokens: MAX_TOKENS, temperature: 1, seed,
    ...(think ? {} : { reasoning_effort: 'none' }) };
  if (via === 'tool') {
    body.tools = [{ type: 'function', function: { name: 'record', description: 'Store a record', parameters: schema } }];
    body.tool_choice = { type: 'function', function: { name: 'record' } };
  } else {
    body.response_format = { type: 'json_schema', json_schema: { name: 'record', strict: true, schema } };
  }
  const r = await post('/v1/chat/completions', body);
  if (r.status !== 200) return { kind: 'http', detail: `HTTP ${r.status}: ${r.text.slice(0, 300)}` };
  const ch = r.json.choices[0];
  if (ch.finish_reason === 'length') return { kind: 'cut', detail: `${r.json.usage.completion_tokens} tokens` };
  let text;
  if (via === 'tool') {
    if (ch.finish_reason !== 'tool_calls' || !ch.message.tool_calls?.length)
      return { kind: 'bad', detail: `finish ${ch.finish_reason}, no tool call: ${JSON.stringify(ch.message).slice(0, 300)}` };
    text = ch.message.tool_calls[0].function.arguments;
  } else {
    if (ch.finish_reason !== 'stop') return { kind: 'bad', detail: `finish_reason ${ch.finish_reason}` };
    text = ch.message.content;
  }
  let value;
  try { value = JSON.parse(text); } catch (e) { return { kind: 'bad', detail: `not JSON (${e.message}): ${JSON.stringify(text?.slice(0, 300))}` }; }
  const errs = errorsOf(schema, value);
  return errs ? { kind: 'bad', detail: `${JSON.stringify(value).slice(0, 300)}: ${errs}` } : { kind: 'ok' };
}

// Samples every schema N_SEEDS times (and once through a forced tool), and asserts.
async function checkSchemas(schemas, label) {
  const jobs = [];
  schemas.forEach((schema, i) => {
    for (let k = 0; k < N_SEEDS; k++)
      jobs.push({ i, what: `seed ${k + 1}${k % 3 === 1 ? ' (thinking on)' : ''}`, run: () => sample(schema, k + 1, { think: k % 3 === 1 }) });
    jobs.push({ i, what: 'forced tool, seed 7', run: () => sample(schema, 7, { via: 'tool' }) });
  });
  const t0 = Date.now();
  const res = await pool(jobs.map((j) => j.run));
  const count = { ok: 0, cut: 0, bad: 0, http: 0 };
  const failures = [];
  res.forEach((r, k) => {
    count[r.kind]++;
    if (r.kind === 'bad' || r.kind === 'http') failures.push(`schema ${jobs[k].i} ${jobs[k].what}: ${r.detail}\n    schema: ${JSON.stringify(schemas[jobs[k].i])}`);
  });
  console.log(`# ${label}: ${schemas.length} schemas, ${jobs.length} samples in ${((Date.now() - t0) / 1000).toFixed(1)} s: ` +
    `${count.ok} valid, ${count.cut} cut by max_tokens (${MAX_TOKENS}), ${count.bad} invalid, ${count.http} refused or failed`);
  const cutIdx = res.map((r, k) => (r.kind === 'cut' ? jobs[k].i : -1)).filter((i) => i >= 0);
  if (cutIdx.length) console.log(`# cut replies on schemas ${[...new Set(cutIdx)].join(', ')}`);
  assert.equal(failures.length, 0, `${failures.length} of ${jobs.length} samples failed:\n  ${failures.slice(0, 12).join('\n  ')}`);
  assert.ok(count.cut <= MAX_CUT * jobs.length, `${count.cut} of ${jobs.length} replies cut by max_tokens (more than ${MAX_CUT * 100} %)`);
}

// ---- tests ------------------------------------------------------------------------

test(`generated schemas (${N_SCHEMAS}, ${N_SEEDS} seeds each at temperature 1, and a forced tool): every output validates`, async () => {
  await checkSchemas(generate(N_SCHEMAS, GEN_SEED), 'generated');
});

test('the generator is deterministic and covers its keywords', () => {
  const a = generate(N_SCHEMAS, GEN_SEED), b = generate(N_SCHEMAS, GEN_SEED);
  assert.deepEqual(a, b);
  const text = JSON.stringify(a);
  for (const k of ['"required"', '"additionalProperties":false', '"minItems"', '"maxItems"', '"enum"', '"const"', '"minimum"',
    '"maximum"', '"exclusiveMinimum"', '"exclusiveMaximum"', '"minLength"', '"maxLength"', '"pattern"', '"format":"date"',
    '"format":"uuid"', '"format":"email"', '"anyOf"', '"$ref"', '"$defs"'])
    assert.ok(text.includes(k), `${N_SCHEMAS} generated schemas never use ${k}`);
});

// Each holds one constraining keyword the subset does not have, nested (in a property, a
// $defs entry reached by $ref, an anyOf branch, an array's items).
const REFUSED = [
  ['patternProperties', { type: 'object', patternProperties: { '^x': { type: 'string' } } }],
  ['dependentRequired', { type: 'object', properties: { a: { type: 'string' }, b: { type: 'string' } }, dependentRequired: { a: ['b'] }, additionalProperties: false }],
  ['not', { not: { type: 'string' } }],
  ['if', { type: 'integer', if: { minimum: 5 }, then: { maximum: 10 } }],
  ['uniqueItems', { type: 'array', items: { type: 'integer' }, uniqueItems: true, maxItems: 3 }],
  ['multipleOf', { type: 'integer', multipleOf: 3, minimum: 0, maximum: 99 }],
  ['contains', { type: 'array', items: { type: 'integer' }, contains: { const: 3 }, maxItems: 4 }],
  ['propertyNames', { type: 'object', propertyNames: { pattern: '^[a-z]+$' } }],
  ['minProperties', { type: 'object', properties: { a: { type: 'string' } }, minProperties: 1, additionalProperties: false }],
  ['maxProperties', { type: 'object', properties: { a: { type: 'string' } }, maxProperties: 1, additionalProperties: false }],
  ['dependentSchemas', { type: 'object', properties: { a: { type: 'string' } }, dependentSchemas: { a: { required: ['a'] } } }],
  ['unevaluatedProperties', { type: 'object', properties: { a: { type: 'string' } }, unevaluatedProperties: false }],
];
const nestings = [
  (s) => ({ type: 'object', properties: { outer: { type: 'object', properties: { bad: s }, required: ['bad'], additionalProperties: false } }, required: ['outer'], additionalProperties: false }),
  (s) => ({ type: 'object', properties: { r: { $ref: '#/$defs/bad' } }, required: ['r'], additionalProperties: false, $defs: { bad: s } }),
  (s) => ({ type: 'object', properties: { u: { anyOf: [{ type: 'null' }, s] } }, required: ['u'], additionalProperties: false }),
  (s) => ({ type: 'object', properties: { list: { type: 'array', items: s, maxItems: 2 } }, required: ['list'], additionalProperties: false }),
];
// The ways a request asks for a guarantee, each refusing the schema; and the plain offer, accepting it.
const asks = {
  'chat response_format strict': (s) => ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 8,
    response_format: { type: 'json_schema', json_schema: { name: 'r', strict: true, schema: s } } }],
  'chat tool_choice named': (s) => ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 8,
    tools: [{ type: 'function', function: { name: 'f', parameters: s } }], tool_choice: { type: 'function', function: { name: 'f' } } }],
  'chat tool strict': (s) => ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 8,
    tools: [{ type: 'function', function: { name: 'f', parameters: s, strict: true } }] }],
  'messages output_config.format': (s) => ['/v1/messages', { model: 'x', max_tokens: 8, messages: [{ role: 'user', content: 'x' }],
    output_config: { format: { type: 'json_schema', schema: s } } }],
  'messages tool_choice any': (s) => ['/v1/messages', { model: 'x', max_tokens: 8, messages: [{ role: 'user', content: 'x' }],
    tools: [{ name: 'f', input_schema: s }], tool_choice: { type: 'any' } }],
  'messages tool strict': (s) => ['/v1/messages', { model: 'x', max_tokens: 8, messages: [{ role: 'user', content: 'x' }],
    tools: [{ name: 'f', input_schema: s, strict: true }] }],
  'responses text.format strict': (s) => ['/v1/responses', { model: 'x', input: 'x', max_output_tokens: 8,
    text: { format: { type: 'json_schema', name: 'r', schema: s, strict: true } } }],
  'responses tool_choice function': (s) => ['/v1/responses', { model: 'x', input: 'x', max_output_tokens: 8,
    tools: [{ type: 'function', name: 'f', parameters: s }], tool_choice: { type: 'function', name: 'f' } }],
};

function errorMessage(r) {
  if (r.json?.error?.message) return r.json.error.message;  // OpenAI shape; Anthropic's: {type: error, error: {message}}
  return r.text;
}

// Whether msg names keyword kw: as a whole word; "if" and "not", which are also English words,
// only quoted or as a path step (."if", 'not', `not`, .not).
function names(msg, kw) {
  const k = kw.replace(/[$]/g, '\\$');
  if (kw === 'if' || kw === 'not') return new RegExp(`[\`"'.]${k}\\b`).test(msg);
  return new RegExp(`(^|[^A-Za-z0-9_$])${k}([^A-Za-z0-9_]|$)`).test(msg);
}

test('unsupported constraining keywords: 400 naming the keyword, on every API that asks for a guarantee', async () => {
  const failures = [];
  const apiNames = Object.keys(asks);
  let n = 0;
  for (const [i, [kw, s]] of REFUSED.entries()) {
    // every keyword on one API in turn (rotating) and every nesting; the first keyword on every API
    const apis = i === 0 ? apiNames : [apiNames[i % apiNames.length], apiNames[(i + 3) % apiNames.length]];
    for (const api of apis) {
      for (const [j, nest] of nestings.entries()) {
        const [path, body] = asks[api](nest(s));
        const r = await post(path, body);
        n++;
        const msg = errorMessage(r);
        if (r.status !== 400 || !names(msg, kw))
          failures.push(`${kw} (nesting ${j}) via ${api}: expected 400 naming "${kw}", got ${r.status}: ${msg.slice(0, 200)}`);
      }
    }
  }
  console.log(`# ${n} requests with an unsupported keyword; ${failures.length} not refused by name`);
  assert.equal(failures.length, 0, failures.join('\n  '));
});

test('unsupported keywords in tools only offered (no strict, no forced choice): accepted as before', async () => {
  for (const [kw, s] of REFUSED) {
    const schema = nestings[0](s);
    const a = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 4,
      tools: [{ type: 'function', function: { name: 'f', parameters: schema } }], tool_choice: 'auto' });
    assert.equal(a.status, 200, `${kw}: chat tool offered, tool_choice auto: ${a.text.slice(0, 200)}`);
    const b = await post('/v1/messages', { model: 'x', max_tokens: 4, messages: [{ role: 'user', content: 'x' }],
      tools: [{ name: 'f', input_schema: schema }] });
    assert.equal(b.status, 200, `${kw}: messages tool offered: ${b.text.slice(0, 200)}`);
  }
});

// Adds annotation keywords at random nodes of a schema (a copy); $schema and $id at the root only.
const ANNOTATIONS = [['title', () => 'A title'], ['description', () => 'Some description.'], ['default', () => null],
  ['examples', () => ['example']], ['$comment', () => 'a comment'], ['deprecated', () => false], ['readOnly', () => false],
  ['writeOnly', () => false]];
function annotate(schema, r) {
  const walk = (s) => {
    if (Array.isArray(s)) { s.forEach(walk); return; }
    if (!s || typeof s !== 'object') return;
    for (const [k, v] of Object.entries(s)) {
      if (k === 'properties' || k === '$defs') Object.values(v).forEach(walk);
      else if (k === 'items' || k === 'anyOf' || k === 'oneOf') walk(v);
    }
    for (const [k, v] of ANNOTATIONS) if (r() < 0.35) s[k] = v();
  };
  const c = structuredClone(schema);
  walk(c);
  return { $schema: 'https://json-schema.org/draft/2020-12/schema', $id: 'https://example.com/record.json', ...c };
}

test('schemas with annotation keywords only added ($schema, $id, title, description, default, examples, ...): accepted and enforced', async () => {
  const r = mulberry32(GEN_SEED + 1);
  const schemas = generate(10, GEN_SEED + 7).map((s) => annotate(s, r));
  const text = JSON.stringify(schemas);
  for (const [k] of ANNOTATIONS) assert.ok(text.includes(`"${k}"`), `the annotated schemas never carry ${k}`);
  await checkSchemas(schemas, 'annotated');
});

// The shapes issue 36 names (Claude Code's tool schemas among them).
const FIXED = [
  { type: 'object', properties: { url: { type: 'string', format: 'uri' }, prompt: { type: 'string', maxLength: 80 } },
    required: ['url', 'prompt'], additionalProperties: false },
  { type: 'object', properties: { q: { allOf: [{ type: 'string', pattern: '^[\\s\\S]{0,300}$' }, { type: 'string', pattern: '^[a-z ]{2,20}$' }] } },
    required: ['q'], additionalProperties: false },
  { type: 'object', properties: { text: { type: 'string', pattern: '^[\\s\\S]{0,300}$' } }, required: ['text'], additionalProperties: false },
  { type: 'object', properties: { script: { type: 'string', maxLength: 524288 }, n: { type: 'integer', minimum: 0, maximum: 9 } },
    required: ['n'], additionalProperties: false },
  { type: 'object', properties: { a: { $ref: '#/definitions/pt' }, b: { $ref: '#/definitions/pt' } }, required: ['a', 'b'],
    additionalProperties: false, definitions: { pt: { type: 'object', properties: { x: { type: 'integer', minimum: -9, maximum: 9 },
      y: { type: 'integer', minimum: -9, maximum: 9 } }, required: ['x', 'y'], additionalProperties: false } } },
  { type: 'object', properties: { v: { oneOf: [{ type: 'string', format: 'date-time' }, { type: 'integer', minimum: 0, maximum: 99 }] },
    w: { type: ['string', 'null'], maxLength: 5 } }, required: ['v', 'w'], additionalProperties: false },
  { type: 'object', allOf: [{ properties: { a: { type: 'integer', minimum: 1, maximum: 5 } }, required: ['a'] },
    { properties: { b: { type: 'string', maxLength: 8 } }, required: ['b'] }] },
  { type: 'object', properties: { tree: { $ref: '#/$defs/node' } }, required: ['tree'], additionalProperties: false,
    $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 },
      kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['v'], additionalProperties: false } } },
];

test('the shapes the issue names (format uri, allOf of patterns, ^[\\s\\S]{0,300}$, maxLength 524288, definitions, recursion)', async () => {
  await checkSchemas(FIXED, 'fixed shapes');
});
