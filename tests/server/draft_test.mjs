// draft_test.mjs - speculative decoding in `deltafin serve` (run by run_server_tests.sh).
//
// DELTAFIN_URL is a server without drafts; DELTAFIN_URL_DRAFTS lists servers
// started with --draft (the model drafting for itself, every draft accepted,
// and prompt lookup).  Greedy replies, their log-probabilities and the usage
// must be the same on every one of them, through the OpenAI client, streamed
// and not, over a conversation whose turns reuse the session, and for the
// completions API; the drafting servers' metrics must show drafts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const BASE = process.env.DELTAFIN_URL ?? 'http://127.0.0.1:8080';
const DRAFTS = (process.env.DELTAFIN_URL_DRAFTS ?? '').split(' ').filter(Boolean);
const client = (u) => new OpenAI({ baseURL: `${u}/v1`, apiKey: 'unused', maxRetries: 0 });

async function chat(u, messages, extra = {}) {
  const r = await client(u).chat.completions.create({ model: 'x', messages, max_tokens: 24, ...extra });
  const m = r.choices[0].message;
  return { reasoning: m.reasoning_content ?? '', content: m.content ?? '', finish: r.choices[0].finish_reason,
           usage: [r.usage.prompt_tokens, r.usage.completion_tokens], lp: r.choices[0].logprobs ?? null };
}

async function streamed(u, messages) {
  const s = await client(u).chat.completions.create({ model: 'x', messages, max_tokens: 24, stream: true });
  let text = '';
  for await (const c of s) text += (c.choices[0]?.delta?.reasoning_content ?? '') + (c.choices[0]?.delta?.content ?? '');
  return text;
}

test('drafting servers are running', () => {
  assert.ok(DRAFTS.length >= 1, 'DELTAFIN_URL_DRAFTS names the drafting servers');
});

test('chat: the same replies and logprobs with drafts on and off', async () => {
  const prompts = ['Tell me a story', 'the cat the cat the cat the cat', 'List 1, 2, 3, 4, 5, 6'];
  for (const p of prompts) {
    const want = await chat(BASE, [{ role: 'user', content: p }], { logprobs: true, top_logprobs: 2 });
    for (const u of DRAFTS) {
      const got = await chat(u, [{ role: 'user', content: p }], { logprobs: true, top_logprobs: 2 });
      assert.deepEqual(got, want, `${u}: "${p}"`);
      assert.equal(await streamed(u, [{ role: 'user', content: p }]), want.reasoning + want.content);
    }
  }
});

test('a conversation: later turns reuse the session, replies unchanged', async () => {
  const turns = ['Hello there', 'And again', 'One more time'];
  for (const u of DRAFTS) {
    const hist = [], histBase = [];
    for (const t of turns) {
      hist.push({ role: 'user', content: t });
      histBase.push({ role: 'user', content: t });
      const want = await chat(BASE, histBase);
      const got = await chat(u, hist);
      assert.deepEqual(got, want, `${u}: turn "${t}"`);
      hist.push({ role: 'assistant', content: got.content, reasoning_content: got.reasoning });
      histBase.push({ role: 'assistant', content: want.content, reasoning_content: want.reasoning });
    }
  }
});

test('completions: the same text', async () => {
  const body = { model: 'x', prompt: 'one two three one two three one two', max_tokens: 30 };
  const want = (await client(BASE).completions.create(body)).choices[0].text;
  for (const u of DRAFTS) assert.equal((await client(u).completions.create(body)).choices[0].text, want, u);
});

test('the self-drafting server accepted drafts', async () => {
  const t = await (await fetch(`${DRAFTS[0]}/metrics`)).text();
  const get = (n) => Number((t.match(new RegExp(`^${n} ([0-9.e+-]+)$`, 'm')) ?? [])[1]);
  assert.ok(get('deltafin_draft_proposed_total') > 0, 'drafts proposed');
  assert.equal(get('deltafin_draft_accepted_total'), get('deltafin_draft_proposed_total'), 'the model drafting for itself');
});
