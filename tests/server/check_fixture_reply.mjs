// check_fixture_reply.mjs NAME REPLY - is REPLY (a file) a valid answer to the
// fixture tests/server/fixtures/NAME.json?  Prints "ok" or "bad: why: ...";
// used by run_server_tests.sh for the replayed SDK requests.
import { readFileSync } from 'node:fs';

const [name, file] = process.argv.slice(2);
const t = readFileSync(file, 'utf8');
const req = JSON.parse(readFileSync(new URL(`./fixtures/${name}.json`, import.meta.url), 'utf8'));
const ok = (c, why) => { if (!c) { console.log(`bad: ${why}: ${t.slice(0, 300)}`); process.exit(0); } };
try {
  if (req.stream) {
    const ev = t.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
    if (name.startsWith('messages.')) {
      const types = ev.map((d) => JSON.parse(d).type);
      ok(types[0] === 'message_start' && types.at(-1) === 'message_stop' && types.includes('message_delta'),
        `event order ${types.join(',')}`);
      ok(types.includes('content_block_start') && types.includes('content_block_stop'), 'content blocks');
    } else {
      ok(ev.at(-1) === '[DONE]', 'no [DONE]');
      const ch = ev.slice(0, -1).map((d) => JSON.parse(d));
      ok(ch.every((c) => c.object === 'chat.completion.chunk'), 'chunk object');
      ok(!req.stream_options?.include_usage || ch.at(-1).usage?.completion_tokens > 0, 'usage chunk');
      ok(ch.some((c) => c.choices[0]?.finish_reason), 'finish_reason');
    }
  } else {
    const j = JSON.parse(t);
    if (name.startsWith('messages.')) {
      ok(j.type === 'message' && j.role === 'assistant' && Array.isArray(j.content) && j.usage.output_tokens > 0 &&
        j.stop_reason, 'message');
    } else if (name.startsWith('chat.')) {
      ok(j.object === 'chat.completion' && j.choices[0].message.role === 'assistant' && j.usage.completion_tokens > 0,
        'chat.completion');
      ok(!req.logprobs || Array.isArray(j.choices[0].logprobs?.content), 'logprobs');
    } else {
      ok(j.object === 'text_completion' && typeof j.choices[0].text === 'string' && j.usage.completion_tokens > 0,
        'text_completion');
    }
  }
} catch (e) {
  ok(false, String(e));
}
console.log('ok');
