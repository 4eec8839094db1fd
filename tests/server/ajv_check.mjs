// ajv_check.mjs - JSON Schema validation for the structured-output tests (structured_test.mjs,
// schema_property_test.mjs, tests/agents/forced_tools_test.mjs): ajv from npm with ajv-formats,
// never a hand-written check.
//
// A schema is compiled by the draft its $schema names (2020-12, 2019-09, else draft-07, which
// also takes $defs); formats are checked in ajv-formats' "full" mode (a date's day must exist
// in its month, a date-time needs its offset).  strict: false only lets schemas carry
// annotations ajv does not know; every constraining keyword used here is one ajv implements.
import Ajv from 'ajv';
import Ajv2019 from 'ajv/dist/2019.js';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import assert from 'node:assert/strict';

const opts = { strict: false, allErrors: true, validateFormats: true };
const make = (C) => { const a = new C(opts); addFormats(a); return a; };
const ajvs = { draft7: make(Ajv), d2019: make(Ajv2019), d2020: make(Ajv2020) };
const cache = new Map();

function ajvFor(schema) {
  const s = typeof schema === 'object' && schema ? String(schema.$schema ?? '') : '';
  if (s.includes('2020-12')) return ajvs.d2020;
  if (s.includes('2019-09')) return ajvs.d2019;
  return ajvs.draft7;
}

// The compiled validator of a schema (by its JSON text; $id dropped so that two schemas
// with one $id do not collide in ajv's registry).
export function compile(schema) {
  const key = JSON.stringify(schema);
  let v = cache.get(key);
  if (!v) {
    const copy = JSON.parse(key);
    if (copy && typeof copy === 'object') delete copy.$id;
    v = ajvFor(schema).compile(copy);
    cache.set(key, v);
  }
  return v;
}

// null when value is valid against schema, else ajv's errors as one line.
export function errorsOf(schema, value) {
  const v = compile(schema);
  if (v(value)) return null;
  return v.errors.map((e) => `${e.instancePath || '/'} ${e.message}${e.params ? ' ' + JSON.stringify(e.params) : ''}`)
    .join('; ');
}

// Parses text as JSON (a failure names the text) and asserts it valid against schema.
export function assertJsonValid(schema, text, what) {
  assert.equal(typeof text, 'string', `${what}: expected a string, got ${typeof text}`);
  let value;
  try { value = JSON.parse(text); } catch (err) {
    assert.fail(`${what}: not JSON (${err.message}): ${JSON.stringify(text.slice(0, 400))}`);
  }
  assertValid(schema, value, what);
  return value;
}

export function assertValid(schema, value, what) {
  const errs = errorsOf(schema, value);
  assert.equal(errs, null, `${what}: ${JSON.stringify(value)?.slice(0, 400)} is not valid: ${errs}`);
}
