// page_test.mjs - the chat page at / in headless Chromium (run by run_server_tests.sh).
//
// Drives Debian's chromium (/usr/bin/chromium, or $CHROMIUM) with the npm
// playwright-core package: types a message, sends it, watches the streamed
// reply grow until the response ends, and takes a screenshot.  Playwright's
// own browser download does not work offline, so the system browser is used;
// a missing browser is a failure, not a skip (CI installs the chromium package).
// The browser talks to the server through a small pacing proxy started here:
// it forwards everything unchanged but passes the reply's SSE events on one at
// a time, 15 ms apart, so that a loaded machine (where a busy browser could
// read a whole fast reply in one piece) cannot make "the reply grew while
// streaming" fail for a reason that is not the page's.
// Environment: DELTAFIN_URL  base URL of a running server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import http from 'node:http';
import { chromium } from 'playwright-core';

const URL_ = process.env.DELTAFIN_URL ?? 'http://127.0.0.1:8080';
const BROWSER = process.env.CHROMIUM ?? '/usr/bin/chromium';

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

test('chat page: a typed message gets a streamed reply (headless Chromium)', async () => {
  assert.ok(existsSync(BROWSER), `${BROWSER} not found: install Debian's chromium package ` +
    '(apt-get install -y chromium) or set CHROMIUM to a Chromium binary');
  const dir = mkdtempSync(join(tmpdir(), 'deltafin-page-'));
  const proxy = await startProxy();
  const base = `http://127.0.0.1:${proxy.address().port}`;
  const browser = await chromium.launch({
    executablePath: BROWSER,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'], // playwright gives it a fresh --user-data-dir
  });
  try {
    const page = await browser.newPage({ viewport: { width: 900, height: 700 } });
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(`${base}/`);
    assert.equal(await page.title(), 'deltafin');
    await page.fill('#mt', '120');
    // every change of the log, as the page sees it: [ms, text length of the reply box]
    await page.evaluate(() => {
      window.seen = [];
      new MutationObserver(() => {
        const a = document.querySelector('.m.assistant');
        if (a) window.seen.push([performance.now(), a.textContent.length]);
      }).observe(document.getElementById('log'), { childList: true, subtree: true, characterData: true });
    });
    await page.fill('#q', 'Hello from the browser');
    const done = page.waitForEvent('requestfinished',
      { predicate: (r) => r.url().endsWith('/v1/chat/completions'), timeout: 60000 });
    await page.click('#go');
    const req = await done;
    const resp = await req.response();
    assert.equal(resp.status(), 200);
    assert.equal(resp.headers()['content-type'], 'text/event-stream');
    const sent = JSON.parse(req.postData());
    assert.equal(sent.stream, true);
    assert.equal(sent.messages.at(-1).content, 'Hello from the browser');
    // the page appends the reply to its history once the stream has ended
    await page.waitForFunction(() => hist.length === 2, null, { timeout: 10000 });
    assert.equal(await page.textContent('.m.user'), 'Hello from the browser');
    const seen = await page.evaluate(() => window.seen);
    const lengths = seen.map(([, n]) => n);
    const steps = new Set(lengths.filter((n) => n > 0));
    assert.ok(steps.size >= 3, `the reply did not grow while streaming (lengths seen: ${[...steps].join(',')})`);
    for (let i = 1; i < lengths.length; i++) assert.ok(lengths[i] >= lengths[i - 1], `the reply shrank: ${lengths}`);
    const grew = seen.filter(([, n]) => n > 0);
    const spanMs = grew.at(-1)[0] - grew[0][0];
    assert.ok(spanMs > 0, 'the whole reply appeared at once');
    const final = await page.evaluate(() => {
      const a = hist[1];
      return { text: (a.reasoning_content ?? '') + (a.content ?? ''), box: document.querySelector('.m.assistant').textContent };
    });
    assert.ok(final.text.length > 0, 'empty reply');
    assert.equal(Math.max(...lengths), final.box.length);
    assert.match(await page.textContent('#st'), /\d+ chunks/);
    assert.deepEqual(errors, []);
    const png = join(dir, 'chat.png');
    await page.screenshot({ path: png, fullPage: true });
    const b = readFileSync(png);
    assert.ok(b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'not a PNG');
    assert.ok(b.length > 5000, `screenshot is only ${b.length} bytes`);
    console.log(`# reply grew through ${steps.size} lengths over ${spanMs.toFixed(0)} ms to ${final.box.length} chars; ` +
      `screenshot ${b.length} bytes`);
  } finally {
    await browser.close();
    proxy.closeAllConnections();
    proxy.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
