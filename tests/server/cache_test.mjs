// cache_test.mjs - `serve --prompt-cache DIR` (run by run_server_tests.sh in two
// phases around a restart of a --parallel 1 server).
//   phase 1: conversation A's first turn, then B's (A leaves the only slot and
//   is saved), then A's second turn resumes from the file (cached_tokens) and
//   answers as DELTAFIN_URL_FRESH (--parallel 1, no cache) does; a damaged
//   file in the directory is skipped and removed.  B's history is written to
//   STATE for phase 2.
//   phase 2 (after a clean restart): B's second turn resumes from the file the
//   server saved at exit.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync, readdirSync } from 'node:fs';
import OpenAI from 'openai';

const URL_ = process.env.DELTAFIN_URL;
const FRESH = process.env.DELTAFIN_URL_FRESH;
const DIR = process.env.DELTAFIN_CACHE_DIR;
const STATE = process.env.DELTAFIN_CACHE_STATE;
const PHASE = process.env.DELTAFIN_CACHE_PHASE;
const oa = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'unused', maxRetries: 0 });
const fresh = FRESH && new OpenAI({ baseURL: `${FRESH}/v1`, apiKey: 'test-key', maxRetries: 0 });
const system = 'You keep a careful log. ' + 'Each entry names the day and the work done. '.repeat(12);
const ask = async (client, messages) => (await client.chat.completions.create({ model: 'x', messages, max_tokens: 10 }));
const reply = (r) => ({ role: 'assistant', content: r.choices[0].message.content ?? '', reasoning_content: r.choices[0].message.reasoning_content });

test('phase 1: an evicted conversation resumes from the cache directory', { skip: PHASE !== '1' }, async () => {
  const a = [{ role: 'system', content: system }, { role: 'user', content: 'Conversation A begins' }];
  const b = [{ role: 'system', content: 'A different system prompt. ' + 'Short rules. '.repeat(10) }, { role: 'user', content: 'Conversation B begins' }];
  const ra = await ask(oa, a);
  a.push(reply(ra));
  const rb = await ask(oa, b);
  b.push(reply(rb));
  assert.ok(readdirSync(DIR).some((f) => f.endsWith('.session')), 'A was saved when B took the slot');
  writeFileSync(`${DIR}/zzzz.session`, 'not a session file');
  a.push({ role: 'user', content: 'And A goes on' });
  const ra2 = await ask(oa, a);
  const cached = ra2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > ra.usage.prompt_tokens - 16, `${cached} cached; A's first prompt was ${ra.usage.prompt_tokens}`);
  await fresh.completions.create({ model: 'x', prompt: [1, 2, 3], max_tokens: 1 });
  const f = await ask(fresh, a);
  assert.equal(f.usage.prompt_tokens_details.cached_tokens, 0);
  assert.deepEqual(reply(ra2), reply(f));
  assert.ok(!readdirSync(DIR).includes('zzzz.session'), 'the damaged file was removed');
  // B takes the slot again (A is saved), then the server stops: B is saved at exit
  b.push({ role: 'user', content: 'B, second turn' });
  const rb2 = await ask(oa, b);
  b.push(reply(rb2));
  writeFileSync(STATE, JSON.stringify({ b, prompt: rb2.usage.prompt_tokens }));
});

test('phase 2: after a restart, the conversation saved at exit resumes', { skip: PHASE !== '2' }, async () => {
  const { b, prompt } = JSON.parse(readFileSync(STATE, 'utf8'));
  b.push({ role: 'user', content: 'B, third turn' });
  const r = await ask(oa, b);
  const cached = r.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > prompt - 16, `${cached} cached after the restart; B's last prompt was ${prompt}`);
});
