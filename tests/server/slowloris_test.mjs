// slowloris_test.mjs - slow clients against `deltafin serve --conn-timeout 2` (run by run_server_tests.sh).
//
// A client that sends its request headers a byte at a time, slower than the
// server's connection timeout, must be cut off; while many clients trickle
// headers, the server must keep answering others.
// Environment: DELTAFIN_URL_SLOW  base URL of a server started with --conn-timeout 2.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';

const URL_ = new URL(process.env.DELTAFIN_URL_SLOW ?? 'http://127.0.0.1:8080');
const TIMEOUT_S = 2;
const HEAD = `POST /v1/chat/completions HTTP/1.1\r\nHost: ${URL_.host}\r\nContent-Type: application/json\r\n` +
  'Content-Length: 60\r\nX-Padding: slow-loris-slow-loris-slow-loris\r\n\r\n';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Sends HEAD one byte every gapMs until the server closes or the headers run out.
// Resolves with {closedAt (ms from start, or null), sent, data}.
function trickle(gapMs, maxMs) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const s = net.connect(Number(URL_.port), URL_.hostname);
    let sent = 0, data = '', closedAt = null, timer = null, finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ closedAt, sent, data });
    };
    const step = () => {
      if (closedAt !== null || Date.now() - t0 > maxMs || sent >= HEAD.length - 2) return finish();
      s.write(HEAD[sent++]);
      timer = setTimeout(step, gapMs);
    };
    s.on('connect', step);
    s.on('data', (d) => { data += d; });
    s.on('error', () => { if (closedAt === null) closedAt = Date.now() - t0; finish(); });
    s.on('close', () => { if (closedAt === null) closedAt = Date.now() - t0; finish(); });
  });
}

test(`slow loris: a byte every ${TIMEOUT_S + 1} s is timed out; others are served meanwhile`, async () => {
  const slow = trickle((TIMEOUT_S + 1) * 1000, 12000);
  // 40 more clients trickling fast enough to never be idle for the timeout
  const crowd = Array.from({ length: 40 }, () => trickle(100, 3000));
  await sleep(300);
  const t0 = Date.now();
  for (let i = 0; i < 10; i++) {
    const r = await fetch(`${URL_.origin}/v1/chat/completions`, { method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: `hi ${i}` }], max_tokens: 2 }) });
    const text = await r.text();
    assert.equal(r.status, 200, text);
    assert.equal(JSON.parse(text).object, 'chat.completion');
  }
  const served = Date.now() - t0;
  assert.ok(served < 8000, `10 small requests took ${served} ms next to the slow clients`);
  const s = await slow;
  assert.ok(s.closedAt !== null, `the slow client was never cut off (sent ${s.sent} bytes)`);
  assert.ok(s.closedAt < (TIMEOUT_S + 4) * 1000, `cut off only after ${s.closedAt} ms`);
  assert.ok(s.sent < HEAD.length - 2, 'the slow client got to finish its headers');
  assert.ok(!s.data.startsWith('HTTP/1.1 200'), 'the slow client was answered 200');
  await Promise.all(crowd);
  assert.equal((await fetch(`${URL_.origin}/health`)).status, 200);
  console.log(`# slow client cut off after ${s.closedAt} ms (${s.sent} bytes); 10 requests served in ${served} ms`);
});
