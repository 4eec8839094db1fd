// agent_replay.mjs - replays recorded coding-agent requests
// (tests/agents/recorded: Claude Code on /v1/messages, Codex on /v1/responses,
// OpenCode and Continue on chat completions) against a running `deltafin
// serve`, in the order given, each as sent but not streaming and with one
// token to generate, so the time is the time to the first token.  Prints one
// JSON line per request: the prompt tokens, those evaluated and reused
// (the API's usage), expert bytes read (/metrics) and seconds.
//   node agent_replay.mjs URL NAME...   (NAME: claude-code/session-a-turn1, ...)
import fs from 'node:fs';

const [url, ...names] = process.argv.slice(2);
const metric = async (name) => {
  const t = await (await fetch(`${url}/metrics`)).text();
  return Number(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm').exec(t)?.[1] ?? 0);
};
for (const name of names) {
  const rec = JSON.parse(fs.readFileSync(`tests/agents/recorded/${name}.json`, 'utf8'));
  const body = rec.body;
  body.stream = false;
  const path = rec.url.split('?')[0];
  if (path.endsWith('/messages')) body.max_tokens = 1;
  else if (path.endsWith('/responses')) body.max_output_tokens = 1;
  else { body.max_tokens = 1; delete body.stream_options; }
  const b0 = await metric('deltafin_expert_bytes_read_total');
  const t0 = performance.now();
  const res = await fetch(`${url}${path}`, { method: 'POST', body: JSON.stringify(body),
    headers: { 'content-type': 'application/json', 'x-api-key': 'k' } });
  const j = await res.json();
  const s = (performance.now() - t0) / 1000;
  const b1 = await metric('deltafin_expert_bytes_read_total');
  const u = j.usage ?? {};
  let prompt, reused;
  if (path.endsWith('/messages')) { reused = u.cache_read_input_tokens; prompt = u.input_tokens + reused; }
  else if (path.endsWith('/responses')) { prompt = u.input_tokens; reused = u.input_tokens_details?.cached_tokens; }
  else { prompt = u.prompt_tokens; reused = u.prompt_tokens_details?.cached_tokens; }
  if (res.status !== 200 || prompt === undefined) {
    console.error(`agent_replay: ${name}: HTTP ${res.status} ${JSON.stringify(j).slice(0, 300)}`);
    process.exit(1);
  }
  console.log(JSON.stringify({ name, prompt, evaluated: prompt - (reused ?? 0), reused: reused ?? 0,
    expert_bytes: b1 - b0, seconds: Number(s.toFixed(3)) }));
}
