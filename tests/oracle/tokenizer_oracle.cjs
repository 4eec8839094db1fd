#!/usr/bin/env node
// tokenizer_oracle.cjs - compares deltafin's token ids with OpenAI tiktoken's
// (npm `tiktoken`, the WASM build of the Rust crate that K3's own
// tokenization_kimi.py uses).  Run through run_tokenizer_oracle.sh.
//
//   node tokenizer_oracle.cjs --tok-dump BIN --work DIR --corpus FILE MODEL_DIR...
//
// For each model directory (tiktoken.model + tokenizer_config.json) and each
// case (corpus entries, every special spelling, generated long texts) in both
// modes, the expected ids are tiktoken's on Kimi's safety slices of the text
// after U+FFFD repair: encode(slice, "all") with specials allowed, else
// encode_ordinary(slice).  deltafin's ids come from tests/tok_dump, which also
// returns its decode of them; that must equal the repaired text.  Exit status
// 1 on any mismatch.
"use strict";
const fs = require("fs");
const path = require("path");
const { execFileSync } = require("child_process");
const { Tiktoken } = require("tiktoken/lite");

// The spec's pattern (k3-architecture.md 9.2), verbatim: tiktoken's Rust
// regex engine understands `&&` class intersection.
const PAT = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

// Kimi's safety splitting (tokenization_kimi.py), on code points.
const MAX_SCALARS = 400000, MAX_RUN = 25000;
function pyIsSpace(c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c === 0x85 || c === 0xa0 || c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000;
}
function kimiSlices(text) {
  const cps = Array.from(text);
  const out = [];
  for (let i = 0; i < cps.length; i += MAX_SCALARS) {
    const s = cps.slice(i, i + MAX_SCALARS);
    let len = 0, isSpace = s.length ? pyIsSpace(s[0].codePointAt(0)) : false, start = 0;
    for (let k = 0; k < s.length; k++) {
      const sp = pyIsSpace(s[k].codePointAt(0));
      if (isSpace !== sp) { len = 1; isSpace = sp; }
      else if (++len > MAX_RUN) { out.push(s.slice(start, k).join("")); start = k; len = 1; }
    }
    out.push(s.slice(start).join(""));
  }
  return out;
}

function loadModel(dir) {
  const ranks = fs.readFileSync(path.join(dir, "tiktoken.model"), "utf8");
  const nRanks = ranks.split("\n").filter((l) => l.length).length;
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const specials = {};
  const listed = cfg.added_tokens_decoder || {};
  for (let id = nRanks; id < nRanks + 256; id++)
    specials[listed[id] ? listed[id].content : `<|reserved_token_${id}|>`] = id;
  return { enc: new Tiktoken(ranks, specials, PAT), specials, nRanks };
}

function expectedIds(enc, text, allow) {
  const ids = [];
  for (const s of kimiSlices(text)) for (const id of allow ? enc.encode(s, "all") : enc.encode_ordinary(s)) ids.push(id);
  return ids;
}

// ---------------------------------------------------------------- cases

function corpusCases(file) {
  const doc = JSON.parse(fs.readFileSync(file, "utf8"));
  return doc.cases.map((c) => ({ name: c.name, bytes: c.hex !== undefined ? Buffer.from(c.hex, "hex") : Buffer.from(c.text, "utf8") }));
}

function specialCases(specials) {
  const cases = [];
  for (const s of Object.keys(specials)) {
    cases.push({ name: `special ${s}`, bytes: Buffer.from(s) });
    cases.push({ name: `special in text ${s}`, bytes: Buffer.from(`x${s} ${s}\n${s}y  ${s.slice(0, -1)}`) });
  }
  return cases;
}

function longCases() {
  const rep = (u, n) => u.repeat(n);
  const cases = [
    ["60000 letters", rep("a", 60000)],
    ["25003 spaces then x", rep(" ", 25003) + "x"],
    ["30000 digits", rep("7", 30000)],
    ["26000 punctuation", rep("!", 26000) + "a"],
    ["25002 newlines", rep("\n", 25002) + "a"],
    // runs are counted in characters: 25,000 = 3 * 8333 + 1 shows where the cut fell
    ["30000 devanagari digits", rep("\u0969", 30000)],
    ["30000 han", rep("\u4e2d", 30000)],
    ["mixed space classes", rep("ab \x1c", 20000)],
    ["special cut by a 25000 run", rep("x", 24997) + "<|open|>tail"],
    ["special after a 25000 run", rep("x", 24990) + "<|open|>tail"],
    ["special cut at 400000 scalars", rep("abcdefg ", 49999) + "xyzw<|open|>" + "tail"],
    ["special before 400000 scalars", rep("abcdefg ", 49998) + "xyzw<|open|>" + "tail"],
    ["mixed 450000 scalars", rep("Hello, \u4e16\u754c! 123 \ud83d\ude42\n", 25000)],
  ];
  return cases.map(([name, s]) => ({ name, bytes: Buffer.from(s, "utf8") }));
}

// ------------------------------------------------------ synthetic vocabularies

// xorshift, so the synthetic vocabularies are the same on every run
function rng(seed) {
  let x = BigInt(seed) | 1n;
  return () => {
    x ^= (x << 13n) & 0xffffffffffffffffn;
    x ^= x >> 7n;
    x ^= (x << 17n) & 0xffffffffffffffffn;
    return Number(x >> 33n) / 2 ** 31;
  };
}

const K3_SPECIALS = { 0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
  6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>", 19: "<|media_content|>",
  20: "<|media_end|>", 21: "<|media_pad|>", 65: "<osagent_mode>", 254: "[UNK]", 255: "[PAD]" };

// tokens: array of Buffers (unique); writes tiktoken.model + tokenizer_config.json
function writeModel(dir, tokens) {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tiktoken.model"), tokens.map((b, i) => `${b.toString("base64")} ${i}\n`).join(""));
  const atd = {};
  for (const [off, s] of Object.entries(K3_SPECIALS)) atd[String(tokens.length + Number(off))] = { content: s, special: true };
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify({ added_tokens_decoder: atd }, null, 1));
}

// Every substring (up to 24 characters) of the short corpus texts, shortest
// first: each pre-tokenizer piece is then one token, so ids show the exact
// piece boundaries.  "random" instead keeps a random 30% in random order
// (bytes too), which exercises BPE merge order.
function syntheticModel(dir, cases, random) {
  const seen = new Set();
  const subs = [];
  for (const c of cases) {
    if (c.bytes.length > 4000) continue;
    const chars = Array.from(new TextDecoder().decode(c.bytes));
    for (let i = 0; i < chars.length; i++)
      for (let j = i + 2; j <= Math.min(chars.length, i + 24); j++) {
        const b = Buffer.from(chars.slice(i, j).join(""), "utf8");
        const k = b.toString("latin1");
        if (!seen.has(k)) { seen.add(k); subs.push(b); }
      }
    // multi-byte single characters too
    for (const ch of chars) {
      const b = Buffer.from(ch, "utf8");
      const k = b.toString("latin1");
      if (b.length > 1 && !seen.has(k)) { seen.add(k); subs.push(b); }
    }
  }
  const bytes = [];
  for (let b = 0; b < 256; b++) bytes.push(Buffer.from([b]));
  let tokens;
  if (random) {
    const r = rng(0x5eed);
    const shuffle = (a) => { for (let i = a.length - 1; i > 0; i--) { const j = Math.floor(r() * (i + 1)); [a[i], a[j]] = [a[j], a[i]]; } return a; };
    tokens = shuffle(bytes).concat(shuffle(subs.filter(() => r() < 0.3)));
  } else {
    subs.sort((a, b) => a.length - b.length || Buffer.compare(a, b));
    tokens = bytes.concat(subs);
  }
  writeModel(dir, tokens);
  return dir;
}

// ------------------------------------------------------------------ main

function main() {
  const args = process.argv.slice(2);
  const opt = { dirs: [] };
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--tok-dump") opt.tokDump = args[++i];
    else if (args[i] === "--work") opt.work = args[++i];
    else if (args[i] === "--corpus") opt.corpus = args[++i];
    else opt.dirs.push(args[i]);
  }
  if (!opt.tokDump || !opt.work || !opt.corpus || !opt.dirs.length) {
    console.error("usage: tokenizer_oracle.cjs --tok-dump BIN --work DIR --corpus FILE MODEL_DIR...");
    process.exit(2);
  }
  const corpus = corpusCases(opt.corpus);
  const dirs = opt.dirs.slice();
  dirs.push(syntheticModel(path.join(opt.work, "pieces"), corpus, false));
  dirs.push(syntheticModel(path.join(opt.work, "random-bpe"), corpus, true));
  const long = longCases();
  let failures = 0;
  for (const dir of dirs) {
    const t0 = Date.now();
    const { enc, specials, nRanks } = loadModel(dir);
    const cases = corpus.concat(specialCases(specials), long);
    const runs = [];
    for (const c of cases) for (const allow of [0, 1]) runs.push({ c, allow });
    const input = runs.map((r) => `${r.allow} ${r.c.bytes.toString("base64")}\n`).join("");
    const inFile = path.join(opt.work, "cases.txt");
    fs.writeFileSync(inFile, input);
    const out = execFileSync(opt.tokDump, [dir, inFile], { maxBuffer: 1 << 30 }).toString("utf8").split("\n");
    let bad = 0, nIds = 0;
    runs.forEach((r, i) => {
      const text = new TextDecoder().decode(r.c.bytes); // U+FFFD repair, as Python's errors="replace"
      const want = expectedIds(enc, text, r.allow);
      const [idsStr, decB64] = (out[i] || "").split(" | ");
      const got = idsStr ? idsStr.split(" ").map(Number) : [];
      nIds += want.length;
      const idsOk = got.length === want.length && got.every((v, k) => v === want[k]);
      const decOk = Buffer.from(decB64 || "", "base64").equals(Buffer.from(text, "utf8"));
      if (!idsOk || !decOk) {
        bad++;
        if (bad <= 5) {
          let k = 0;
          while (k < got.length && got[k] === want[k]) k++;
          console.log(`  MISMATCH ${path.basename(dir)} "${r.c.name}" allow_special=${r.allow}: ` +
            (idsOk ? "decode differs" : `first difference at id ${k}: got [${got.slice(k, k + 8)}] want [${want.slice(k, k + 8)}]`));
        }
      }
    });
    enc.free();
    failures += bad;
    console.log(`${bad ? "FAIL" : "ok  "} ${dir}: ${nRanks} ranks, ${runs.length} encodes, ${nIds} ids, ` +
      `${bad} mismatches (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  }
  console.log(failures ? `tokenizer oracle: ${failures} mismatches` : "tokenizer oracle: all ids equal tiktoken's");
  process.exit(failures ? 1 : 0);
}

main();
