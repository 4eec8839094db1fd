// page_test.mjs - the chat page at / (web/, bundled into the binary) in headless Chromium
// (run by run_server_tests.sh).
//
// Drives Debian's chromium (/usr/bin/chromium, or $CHROMIUM) with the npm
// playwright-core package.  Playwright's own browser download does not work
// offline, so the system browser is used; a missing browser is a failure, not a
// skip (CI installs the chromium package).  The tests, in order, on one browser:
//   - streaming: a typed message gets a reply from the real server that grows
//     while it streams (the reasoning fold), the status line counts chunks and
//     tok/s, the model name is /v1/models', the live view's numbers are /metrics'
//   - stop (Escape), regenerate, edit-and-resend: what each sends and keeps
//   - a reloaded page keeps its conversations and settings
//   - rendering: a conversation imported from JSON (and a reply the browser side
//     fakes with page.route: only here) shows Markdown, highlighted code with a
//     copy button, no raw HTML, no image; export gives the conversation back
//   - light / dark / phone width: colours, no sideways scrolling, the list folded
//   - documents: a PDF attached and a Markdown file dropped show the tokens the
//     server counts, a scan shows the server's refusal and is left out, the
//     others go as OpenAI file parts and stay with the message after a reload
//   - the Model panel: /v1/plan's plan and card, the last reply's routes as /v1/routes has them
//   - a reply keeps streaming while another conversation is shown, and is whole when shown again
//   - an 8 MB PDF survives a reload (its bytes in IndexedDB; localStorage stays small), and
//     documents an older page kept in localStorage move to IndexedDB on load
// Every page is watched: no request leaves the server's origin, no page error.
// The browser talks to the server through a small pacing proxy started here: it
// forwards everything unchanged but passes the reply's SSE events on one at a
// time, 15 ms apart, so that a loaded machine (where a busy browser could read a
// whole fast reply in one piece) cannot make "the reply grew while streaming"
// fail for a reason that is not the page's.  Screenshots of the main states go to
// $PAGE_SHOTS (run_server_tests.sh: $BUILD/page-shots) or a temporary folder; the
// folder is printed.
// Environment: DELTAFIN_URL  base URL of a running server; PAGE_SHOTS, CHROMIUM.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import http from 'node:http';
import { chromium } from 'playwright-core';
import { makePdf } from './pdf_gen.mjs';

const URL_ = process.env.DELTAFIN_URL ?? 'http://127.0.0.1:8080';
const BROWSER = process.env.CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = process.env.PAGE_SHOTS ?? mkdtempSync(join(tmpdir(), 'deltafin-page-shots-'));

// pacing proxy: a port on 127.0.0.1 that forwards to URL_; event streams pass event by event
function startProxy() {
  const up = new URL(URL_);
  const server = http.createServer((req, res) => {
    const preq = http.request({ host: up.hostname, port: up.port, method: req.method, path: req.url, headers: req.headers },
      (pres) => {
        res.writeHead(pres.statusCode, pres.headers);
        if (!String(pres.headers['content-type'] ?? '').startsWith('text/event-stream')) { pres.pipe(res); return; }
        let buf = '', queue = [], ended = false, busy = false;
        const pump = () => {
          if (busy) return;
          const ev = queue.shift();
          if (ev === undefined) { if (ended) res.end(); return; }
          busy = true;
          res.write(ev, () => setTimeout(() => { busy = false; pump(); }, 15));
        };
        pres.setEncoding('utf8');
        pres.on('data', (d) => {
          buf += d;
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) { queue.push(buf.slice(0, i + 2)); buf = buf.slice(i + 2); }
          pump();
        });
        pres.on('end', () => { if (buf) queue.push(buf); ended = true; pump(); });
      });
    preq.on('error', (e) => { res.destroy(e); });
    res.on('close', () => preq.destroy());
    req.pipe(preq);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

let browser, proxy, base, ctx, page;
const outside = [], errors = [];

// one browser context for the conversation tests (its localStorage is the "browser")
async function watched(context) {
  context.on('request', (r) => {
    const u = r.url();
    if (!u.startsWith(base + '/') && !u.startsWith('blob:' + base) && !u.startsWith('data:')) outside.push(u);
  });
  const p = await context.newPage();
  p.on('pageerror', (e) => errors.push(String(e)));
  p.on('console', (m) => { if (m.type() === 'error' && !/AbortError|aborted/i.test(m.text())) errors.push(m.text()); });
  return p;
}

async function shot(p, name) {
  const path = join(SHOTS, name + '.png');
  await p.screenshot({ path, fullPage: false });
  const b = readFileSync(path);
  assert.ok(b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'not a PNG');
  assert.ok(b.length > 5000, `screenshot ${name} is only ${b.length} bytes`);
}

// the settings panel opened if needed, a field set, the panel closed
async function setField(p, id, v) {
  if (await p.isHidden('#settings')) await p.click('#settings-toggle');
  await p.fill('#' + id, v);
  await p.click('#settings-toggle');
}

const idle = (p) => p.waitForFunction(() => !window.deltafin.running, null, { timeout: 60000 });
const lastMsg = (p) => p.evaluate(() => { const c = window.deltafin.convs.at(-1); return c.messages.at(-1); });

before(async () => {
  assert.ok(existsSync(BROWSER), `${BROWSER} not found: install Debian's chromium package ` +
    '(apt-get install -y chromium) or set CHROMIUM to a Chromium binary');
  mkdirSync(SHOTS, { recursive: true });
  console.log(`# screenshots: ${SHOTS}`);
  proxy = await startProxy();
  base = `http://127.0.0.1:${proxy.address().port}`;
  browser = await chromium.launch({
    executablePath: BROWSER,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'], // playwright gives it a fresh --user-data-dir
  });
  ctx = await browser.newContext({ viewport: { width: 1000, height: 760 }, colorScheme: 'light' });
  await ctx.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base });
  page = await watched(ctx);
});

after(async () => {
  await browser?.close();
  proxy?.closeAllConnections();
  proxy?.close();
});

test('the page: gzip from the binary, the model named, a streamed reply with its reasoning fold and live numbers', async () => {
  const resp = await page.goto(`${base}/`);
  assert.equal(resp.headers()['content-encoding'], 'gzip');
  assert.equal(await page.title(), 'deltafin');
  const models = await (await fetch(`${URL_}/v1/models`)).json();
  await page.waitForFunction((id) => document.getElementById('model').textContent === id, models.data[0].id);
  await setField(page, 'mt', '120');
  await page.click('#live-toggle');
  // every change of the log as the page shows it: [ms, length of the reasoning text, of the reply text]
  await page.evaluate(() => {
    window.seen = [];
    new MutationObserver(() => {
      const a = document.querySelector('.m.assistant');
      if (a) window.seen.push([performance.now(), a.querySelector('.reasoning-text').textContent.length,
        a.querySelector('.content').textContent.length]);
    }).observe(document.getElementById('log'), { childList: true, subtree: true, characterData: true });
  });
  await page.fill('#q', 'Hello from the browser');
  const done = page.waitForEvent('requestfinished', { predicate: (r) => r.url().endsWith('/v1/chat/completions'), timeout: 60000 });
  await page.press('#q', 'Enter');
  const req = await done;
  const r = await req.response();
  assert.equal(r.status(), 200);
  assert.equal(r.headers()['content-type'], 'text/event-stream');
  const sent = JSON.parse(req.postData());
  assert.equal(sent.stream, true);
  assert.equal(sent.max_tokens, 120);
  assert.equal(sent.reasoning_effort, 'max');
  assert.deepEqual(sent.messages, [{ role: 'user', content: 'Hello from the browser' }]);
  await idle(page);
  assert.equal(await page.textContent('.m.user .text'), 'Hello from the browser');
  const seen = await page.evaluate(() => window.seen);
  const steps = new Set(seen.map(([, a, b]) => a + b).filter((n) => n > 0));
  assert.ok(steps.size >= 3, `the reply did not grow while streaming (lengths seen: ${[...steps].join(',')})`);
  const rs = seen.map(([, a]) => a);
  for (let i = 1; i < rs.length; i++) assert.ok(rs[i] >= rs[i - 1], `the reasoning shrank: ${rs}`);
  const grew = seen.filter(([, a, b]) => a + b > 0);
  const spanMs = grew.at(-1)[0] - grew[0][0];
  assert.ok(spanMs > 0, 'the whole reply appeared at once');
  const m = await lastMsg(page);
  assert.ok((m.reasoning + m.content).length > 0, 'empty reply');
  assert.equal(await page.textContent('.m.assistant .reasoning-text'), m.reasoning);
  assert.ok(m.stats.chunks >= 3);
  // the reasoning is folded, and opens
  if (m.reasoning) {
    assert.equal(await page.evaluate(() => document.querySelector('.m.assistant details').open), false);
    await page.click('.m.assistant details summary');
    assert.equal(await page.evaluate(() => document.querySelector('.m.assistant details').open), true);
  }
  assert.match(await page.textContent('#st'), new RegExp(`^${m.stats.chunks} chunks · [0-9.]+ tok/s`));
  await shot(page, 'chat-light');

  // the live view: read /metrics again (the server is idle now), then every cell against /metrics
  const n0 = await page.evaluate(() => window.deltafin.live.reads);
  await page.click('#live-refresh');
  await page.waitForFunction((n) => window.deltafin.live.reads > n, n0);
  const text = await (await fetch(`${URL_}/metrics`)).text();
  const metrics = Object.fromEntries(text.split('\n').filter((l) => l && l[0] !== '#').map((l) => l.split(' ')).map(([k, v]) => [k, Number(v)]));
  const fmt = {
    deltafin_decode_tokens_per_second: (v) => v.toFixed(2),
    deltafin_running_tokens_per_second: (v) => v.toFixed(2),
    deltafin_expert_cache_hit_ratio: (v) => (100 * v).toFixed(1) + ' %',
    deltafin_prompt_cache_hit_ratio: (v) => (100 * v).toFixed(1) + ' %',
    deltafin_expert_bytes_read_total: (v) => (v / 1048576).toFixed(1) + ' MiB',
    deltafin_io_wait_seconds_total: (v) => v.toFixed(3) + ' s',
  };
  const cells = await page.$$eval('#live [data-metric]', (els) => els.map((e) => [e.dataset.metric, e.dataset.value, e.querySelector('.v').textContent]));
  assert.ok(cells.length >= 10, 'the live view shows too few numbers');
  for (const [name, raw, shown] of cells) {
    assert.ok(name in metrics, `the live view shows ${name}, which /metrics lacks`);
    assert.equal(Number(raw), metrics[name], `${name}: the live view read ${raw}, /metrics says ${metrics[name]}`);
    assert.equal(shown, (fmt[name] ?? ((v) => String(Math.round(v))))(metrics[name]), `${name} shown as ${shown}`);
  }
  assert.ok(metrics.deltafin_generated_tokens_total > 0);
  // the reply's own figures, differences of the readings at its start and end: without drafts
  // (this server proposes none) every decode pass made one token
  const derived = (await page.textContent('#live-derived .v')).split(' · ');
  assert.equal(derived.length, 3, derived.join(' · '));
  if (metrics.deltafin_draft_proposed_total === 0) {
    assert.equal(derived[0], 'no drafts');
    assert.equal(derived[2], '1.00', 'tokens per decode pass without drafts');
  }
  await shot(page, 'live-light');
  await page.click('#live-toggle');
  console.log(`# reply grew through ${steps.size} lengths over ${spanMs.toFixed(0)} ms; ${m.stats.chunks} chunks; ` +
    `live view: ${cells.length} numbers equal to /metrics`);
});

test('stop (Escape) keeps the partial reply; regenerate and edit-and-resend send the truncated history', async () => {
  await page.click('#new');
  await setField(page, 'mt', '4000');
  await page.fill('#q', 'A long answer please');
  await page.press('#q', 'Enter');
  await page.waitForFunction(() => (window.deltafin.convs.at(-1).messages.at(-1).stats?.chunks ?? 0) >= 3, null, { timeout: 60000 });
  assert.equal(await page.isEnabled('#stop'), true);
  await page.keyboard.press('Escape');
  await idle(page);
  const m = await lastMsg(page);
  assert.equal(m.stats.stopped, true);
  assert.ok(m.stats.chunks >= 3 && m.stats.chunks < 4000, `stopped after ${m.stats.chunks} chunks`);
  assert.match(await page.textContent('.m.assistant .meta'), /stopped/);
  await page.waitForTimeout(300);
  assert.equal((await lastMsg(page)).stats.chunks, m.stats.chunks, 'the reply grew after Stop');
  assert.equal(await page.isEnabled('#stop'), false);
  assert.equal((await fetch(`${URL_}/health`)).status, 200);
  await shot(page, 'stopped');

  // regenerate: the same history without the reply
  await setField(page, 'mt', '6');
  let reqP = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
  await page.click('.m.assistant .regen');
  let sent = JSON.parse((await reqP).postData());
  assert.deepEqual(sent.messages, [{ role: 'user', content: 'A long answer please' }]);
  await idle(page);
  assert.equal(await page.locator('.m').count(), 2);
  assert.equal((await lastMsg(page)).stats.stopped, undefined);

  // a second turn, then edit the first message: history cut there, the edited text sent
  await page.fill('#q', 'And a second question');
  await page.press('#q', 'Enter');
  await idle(page);
  assert.equal(await page.locator('.m').count(), 4);
  await page.click('.m.user >> nth=0 >> .edit');
  await page.fill('.m.user .edit-box', 'An edited first question');
  reqP = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
  await page.press('.m.user .edit-box', 'Enter');
  sent = JSON.parse((await reqP).postData());
  assert.deepEqual(sent.messages, [{ role: 'user', content: 'An edited first question' }]);
  await idle(page);
  const c = await page.evaluate(() => window.deltafin.convs.at(-1));
  assert.deepEqual(c.messages.map((x) => x.role), ['user', 'assistant']);
  assert.equal(c.messages[0].content, 'An edited first question');
  assert.equal(await page.locator('.m').count(), 2);
});

test('a reloaded page keeps its conversations and settings', async () => {
  const before_ = await page.evaluate(() => window.deltafin.convs.map((c) => [c.id, c.title, c.messages.length]));
  assert.ok(before_.length >= 2);
  await page.reload();
  const after_ = await page.evaluate(() => window.deltafin.convs.map((c) => [c.id, c.title, c.messages.length]));
  assert.deepEqual(after_, before_);
  assert.equal(await page.locator('#convs li').count(), before_.length);
  assert.equal(await page.inputValue('#mt'), '6');
  // the latest conversation is shown, and another one opens from the list
  assert.equal(await page.locator('.m').count(), 2);
  await page.click('#convs li >> nth=1 >> .title');
  await page.waitForFunction(() => document.querySelectorAll('.m').length === 2 &&
    document.querySelector('.m.user .text').textContent === 'Hello from the browser');
  // rename and delete
  page.once('dialog', (d) => d.accept('Renamed'));
  await page.click('#convs li.current .rename');
  assert.equal(await page.textContent('#convs li.current .title'), 'Renamed');
  const n = await page.locator('#convs li').count();
  page.once('dialog', (d) => d.accept());
  await page.click('#convs li.current .delete');
  assert.equal(await page.locator('#convs li').count(), n - 1);
  await page.reload();
  assert.equal(await page.locator('#convs li').count(), n - 1);
});

const MD = ['## Result', '', 'Some **bold** text, `inline code` and a [link](https://example.com/).', '',
  '| a | b |', '|---|---|', '| 1 | 2 |', '', '```python', 'def square(x):', '    return x * x  # the square', '```', '',
  '<img src="http://example.com/x.png" onerror="window.pwned=1"> <script>window.pwned=2</script>',
  '![an image](http://example.com/y.png)'].join('\n');

test('rendering: Markdown, highlighted code with a copy button, no raw HTML or image; export and import', async () => {
  const conv = { id: 'imported-1', title: 'Markdown sample', created: 1, updated: Date.now() + 1000, messages: [
    { role: 'user', content: 'Show me some Markdown' },
    { role: 'assistant', content: MD, reasoning: 'The user wants *Markdown*.' }] };
  const file = join(SHOTS, 'import.json');
  writeFileSync(file, JSON.stringify({ deltafin: 1, conversations: [conv] }));
  await page.setInputFiles('#import', file);
  await page.waitForFunction(() => document.querySelector('#convs li.current .title')?.textContent === 'Markdown sample');
  const a = page.locator('.m.assistant');
  assert.equal(await a.locator('h2').textContent(), 'Result');
  assert.equal(await a.locator('strong').textContent(), 'bold');
  assert.equal(await a.locator('table tr').count(), 2);
  assert.equal(await a.locator('a[href="https://example.com/"]').getAttribute('rel'), 'noopener noreferrer');
  assert.equal(await a.locator('.code code.language-python').textContent(), 'def square(x):\n    return x * x  # the square\n');
  assert.ok(await a.locator('.code .hljs-keyword').count() >= 2, 'the code is not highlighted');
  assert.equal(await a.locator('.code .hljs-comment').textContent(), '# the square');
  assert.equal(await a.locator('img, script').count(), 0);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
  assert.match(await a.locator('.content').textContent(), /<script>window.pwned=2<\/script>/); // shown as text
  assert.equal(await a.locator('details').evaluate((d) => d.open), false);
  await a.locator('.code [data-copy]').click();
  await page.waitForFunction(() => document.querySelector('.code [data-copy]').textContent === 'Copied');
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), 'def square(x):\n    return x * x  # the square\n');
  await shot(page, 'markdown-light');
  // export: every conversation, the imported one as it was
  const dl = page.waitForEvent('download');
  await page.click('#export');
  const got = JSON.parse(readFileSync(await (await dl).path(), 'utf8'));
  const back = got.conversations.find((c) => c.id === 'imported-1');
  assert.deepEqual(back.messages, conv.messages);
  // the same file imported again: a new id, nothing replaced; a bad file: a message, nothing added
  await page.setInputFiles('#import', file);
  await page.waitForFunction(() => window.deltafin.convs.filter((c) => c.title === 'Markdown sample').length === 2);
  writeFileSync(file, '{"conversations":[{"messages":[{"role":"robot"}]}]}');
  const n = await page.evaluate(() => window.deltafin.convs.length);
  await page.setInputFiles('#import', file);
  await page.waitForFunction(() => /^import: /.test(document.getElementById('st').textContent));
  assert.equal(await page.evaluate(() => window.deltafin.convs.length), n);
});

test('rendering a streamed reply: Markdown split across SSE events (faked with page.route, in this test only)', async () => {
  const p = await watched(ctx);
  const events = ['## Streamed', '\n\n```c\nint main(void)', ' {\n    return 0;\n', '}\n```\n', 'done.'];
  await p.route('**/v1/chat/completions', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream',
    body: events.map((t) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: t }, finish_reason: null }] })}\n\n`).join('') +
      'data: [DONE]\n\n' }));
  await p.goto(`${base}/`);
  await p.click('#new');
  await p.fill('#q', 'markdown please');
  await p.press('#q', 'Enter');
  await idle(p);
  assert.equal(await p.locator('.m.assistant h2').textContent(), 'Streamed');
  assert.equal(await p.locator('.m.assistant code.language-c').textContent(), 'int main(void) {\n    return 0;\n}\n');
  assert.ok(await p.locator('.m.assistant code.language-c :is(.hljs-keyword, .hljs-type)').count() >= 3);
  await p.close();
});

test('light, dark and a phone-sized screen', async () => {
  const bg = (p) => p.evaluate(() => {
    const [r, g, b] = getComputedStyle(document.body).backgroundColor.match(/\d+/g).map(Number);
    return (r + g + b) / 3;
  });
  await page.evaluate(() => localStorage.removeItem('deltafin.theme'));
  await page.emulateMedia({ colorScheme: 'dark' });
  await page.reload();
  assert.ok(await bg(page) < 60, 'prefers-color-scheme: dark did not give a dark page');
  await shot(page, 'markdown-dark');
  await page.emulateMedia({ colorScheme: 'light' });
  assert.ok(await bg(page) > 200, 'prefers-color-scheme: light did not give a light page');
  // the toggle: system -> light -> dark (kept across a reload)
  await page.click('#theme');
  await page.click('#theme');
  assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
  assert.ok(await bg(page) < 60, 'Theme: dark did not give a dark page');
  await page.reload();
  assert.ok(await bg(page) < 60, 'the dark theme was not kept');
  await page.click('#theme');
  assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), undefined);

  // a phone: 380 px wide, no sideways scrolling, the list folded behind a button
  const phone = await browser.newContext({ viewport: { width: 380, height: 740 }, colorScheme: 'dark', isMobile: true, hasTouch: true });
  const p = await watched(phone);
  await p.goto(`${base}/`);
  await setField(p, 'mt', '8');
  await p.fill('#q', 'Hi from a phone');
  await p.press('#q', 'Enter');
  await idle(p);
  const wide = await p.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(wide <= 380, `the page is ${wide} px wide on a 380 px screen`);
  const box = async () => (await p.locator('#side').boundingBox());
  assert.ok((await box()).x + (await box()).width <= 1, 'the conversation list covers the chat on a phone');
  const send = await p.locator('#go').boundingBox();
  assert.ok(send.x + send.width <= 380, 'the Send button is off the screen');
  await shot(p, 'phone-dark');
  await p.click('#side-open');
  await p.waitForFunction(() => document.getElementById('side').getBoundingClientRect().x >= 0);
  await shot(p, 'phone-list');
  await p.click('#side-close');
  await phone.close();
});

// the page of another server (no pacing proxy) in a browser context of its own, watched like the others
async function pageOn(url) {
  const c = await browser.newContext({ viewport: { width: 1000, height: 700 } });
  const p = await c.newPage();
  p.on('pageerror', (e) => errors.push(String(e)));
  p.on('request', (r) => { if (!r.url().startsWith(url + '/')) outside.push(r.url()); });
  await p.goto(`${url}/`);
  return { c, p };
}

// a server evaluating one position per pass (--batch 1 --threads 1 --ping-ms 100,
// run_server_tests.sh): the progress its pings carry shows while the prompt is evaluated
test('a long prompt shows its progress (ids done of the total, from the server\'s pings)', { skip: !process.env.DELTAFIN_URL_PREFILL }, async () => {
  const { c, p } = await pageOn(process.env.DELTAFIN_URL_PREFILL);
  await setField(p, 'mt', '2');
  await p.evaluate(() => {
    window.lines = [];
    new MutationObserver(() => window.lines.push([document.getElementById('st').textContent,
      document.getElementById('pbar').hidden ? null : document.querySelector('#pbar > div').style.width]))
      .observe(document.getElementById('bottom'), { childList: true, subtree: true, characterData: true, attributes: true });
  });
  await p.fill('#q', 'hello world '.repeat(300));
  await p.press('#q', 'Enter');
  await p.waitForFunction(() => window.lines.some(([t]) => /^evaluating the prompt: \d+ of/.test(t)), null, { timeout: 60000 });
  await shot(p, 'prompt-progress');
  await idle(p);
  const prog = (await p.evaluate(() => window.lines)).map(([t, w]) => [t.match(/^evaluating the prompt: (\d+) of (\d+) ids/), w])
    .filter(([m]) => m).map(([m, w]) => [+m[1], +m[2], w]);
  assert.ok(prog.length >= 1, 'no progress shown');
  const total = prog[0][1];
  const usage = (await lastMsg(p)).stats.usage;
  assert.equal(total, usage.prompt_tokens, 'the total shown is not the prompt\'s ids');
  for (let i = 1; i < prog.length; i++) assert.ok(prog[i][0] >= prog[i - 1][0] && prog[i][1] === total, `progress went back: ${JSON.stringify(prog)}`);
  assert.ok(prog.some(([d, , w]) => d > 0 && d < total && w && parseFloat(w) > 0), `no bar inside the prompt: ${JSON.stringify(prog.slice(0, 5))}`);
  assert.equal(await p.isHidden('#pbar'), true, 'the bar stays after the prompt');
  console.log(`# prompt progress: ${prog.length} updates, ${prog[0][0]} .. ${prog.at(-1)[0]} of ${total}`);
  await c.close();
});

// the tokens a document adds to a user message, as the server counts them (what the page shows)
async function docCost(type, data, name) {
  const count = async (content) => (await (await fetch(`${URL_}/v1/messages/count_tokens`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] }),
  })).json()).input_tokens;
  const probe = { type: 'text', text: '?' };
  return await count([{ type: 'document', title: name, source: { type: 'base64', media_type: type, data } }, probe]) -
    await count([probe]);
}

test('documents: a PDF attached and a Markdown file dropped, counted by the server, sent as file parts; a scan refused by name; kept on reload', async () => {
  const pdf = makePdf(['The launch code is 4417.']), md = Buffer.from('# Notes\n\n- one\n- two\n');
  await page.click('#new');
  await page.setInputFiles('#attach', [
    { name: 'code.pdf', mimeType: 'application/pdf', buffer: pdf },
    { name: 'scan.pdf', mimeType: 'application/pdf', buffer: makePdf([], { blank: 2 }) },
  ]);
  // a drop anywhere on the page
  await page.evaluate((b64) => {
    const dt = new DataTransfer();
    dt.items.add(new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], 'notes.md', { type: 'text/markdown' }));
    document.getElementById('log').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
  }, md.toString('base64'));
  await page.waitForFunction(() => window.deltafin.pending.length === 3 &&
    window.deltafin.pending.every((x) => x.tokens != null || x.error), null, { timeout: 30000 });
  const pend = await page.evaluate(() => window.deltafin.pending.map((x) => [x.name, x.tokens ?? null, x.error ?? null]));
  const nPdf = await docCost('application/pdf', pdf.toString('base64'), 'code.pdf');
  const nMd = await docCost('text/markdown', md.toString('base64'), 'notes.md');
  assert.ok(nPdf > 5 && nMd > 5, `${nPdf} ${nMd}`);
  // in the order they arrived: the drop's file is counted while the scan still waits for its refusal
  const byName = Object.fromEntries(pend.map(([n, t, e]) => [n, [t, e]]));
  assert.deepEqual(Object.keys(byName).sort(), ['code.pdf', 'notes.md', 'scan.pdf']);
  assert.deepEqual([byName['code.pdf'][0], byName['notes.md'][0], byName['scan.pdf'][0]], [nPdf, nMd, null]);
  assert.match(byName['scan.pdf'][1], /^the PDF has 2 pages but no text layer/);
  const chips = (await page.locator('#pending .doc').allTextContents()).join('\n');
  assert.match(chips, new RegExp(`code\\.pdf · ${nPdf} tokens`));
  assert.match(chips, new RegExp(`notes\\.md · ${nMd} tokens`));
  assert.match(chips, /scan\.pdf · .*no text layer/);
  // the browser logs the refused count (400) as a failed load: that one is expected
  const refused = errors.findIndex((e) => /status of 400/.test(e));
  assert.ok(refused >= 0, `no 400 logged for the scan: ${errors}`);
  errors.splice(refused, 1);
  await shot(page, 'documents');
  // the refused one is left out of the message; the others go first, as file parts
  const done = page.waitForEvent('requestfinished', { predicate: (r) => r.url().endsWith('/v1/chat/completions'), timeout: 60000 });
  await page.fill('#q', 'What is the launch code?');
  await page.click('#go');
  const req = await done;
  assert.equal((await req.response()).status(), 200);
  const last = JSON.parse(req.postData()).messages.at(-1);
  assert.deepEqual(last.content.map((x) => x.type), ['file', 'file', 'text']);
  const files = Object.fromEntries(last.content.slice(0, 2).map((x) => [x.file.filename, x.file.file_data]));
  assert.deepEqual(files, { 'code.pdf': 'data:application/pdf;base64,' + pdf.toString('base64'),
    'notes.md': 'data:text/markdown;base64,' + md.toString('base64') });
  assert.equal(last.content[2].text, 'What is the launch code?');
  await idle(page);
  const m = await lastMsg(page);
  assert.ok(m.stats.usage.prompt_tokens > nPdf + nMd, JSON.stringify(m.stats.usage));
  assert.equal(await page.evaluate(() => window.deltafin.pending.length), 0);
  assert.ok(await page.isHidden('#pending'));
  // the message keeps its documents, also after a reload
  await page.reload();
  assert.deepEqual((await page.locator('.m.user .doc').allTextContents()).sort(),
    [`code.pdf · ${nPdf} tokens`, `notes.md · ${nMd} tokens`]);
});

test('the Model panel: the plan and card of /v1/plan, the last reply\'s routes equal to /v1/routes', async () => {
  // the conversation shown is the documents test's, its reply the server's last
  await page.click('#model-toggle');
  await page.waitForSelector('#plan-text');
  const p = await (await fetch(`${URL_}/v1/plan`)).json();
  assert.equal(await page.textContent('#plan-text'), p.plan_text);
  assert.match(p.plan_text, /memory plan for --mem/);
  if (p.card === null) assert.equal(await page.textContent('#model-card'), 'This model folder has no README.md.');
  const facts = await page.textContent('.facts');
  assert.ok(facts.includes(`${p.info.experts} per MoE layer, ${p.info.experts_per_token} per token`), facts);
  const m = await lastMsg(page);
  assert.match(m.id ?? '', /^chatcmpl-/, 'the reply keeps its completion id');
  await page.waitForSelector('svg.routes');
  const r = await (await fetch(`${URL_}/v1/routes?id=${m.id}`)).json();
  assert.ok(r.rows > 0);
  const cells = await page.$$eval('svg.routes rect', (els) => els.map((e) => [+e.dataset.layer, +e.dataset.expert, +e.dataset.count]));
  assert.equal(cells.length, r.moe_layers.length * r.experts);
  for (const [l, x, n] of cells) assert.equal(n, r.counts[r.moe_layers.indexOf(l)][x], `layer ${l} expert ${x}`);
  assert.ok((await page.textContent('#routes-box')).includes(`${r.rows} rows evaluated for it`));
  await page.locator('svg.routes').scrollIntoViewIfNeeded();
  await shot(page, 'model');
  // a conversation without a reply has no plot
  await page.click('#new');
  assert.equal(await page.textContent('#routes-box'), 'No reply yet in this conversation.');
  await page.click('#model-toggle');
});

test('switching conversations while a reply streams: it goes on, and is whole when shown again', async () => {
  const first = await page.evaluate(() => window.deltafin.convs[0].id);
  await setField(page, 'mt', '300');
  await page.fill('#q', 'Tell me a long story');
  await page.press('#q', 'Enter');
  const id = await page.evaluate(() => window.deltafin.convs.at(-1).id);
  await page.waitForFunction(() => (window.deltafin.convs.at(-1).messages.at(-1).stats?.chunks ?? 0) >= 3, null, { timeout: 60000 });
  await page.click(`.conv[data-id="${first}"] .title`);
  assert.equal(await page.locator('.m.streaming').count(), 0, 'the other conversation shows no streaming reply');
  const n0 = (await lastMsg(page)).stats.chunks;
  await page.click(`.conv[data-id="${id}"] .title`);
  if (await page.evaluate(() => window.deltafin.running)) {
    assert.equal(await page.locator('.m.assistant.streaming').count(), 1, 'shown again: still streaming');
    await page.waitForFunction((n) => window.deltafin.convs.at(-1).messages.at(-1).stats.chunks > n + 2, n0, { timeout: 60000 });
  }
  await idle(page);
  const m = await lastMsg(page);
  assert.ok(m.stats.chunks > n0);
  assert.equal(await page.textContent('.m.assistant .reasoning-text'), m.reasoning);
  assert.equal(await page.locator('.m.assistant.streaming').count(), 0);
  assert.equal(await page.textContent('.m.assistant .meta'), await page.textContent('#st'));
});

// on the server without --max-request-bytes (the PREFILL one: its body cap is derived from the
// context and holds a document's base64), in a browser context of its own
test('an 8 MB PDF is kept across a reload: its bytes in IndexedDB, localStorage small', { skip: !process.env.DELTAFIN_URL_PREFILL }, async () => {
  const { c, p } = await pageOn(process.env.DELTAFIN_URL_PREFILL);
  const big = makePdf(['The vault number is 9931.'], { pad: 8 << 20 });
  await p.setInputFiles('#attach', [{ name: 'big.pdf', mimeType: 'application/pdf', buffer: big }]);
  await p.waitForFunction(() => window.deltafin.pending.length === 1 && (window.deltafin.pending[0].tokens != null ||
    window.deltafin.pending[0].error), null, { timeout: 60000 });
  const x = await p.evaluate(() => window.deltafin.pending[0]);
  assert.equal(x.error, undefined);
  await setField(p, 'mt', '4');
  await p.fill('#q', 'What is the vault number?');
  await p.click('#go');
  await idle(p);
  await p.evaluate(() => window.deltafin.storing);
  const ls = await p.evaluate(() => localStorage.getItem('deltafin.conversations').length);
  assert.ok(ls < 1 << 20, `localStorage holds ${ls} characters`);
  assert.doesNotMatch(await p.textContent('#st'), /not saved|tab only/);
  await p.reload();
  assert.deepEqual(await p.locator('.m.user .doc').allTextContents(), [`big.pdf · ${x.tokens} tokens`]);
  const reqP = p.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
  await p.click('.m.assistant .regen');
  const sent = JSON.parse((await reqP).postData());
  assert.equal(sent.messages.at(-1).content[0].file.file_data, 'data:application/pdf;base64,' + big.toString('base64'));
  await idle(p);
  assert.equal((await lastMsg(p)).stats.error, undefined);
  await c.close();
});

test('documents an older page kept in localStorage move to IndexedDB on load, and are sent from there', { skip: !process.env.DELTAFIN_URL_PREFILL }, async () => {
  const { c, p } = await pageOn(process.env.DELTAFIN_URL_PREFILL);
  const md = Buffer.from('# Old notes\n\nkept by an older page\n').toString('base64');
  const old = [{ id: 'old1', title: 'Old', created: 1, updated: 2, messages: [{ role: 'user', content: 'hi',
    docs: [{ name: 'old.md', type: 'text/markdown', size: 33, tokens: 9, data: md }] }] }];
  await p.evaluate((v) => localStorage.setItem('deltafin.conversations', JSON.stringify(v)), old);
  await p.reload();
  await p.evaluate(() => window.deltafin.storing);
  const saved = await p.evaluate(() => localStorage.getItem('deltafin.conversations'));
  assert.ok(!saved.includes(md), 'the bytes are still in localStorage');
  assert.match(saved, /"ref":"/);
  await p.reload(); // nothing in memory now: the bytes must come from IndexedDB
  await setField(p, 'mt', '2');
  const reqP = p.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
  await p.fill('#q', 'And?');
  await p.click('#go');
  const sent = JSON.parse((await reqP).postData());
  assert.equal(sent.messages[0].content[0].file.file_data, 'data:text/markdown;base64,' + md);
  await idle(p);
  await c.close();
});

test('no request left the server origin and no page error', () => {
  assert.deepEqual(outside, []);
  assert.deepEqual(errors, []);
});
