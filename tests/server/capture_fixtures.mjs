// capture_fixtures.mjs - regenerates tests/server/fixtures/*.json: the exact
// request bodies the npm openai and @anthropic-ai/sdk clients send (captured
// by a local HTTP listener that answers with a minimal valid response).
// Not run by the tests; run by hand after an SDK upgrade:
//   NODE_PATH=tests/server/node_modules node tests/server/capture_fixtures.mjs
// Each fixture holds the body byte for byte; its name says the endpoint:
// chat.*.json -> /v1/chat/completions, completions.*.json -> /v1/completions,
// messages.*.json -> /v1/messages.  fixtures/SDKS.txt names the SDK versions.
import http from 'node:http';
import { writeFileSync, readFileSync } from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const dir = new URL('./fixtures/', import.meta.url);
const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url)));
let last = null;
const srv = http.createServer((req, res) => {
  let b = '';
  req.on('data', (d) => { b += d; });
  req.on('end', () => {
    last = { url: req.url, body: b };
    const j = JSON.parse(b);
    if (j.stream) { // an empty but well-formed stream for either API
      res.writeHead(200, { 'Content-Type': 'text/event-stream' });
      if (req.url.includes('/messages')) res.end('event: message_stop\ndata: {"type":"message_stop"}\n\n');
      else res.end('data: [DONE]\n\n');
    } else {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(req.url.includes('/messages')
        ? '{"id":"msg_1","type":"message","role":"assistant","model":"x","content":[],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}'
        : '{"id":"c","object":"chat.completion","created":0,"model":"x","choices":[]}');
    }
  });
});
await new Promise((r) => srv.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${srv.address().port}`;
const oa = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const an = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });

const prefix = { '/v1/chat/completions': 'chat', '/v1/completions': 'completions', '/v1/messages': 'messages' };
function save(name) {
  const ep = last.url.replace(/\?.*/, '');
  writeFileSync(new URL(`${prefix[ep]}.${name}.json`, dir), last.body);
  console.log(`${prefix[ep]}.${name}: ${last.body.length} bytes to ${ep}`);
}

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['c', 'f'] } },
    required: ['city'] } } }];

// OpenAI chat: system + tools + streaming + stream_options, with a tool round trip in the history
const s1 = await oa.chat.completions.create({ model: 'deltafin', stream: true, stream_options: { include_usage: true },
  max_tokens: 16, temperature: 0, tools, tool_choice: 'auto', reasoning_effort: 'low',
  messages: [
    { role: 'system', content: 'You are a helpful assistant. Use tools when needed.' },
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
    { role: 'user', content: [{ type: 'text', text: 'And in Fahrenheit?' }] },
  ] });
for await (const _ of s1) { /* drain */ }
save('openai_tools_stream');

await oa.chat.completions.create({ model: 'deltafin', max_completion_tokens: 8, seed: 7, stop: ['\n\n'],
  logprobs: true, top_logprobs: 2,
  messages: [{ role: 'system', content: 'Answer briefly.' }, { role: 'user', content: 'Hello' }] });
save('openai_plain');

await oa.completions.create({ model: 'deltafin', prompt: 'Once upon a time', max_tokens: 8, temperature: 0.8, seed: 3,
  stop: 'END' });
save('openai');

// Anthropic messages as Claude Code sends them: system blocks with cache_control,
// tools, thinking, tool_use / tool_result history, streaming
const atools = [
  { name: 'Bash', description: 'Run a shell command', input_schema: { type: 'object',
    properties: { command: { type: 'string' }, timeout: { type: 'number' } }, required: ['command'],
    additionalProperties: false, $schema: 'http://json-schema.org/draft-07/schema#' } },
  { name: 'Read', description: 'Read a file', cache_control: { type: 'ephemeral' }, input_schema: { type: 'object',
    properties: { file_path: { type: 'string' } }, required: ['file_path'] } },
];
const s2 = await an.messages.create({ model: 'deltafin', max_tokens: 32, stream: true,
  system: [
    { type: 'text', text: "You are Claude Code, Anthropic's official CLI for Claude." },
    { type: 'text', text: 'Working directory: /work/project', cache_control: { type: 'ephemeral' } },
  ],
  thinking: { type: 'enabled', budget_tokens: 1024 }, tools: atools, tool_choice: { type: 'auto' },
  metadata: { user_id: 'user_fixture' },
  messages: [
    { role: 'user', content: [{ type: 'text', text: 'List the files here.' }] },
    { role: 'assistant', content: [
      { type: 'thinking', thinking: 'I should run ls.', signature: 'sig-fixture' },
      { type: 'text', text: 'Running ls.' },
      { type: 'tool_use', id: 'toolu_01', name: 'Bash', input: { command: 'ls' } }] },
    { role: 'user', content: [
      { type: 'tool_result', tool_use_id: 'toolu_01', content: [{ type: 'text', text: 'README.md\nsrc' }] },
      { type: 'text', text: 'Now read the README.', cache_control: { type: 'ephemeral' } }] },
  ] });
for await (const _ of s2) { /* drain */ }
save('claude_code_stream');

await an.messages.create({ model: 'deltafin', max_tokens: 8, system: 'Be terse.', temperature: 0.5, top_p: 0.9,
  stop_sequences: ['###'], messages: [{ role: 'user', content: 'Hi' },
    { role: 'assistant', content: 'Hello.' }, { role: 'user', content: 'Bye' }] });
save('anthropic_plain');

await an.messages.create({ model: 'deltafin', max_tokens: 8, tools: atools, tool_choice: { type: 'any' },
  messages: [{ role: 'user', content: 'Read README.md' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_02', name: 'Read', input: { file_path: 'README.md' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_02', is_error: true, content: 'no such file' }] }] });
save('anthropic_tool_error');

writeFileSync(new URL('SDKS.txt', dir), `captured with openai@${pkg.dependencies.openai} and @anthropic-ai/sdk@${pkg.dependencies['@anthropic-ai/sdk']} by ../capture_fixtures.mjs\n`);
srv.close();
