// docs_test.mjs - documents in all three APIs and in `run --attach` (run by run_server_tests.sh).
//
// A document (text, Markdown or PDF) is rendered into the prompt as
//   <document name="NAME" pages="N">\nTEXT\n</document>\n\n
// before the message's text (src/app/document.c).  These tests check that each
// API's spelling of a document gives exactly the prompt of that text (token
// counts and greedy output equal), that `deltafin run --chat --attach` gives the
// server's prompt, and that bad documents (malformed or text-less PDFs, URLs,
// file ids, citations, other types) are clear 400s after which the server goes on.
// Environment: DELTAFIN_URL, DELTAFIN_BIN, DELTAFIN_MODEL (as server_test.mjs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { makePdf } from './pdf_gen.mjs';

const URL_ = process.env.DELTAFIN_URL ?? 'http://127.0.0.1:8080';
const BIN = process.env.DELTAFIN_BIN ?? 'build/deltafin';
const MODEL = process.env.DELTAFIN_MODEL ?? 'testdata/k3-tiny-a/checkpoint';
const oa = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'unused', maxRetries: 0 });
const an = new Anthropic({ baseURL: URL_, apiKey: 'unused', maxRetries: 0 });

const PDF = makePdf(['The launch code is 4417.\nSecond line here.', 'Page two says hello.']);
const PDF64 = PDF.toString('base64');
const Q = 'What is the launch code?';

// the PDF's text as document.c keeps it: pdftotext's UTF-8, form feeds dropped, the end trimmed
function pdfText(buf) {
  const p = spawnSync('pdftotext', ['-enc', 'UTF-8', '-eol', 'unix', '-', '-'], { input: buf, encoding: 'utf8' });
  assert.equal(p.status, 0, `pdftotext (poppler-utils) is needed by these tests: ${p.error ?? p.stderr}`);
  return p.stdout.replace(/\f/g, '').replace(/[\n \r]+$/, '');
}
const rendered = (name, text, pages) =>
  `<document${name ? ` name="${name}"` : ''}${pages ? ` pages="${pages}"` : ''}>\n${text}\n</document>\n\n`;

async function post(path, body) {
  const r = await fetch(`${URL_}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

async function alive() {
  const r = await fetch(`${URL_}/health`);
  assert.equal(r.status, 200, 'the server did not survive');
}

test('the PDF fixture reads as two pages of text', () => {
  const t = pdfText(PDF);
  assert.match(t, /The launch code is 4417\./);
  assert.match(t, /Page two says hello\./);
});

test('OpenAI chat: a PDF file part is its rendered text, and equals `run --chat --attach`', async () => {
  const N = 24;
  const file = { type: 'file', file: { filename: 'report.pdf', file_data: `data:application/pdf;base64,${PDF64}` } };
  const a = await oa.chat.completions.create({
    model: 'x', max_tokens: N, messages: [{ role: 'user', content: [file, { type: 'text', text: Q }] }],
  });
  const b = await oa.chat.completions.create({
    model: 'x', max_tokens: N,
    messages: [{ role: 'user', content: rendered('report.pdf', pdfText(PDF), 2) + Q }],
  });
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
  const ma = a.choices[0].message, mb = b.choices[0].message;
  assert.equal((ma.reasoning_content ?? '') + '|' + ma.content, (mb.reasoning_content ?? '') + '|' + mb.content);
  const dir = mkdtempSync(join(tmpdir(), 'deltafin-docs-'));
  try {
    writeFileSync(join(dir, 'report.pdf'), PDF);
    const p = spawnSync(BIN, ['run', '--model', MODEL, '--chat', '--attach', join(dir, 'report.pdf'), '--prompt', Q,
      '--max-new', String(N)], { encoding: 'utf8' });
    assert.equal(p.status, 0, p.stderr);
    const reasoning = p.stderr.replace(/^deltafin: plan: .*\n/, '');
    assert.equal((ma.reasoning_content ?? '') + '|' + (ma.content ?? ''), reasoning + '|' + p.stdout.replace(/\n$/, ''));
    // a Markdown file: the same rendering, typed by its extension
    writeFileSync(join(dir, 'notes.md'), '# Notes\n\n- one\n- two\n');
    const md = await oa.chat.completions.create({
      model: 'x', max_tokens: N,
      messages: [{ role: 'user', content: [{ type: 'file', file: { filename: 'notes.md',
        file_data: `data:text/markdown;base64,${Buffer.from('# Notes\n\n- one\n- two\n').toString('base64')}` } },
      { type: 'text', text: Q }] }],
    });
    const pm = spawnSync(BIN, ['run', '--model', MODEL, '--chat', '--attach', join(dir, 'notes.md'), '--prompt', Q,
      '--max-new', String(N)], { encoding: 'utf8' });
    assert.equal(pm.status, 0, pm.stderr);
    assert.equal((md.choices[0].message.reasoning_content ?? '') + '|' + (md.choices[0].message.content ?? ''),
      pm.stderr.replace(/^deltafin: plan: .*\n/, '') + '|' + pm.stdout.replace(/\n$/, ''));
    // chat: /attach FILE puts the document before the next message, as run --attach does
    const pr = spawnSync(BIN, ['run', '--model', MODEL, '--chat', '--no-think', '--attach', join(dir, 'notes.md'),
      '--prompt', Q, '--max-new', String(N)], { encoding: 'utf8' });
    const pc = spawnSync(BIN, ['chat', '--model', MODEL, '--no-think', '--max-new', String(N)], { encoding: 'utf8',
      input: `/attach ${join(dir, 'nope.md')}\n/attach ${join(dir, 'notes.md')}\n${Q}\n/quit\n` });
    assert.equal(pr.status, 0, pr.stderr);
    assert.equal(pc.status, 0, pc.stderr);
    assert.match(pc.stdout, /\(--attach .*nope\.md: No such file or directory\)/);
    assert.match(pc.stdout, /\(attached .*notes\.md: 61 bytes of text, sent with your next message\)/);
    const answer = pr.stdout.replace(/\n$/, '');
    assert.ok(answer.length > 0 && pc.stdout.includes(answer), `chat's reply differs from run's:\n${pc.stdout}\n---\n${answer}`);
    // run --attach refuses what the server refuses, naming the file
    writeFileSync(join(dir, 'broken.pdf'), PDF.subarray(0, 300));
    const pb = spawnSync(BIN, ['run', '--model', MODEL, '--chat', '--attach', join(dir, 'broken.pdf'), '--prompt', Q],
      { encoding: 'utf8' });
    assert.notEqual(pb.status, 0);
    assert.match(pb.stderr, /--attach .*broken\.pdf: not a readable PDF/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('Anthropic: base64 PDF, text and content documents are their rendered text (count_tokens and output)', async () => {
  const cases = [
    [{ type: 'base64', media_type: 'application/pdf', data: PDF64 }, 'report.pdf', null, rendered('report.pdf', pdfText(PDF), 2)],
    [{ type: 'text', media_type: 'text/plain', data: 'plain words\n' }, 'plain', 'from a test', null],
    [{ type: 'content', content: [{ type: 'text', text: 'part one' }, { type: 'text', text: 'part two' }] }, null, null,
      rendered(null, 'part one\n\npart two')],
  ];
  for (const [source, title, context, want0] of cases) {
    const want = want0 ?? `<document name="${title}">\n<context>${context}</context>\nplain words\n</document>\n\n`;
    const doc = { type: 'document', source, ...(title ? { title } : {}), ...(context ? { context } : {}) };
    const withDoc = [{ role: 'user', content: [doc, { type: 'text', text: Q }] }];
    const asText = [{ role: 'user', content: [{ type: 'text', text: want + Q }] }];
    const c1 = await an.messages.countTokens({ model: 'm', messages: withDoc });
    const c2 = await an.messages.countTokens({ model: 'm', messages: asText });
    assert.equal(c1.input_tokens, c2.input_tokens, `source ${source.type}`);
    const r1 = await an.messages.create({ model: 'm', max_tokens: 12, messages: withDoc });
    const r2 = await an.messages.create({ model: 'm', max_tokens: 12, messages: asText });
    assert.deepEqual(r1.content, r2.content, `source ${source.type}`);
  }
  // a document inside a tool result
  const tools = [{ name: 'read', description: 'read a file', input_schema: { type: 'object', properties: {} } }];
  const turn = (content) => [{ role: 'user', content: 'read it' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'tu_1', name: 'read', input: {} }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu_1', content }] }];
  const t1 = await an.messages.countTokens({ model: 'm', tools, messages: turn([{ type: 'document',
    source: { type: 'text', media_type: 'text/plain', data: 'file body' } }]) });
  const t2 = await an.messages.countTokens({ model: 'm', tools,
    messages: turn([{ type: 'text', text: rendered(null, 'file body') }]) });
  assert.equal(t1.input_tokens, t2.input_tokens);
});

test('Responses: an input_file is its rendered text', async () => {
  const md = '# Title\n\nSome *markdown* text.';
  const file = { type: 'input_file', filename: 'a.md', file_data: `data:text/markdown;base64,${Buffer.from(md).toString('base64')}` };
  const r1 = await oa.responses.create({ model: 'm', max_output_tokens: 16,
    input: [{ role: 'user', content: [file, { type: 'input_text', text: Q }] }] });
  const r2 = await oa.responses.create({ model: 'm', max_output_tokens: 16,
    input: [{ role: 'user', content: [{ type: 'input_text', text: rendered('a.md', md) + Q }] }] });
  assert.equal(r1.usage.input_tokens, r2.usage.input_tokens);
  assert.equal(JSON.stringify(r1.output.map((o) => o.content ?? o.summary)), JSON.stringify(r2.output.map((o) => o.content ?? o.summary)));
  const pdf = { type: 'input_file', filename: 'report.pdf', file_data: `data:application/pdf;base64,${PDF64}` };
  const r3 = await oa.responses.create({ model: 'm', max_output_tokens: 4, input: [{ role: 'user', content: [pdf] }] });
  const r4 = await oa.responses.create({ model: 'm', max_output_tokens: 4,
    input: [{ role: 'user', content: [{ type: 'input_text', text: rendered('report.pdf', pdfText(PDF), 2) }] }] });
  assert.equal(r3.usage.input_tokens, r4.usage.input_tokens);
});

test('bad documents: clear 400s naming what is wrong, and the server goes on', async () => {
  const anth = (doc) => post('/v1/messages', { model: 'm', max_tokens: 2,
    messages: [{ role: 'user', content: [doc, { type: 'text', text: 'x' }] }] });
  const chat = (file) => post('/v1/chat/completions', { max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'file', file }, { type: 'text', text: 'x' }] }] });
  const resp = (part) => post('/v1/responses', { max_output_tokens: 2,
    input: [{ role: 'user', content: [part] }] });
  const b64 = (s) => Buffer.from(s).toString('base64');
  const cases = [
    [anth({ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: PDF.subarray(0, 300).toString('base64') } }),
      /not a readable PDF \(pdftotext: /],
    [anth({ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: makePdf([], { blank: 3 }).toString('base64') } }),
      /the PDF has 3 pages but no text layer/],
    [anth({ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: b64('hello') } }),
      /not a PDF \(it does not start with %PDF-\)/],
    [anth({ type: 'document', source: { type: 'url', url: 'https://example.com/a.pdf' } }), /"url" documents are not supported/],
    [anth({ type: 'document', source: { type: 'file', file_id: 'file_1' } }), /"file" documents are not supported/],
    [anth({ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'x' }, citations: { enabled: true } }),
      /citations\.enabled: true is not supported/],
    [anth({ type: 'document', source: { type: 'base64', media_type: 'image/png', data: b64('x') } }),
      /documents of type "image\/png" are not read here/],
    [anth({ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'not base64!' } }),
      /not valid base64/],
    [anth({ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'a\u0000b' } }), /NUL byte/],
    [chat({ filename: 'x.txt', file_data: `data:text/plain;base64,${Buffer.from([0x66, 0xff, 0x66]).toString('base64')}` }),
      /not UTF-8 text \(byte 1\)/],
    [chat({ file_id: 'file-abc' }), /file_id: files by id are not supported/],
    [chat({ filename: 'x.pdf', file_data: 'data:application/pdf,plain' }), /not base64/],
    [resp({ type: 'input_file', file_url: 'https://example.com/a.pdf' }), /files by id or URL are not supported/],
    [resp({ type: 'input_file', filename: 'a.pdf', file_data: `data:application/pdf;base64,${PDF.subarray(0, 200).toString('base64')}` }),
      /not a readable PDF/],
  ];
  for (const [p, re] of cases) {
    const r = await p;
    assert.equal(r.status, 400, r.text);
    assert.match(r.json?.error?.message ?? '', re);
  }
  // a file part outside a user message
  const r = await post('/v1/chat/completions', { max_tokens: 2, messages: [{ role: 'system', content: [{ type: 'file',
    file: { file_data: `data:text/plain;base64,${b64('x')}` } }] }, { role: 'user', content: 'x' }] });
  assert.equal(r.status, 400);
  assert.match(r.json.error.message, /file parts belong in user messages/);
  await alive();
});

test('malformed PDFs (truncated, bytes flipped, spliced): each a 200 or a 400, never a dead server', async () => {
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
  const counts = { 200: 0, 400: 0 };
  for (let i = 0; i < 40; i++) {
    const b = Buffer.from(PDF);
    let m;
    if (i % 4 === 0) m = b.subarray(0, 9 + rnd(b.length - 9));
    else if (i % 4 === 1) { for (let k = 0; k < 1 + rnd(8); k++) b[9 + rnd(b.length - 9)] = rnd(256); m = b; }
    else if (i % 4 === 2) m = Buffer.concat([b.subarray(0, 9 + rnd(200)), Buffer.from(Array.from({ length: rnd(300) }, () => rnd(256))), b.subarray(200)]);
    else m = Buffer.concat([b.subarray(0, rnd(b.length)), b.subarray(rnd(b.length))]);
    const r = await post('/v1/chat/completions', { max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'file',
      file: { filename: 'm.pdf', file_data: `data:application/pdf;base64,${m.toString('base64')}` } }] }] });
    assert.ok(r.status === 200 || r.status === 400, `variant ${i}: HTTP ${r.status} ${r.text.slice(0, 200)}`);
    if (r.status === 400) assert.match(r.json.error.message, /PDF|document|UTF-8|NUL/);
    counts[r.status]++;
  }
  console.log(`# malformed PDFs: ${counts[200]} read, ${counts[400]} refused`);
  assert.ok(counts[400] > 0, 'no malformed PDF was refused');
  await alive();
});
