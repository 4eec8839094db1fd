// prompt_cut_test.mjs - a client that leaves during a long prompt, as an
// agent does when its own timeout fires before the first token, against
// `deltafin serve` (tests/agents/run_agent_tests.sh starts it with
// --threads 1; the recorded Claude Code request with a long document added
// takes longer than 30 s there):
//   1. the recorded first request, streaming: keep-alive events (Anthropic's
//      `event: ping`) arrive at most 10 s apart while the prompt is evaluated;
//      after LEAVE_S seconds the client hangs up;
//   2. the server log says the evaluation stopped, within one piece (256 ids)
//      of the hang-up, keeping what it evaluated;
//   3. the same request sent again reuses that prefix (cache_read_input_tokens
//      in message_start) and evaluates only the rest (then it is left too).
//   node prompt_cut_test.mjs PORT SERVER_LOG BODY_JSON
import fs from 'node:fs';

const [port, logPath, bodyPath] = process.argv.slice(2);
const LEAVE_S = Number(process.env.LEAVE_S ?? 32);
const body = JSON.parse(fs.readFileSync(bodyPath, 'utf8')).body;
body.stream = true;
body.max_tokens = 4;
// a long document pasted into the first message (the tool list's JSON, three
// times: ~45K ids), so the prompt outlasts LEAVE_S on one thread
const doc = JSON.stringify(body.tools);
body.messages[0].content.push({ type: 'text', text: `Here is a document:\n${doc}\n${doc}\n${doc}` });
const url = `http://127.0.0.1:${port}/v1/messages`;

// Reads SSE events into out ([{t, event, data}]) until `until` says stop.
async function events(res, until, out = []) {
  const dec = new TextDecoder();
  let buf = '';
  const t0 = Date.now();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, k);
      buf = buf.slice(k + 2);
      const ev = /^event: (.*)$/m.exec(block)?.[1];
      const data = /^data: (.*)$/m.exec(block)?.[1];
      out.push({ t: (Date.now() - t0) / 1000, event: ev, data: data ? JSON.parse(data) : null });
      if (until(out)) return out;
    }
  }
  return out;
}

let fail = 0;
const ok = (m) => console.log(`ok - agents: ${m}`);
const bad = (m) => { console.log(`not ok - agents: ${m}`); fail = 1; };

// 1. leave after LEAVE_S seconds
const ac = new AbortController();
const t0 = Date.now();
const res1 = await fetch(url, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' },
  signal: ac.signal });
const timer = setTimeout(() => ac.abort(), LEAVE_S * 1000);
const ev1 = [];
try {
  await events(res1, (e) => e.some((x) => x.event === 'content_block_start' || x.event === 'message_stop'), ev1);
} catch (e) {
  if (e.name !== 'AbortError') throw e;
}
clearTimeout(timer);
const left = (Date.now() - t0) / 1000;
const times = [0, ...ev1.map((e) => e.t)];
let gap = 0;
for (let i = 1; i < times.length; i++) gap = Math.max(gap, times[i] - times[i - 1]);
gap = Math.max(gap, left - times[times.length - 1]);
const pings = ev1.filter((e) => e.event === 'ping').length;
console.log(`# first request: left after ${left.toFixed(1)} s with ${pings} ping events, the longest wait ${gap.toFixed(1)} s`);
if (ev1.some((e) => e.event === 'content_block_start')) bad(`the prompt took less than ${LEAVE_S} s: nothing to cut`);
else if (pings >= 3 && gap <= 10 && left >= 30) ok(`keep-alive events at most ${gap.toFixed(1)} s apart during a ${left.toFixed(0)} s prompt`);
else bad(`keep-alive: ${pings} pings, longest wait ${gap.toFixed(1)} s over ${left.toFixed(1)} s`);

// 2. the log: stopped within one piece of the hang-up, prefix kept
let line = '';
for (let i = 0; i < 100 && !line; i++) {
  await new Promise((r) => setTimeout(r, 100));
  line = fs.readFileSync(logPath, 'utf8').split('\n').find((l) => l.includes('the client left during its prompt')) ?? '';
}
const m = /stopped after (\d+) of (\d+) ids/.exec(line);
const kept = m ? Number(m[1]) : 0, total = m ? Number(m[2]) : 0;
console.log(`# server: ${line.trim()}`);
if (m && kept > 256 && kept < total) ok(`the server stopped the prompt when the client left, ${kept} of ${total} ids kept`);
else bad(`no stop logged: '${line}'`);

// 3. the same request again: continues from the kept prefix
// (message_start reports the split at once; the rest of the prompt is not waited for)
const ac2 = new AbortController();
const res2 = await fetch(url, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' },
  signal: ac2.signal });
const ev2 = await events(res2, (e) => e.some((x) => x.event === 'message_start'));
ac2.abort();
const start = ev2.find((e) => e.event === 'message_start')?.data?.message?.usage;
console.log(`# second request: ${JSON.stringify(start)}`);
if (start && start.cache_read_input_tokens >= kept && start.input_tokens + start.cache_read_input_tokens === total
    && start.input_tokens <= total - kept) ok(`the request sent again evaluated ${start.input_tokens} of ${total} ids (${start.cache_read_input_tokens} kept from the first)`);
else bad(`the second request did not continue: ${JSON.stringify(start)} (kept ${kept} of ${total})`);
process.exit(fail);
