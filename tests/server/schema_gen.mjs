// schema_gen.mjs - random JSON Schemas for schema_property_test.mjs, from a seeded PRNG
// (mulberry32): a root object with nested objects (required and optional properties,
// additionalProperties: false), arrays (items, minItems, maxItems), enum, const, integers and
// numbers with inclusive and exclusive bounds, strings with minLength/maxLength, patterns
// from a small set, formats (date, date-time, uuid, uri, email), anyOf/oneOf of differing
// types, type lists, and $ref into $defs.  Every schema is satisfiable: bounds leave a value,
// a pattern given with a length has matches of that length, a $ref never names the
// definition being built (no cycle).  generate(n, seed) is deterministic.

export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PATTERNS = ['^[a-z]{2,8}$', '^\\d{3}-\\d{4}$', '^[A-Z][a-z]{1,10}$', '^(red|green|blue)$', '^[0-9a-f]{4,8}$',
  '^[A-Z]{2}[0-9]{2}$', '^-?\\d{1,3}(\\.\\d{1,2})?$', '^[a-z]+(_[a-z]+){0,2}$', '^[α-ω]{2,5}$', '^(?:[01]\\d|2[0-3]):[0-5]\\d$',
  '^[\\s\\S]{0,20}$', '^\\w{1,6}$'];
const FORMATS = ['date', 'date-time', 'uuid', 'uri', 'email'];
const NAMES = ['id', 'name', 'count', 'price', 'tags', 'items', 'kind', 'when', 'owner', 'size', 'flag', 'note', 'code',
  'level', 'parts', 'ratio', 'färg', 'x', 'y', 'meta'];
const ENUMS = [['a', 'b', 'c'], ['red', 'green', 'blue', 'yellow'], [1, 'two', null, true, 3.5], ['ä', 'ö', 'ü'], [0, 1, 2, 3],
  ['with "quote"', 'back\\slash', 'tab\there'], [{ k: 'v' }, [1, 2], 'plain'], [-1.25, 1e3, 0]];
const CONSTS = ['fixed', 42, true, null, { k: [1, 'x'] }, -0.5, 'ünïcode'];

class Gen {
  constructor(seed) { this.r = mulberry32(seed); this.defs = null; this.nDefs = 0; }
  int(a, b) { return a + Math.floor(this.r() * (b - a + 1)); }
  pick(a) { return a[this.int(0, a.length - 1)]; }
  chance(p) { return this.r() < p; }
  num() { return Math.round((this.r() * 200 - 100) * 100) / 100; }

  root() {
    this.defs = {};
    const s = this.object(0);
    if (Object.keys(this.defs).length) s.$defs = this.defs;
    return s;
  }
  node(depth) {
    const w = depth >= 3
      ? [['string', 4], ['integer', 2], ['number', 2], ['boolean', 1], ['null', 1], ['enum', 2], ['const', 1], ['typelist', 1]]
      : [['object', 3], ['array', 3], ['string', 4], ['integer', 2], ['number', 2], ['boolean', 1], ['null', 1], ['enum', 2],
        ['const', 1], ['anyOf', 2], ['ref', 2], ['typelist', 1]];
    let x = this.r() * w.reduce((a, [, k]) => a + k, 0);
    for (const [kind, k] of w) { if ((x -= k) < 0) return this[kind](depth); }
    return this.string();
  }
  object(depth) {
    const n = this.int(1, 4), names = [];
    while (names.length < n) { const k = this.pick(NAMES); if (!names.includes(k)) names.push(k); }
    const properties = {};
    for (const k of names) properties[k] = this.node(depth + 1);
    const required = names.filter(() => this.chance(0.6));
    return { type: 'object', properties, ...(required.length || this.chance(0.5) ? { required } : {}), additionalProperties: false };
  }
  array(depth) {
    const s = { type: 'array', items: this.node(depth + 1) };
    const min = this.pick([undefined, 0, 1, 2]);
    if (min !== undefined) s.minItems = min;
    if (this.chance(0.85)) s.maxItems = Math.max(1, (min ?? 0) + this.int(0, 3));
    return s;
  }
  string() {
    const v = this.int(0, 19);
    if (v < 7) {
      const max = this.int(1, 24);
      return { type: 'string', maxLength: max, ...(this.chance(0.5) ? { minLength: this.int(0, Math.min(3, max)) } : {}) };
    }
    if (v < 12) return { type: 'string', pattern: this.pick(PATTERNS) };
    if (v < 17) return { type: 'string', format: this.pick(FORMATS) };
    // a pattern and a length together (every pattern but the 8-character ^\d{3}-\d{4}$ has a match of 2-6)
    if (v < 18) return { type: 'string', pattern: this.pick(PATTERNS.filter((p) => p !== '^\\d{3}-\\d{4}$')), minLength: 2, maxLength: 6 };
    if (v < 19) return { type: 'string', minLength: this.int(1, 4) };
    return { type: 'string' };
  }
  integer() {
    const a = this.int(-1000, 1000), b = a + this.int(2, 5000);
    switch (this.int(0, 5)) {
      case 0: return { type: 'integer', minimum: a, maximum: b };
      case 1: return { type: 'integer', exclusiveMinimum: a, exclusiveMaximum: b };
      case 2: return { type: 'integer', minimum: a, exclusiveMaximum: b };
      case 3: return { type: 'integer', minimum: this.int(0, 9), maximum: this.int(10, 12) };
      case 4: return { type: 'integer', minimum: a };
      default: return { type: 'integer', maximum: b };
    }
  }
  number() {
    const a = this.num(), b = Math.round((a + 0.01 + this.r() * 500) * 100) / 100;
    switch (this.int(0, 4)) {
      case 0: return { type: 'number', minimum: a, maximum: b };
      case 1: return { type: 'number', exclusiveMinimum: a, exclusiveMaximum: b };
      case 2: return { type: 'number', exclusiveMinimum: 0, maximum: 1 };
      case 3: return { type: 'number', minimum: a };
      default: return { type: 'number' };
    }
  }
  boolean() { return { type: 'boolean' }; }
  null() { return { type: 'null' }; }
  enum() { return { enum: this.pick(ENUMS) }; }
  const() { return { const: this.pick(CONSTS) }; }
  typelist() {
    return this.chance(0.5) ? { type: ['string', 'null'], maxLength: this.int(1, 12) }
      : { type: ['integer', 'boolean'], minimum: -5, maximum: 5 };
  }
  anyOf(depth) {
    const types = ['string', 'integer', 'boolean', 'null', 'object', 'array'];
    const n = this.int(2, 3), picked = [];
    while (picked.length < n) { const t = this.pick(types); if (!picked.includes(t)) picked.push(t); }
    const branches = picked.map((t) => (t === 'string' ? { type: 'string', maxLength: this.int(1, 16) } : this[t](depth + 1)));
    return this.chance(0.25) ? { oneOf: branches } : { anyOf: branches };
  }
  ref(depth) {
    const done = Object.keys(this.defs).filter((k) => this.defs[k] !== null);  // never one being defined: no cycle
    if (done.length && this.chance(0.3)) return { $ref: `#/$defs/${this.pick(done)}` };
    const name = `def${this.nDefs++}`;
    this.defs[name] = null;
    this.defs[name] = this.node(depth + 1);
    return { $ref: `#/$defs/${name}` };
  }
}

export function generate(n, seed) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(new Gen(seed * 100003 + i).root());
  return out;
}
