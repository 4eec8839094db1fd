// forced_tools_test.mjs - forcing each of Claude Code's tools (issue 36): the request Claude Code
// sent (recorded/claude-code/session-a-turn1.json: its system prompt, messages and tools with
// their own input_schema) is posted to /v1/messages once per tool with tool_choice
// {type: "tool", name}, and the tool_use input that comes back must validate against that
// tool's input_schema with ajv (tests/server's, by path: tests/agents' lock stays as it is).
// Run by run_agent_tests.sh: node tests/agents/forced_tools_test.mjs PORT
//
// The request is the recorded one with thinking off (a forced tool choice with thinking is
// refused by Anthropic's API, and Claude Code never sends the pair) and context_management
// dropped (its clear_thinking edit needs thinking); tools, system and messages are unchanged.
// Tools with defer_loading are not shown to the model until a tool search names them, so
// they are not forced.  Each tool is forced three times: greedy, then twice at temperature 1
// (unseeded: Anthropic's API has no seed).  Every reply that ends must hold valid input; a
// reply cut by max_tokens inside a free string holds no arguments to judge and is reported,
// and a tool fails when all three are cut.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { errorsOf } from '../server/ajv_check.mjs';

const port = process.argv[2];
if (!port) { console.error('usage: node tests/agents/forced_tools_test.mjs PORT'); process.exit(2); }
const here = fileURLToPath(new URL('.', import.meta.url));
const rec = JSON.parse(readFileSync(`${here}recorded/claude-code/session-a-turn1.json`, 'utf8')).body;
const MAX_TOKENS = 2048;

async function post(body) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/messages`, { method: 'POST',
    headers: { 'Content-Type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'unused' },
    body: JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* reported below */ }
  return { status: r.status, text, json };
}

let failed = 0, passed = 0;
const forced = rec.tools.filter((t) => !t.defer_loading);
for (const t of rec.tools.filter((x) => x.defer_loading)) console.log(`# ${t.name}: defer_loading, not forced`);
for (const tool of forced) {
  const tries = [{}, { temperature: 1 }, { temperature: 1 }];
  const notes = [];
  let ok = false, bad = null;
  for (const [k, samp] of tries.entries()) {
    const { thinking, context_management, output_config, stream, ...base } = rec;
    const t0 = Date.now();
    const r = await post({ ...base, max_tokens: MAX_TOKENS, tool_choice: { type: 'tool', name: tool.name }, ...samp });
    const ms = Date.now() - t0;
    const what = k ? `temperature 1 (#${k})` : 'greedy';
    if (r.status !== 200) { bad = `${what}: HTTP ${r.status}: ${r.text.slice(0, 400)}`; break; }
    if (r.json.stop_reason === 'max_tokens') { notes.push(`${what} cut at ${r.json.usage?.output_tokens} tokens`); continue; }
    const uses = r.json.content.filter((b) => b.type === 'tool_use');
    if (r.json.stop_reason !== 'tool_use' || uses.length === 0 || uses.some((u) => u.name !== tool.name)) {
      bad = `${what}: stop_reason ${r.json.stop_reason}, blocks ${JSON.stringify(r.json.content).slice(0, 400)}`;
      break;
    }
    const errs = uses.map((u) => errorsOf(tool.input_schema, u.input)).filter(Boolean);
    if (errs.length) { bad = `${what}: input ${JSON.stringify(uses[0].input).slice(0, 300)} not valid: ${errs.join('; ')}`; break; }
    notes.push(`${what} valid in ${ms} ms: ${JSON.stringify(uses[0].input).slice(0, 80)}`);
    ok = true;
  }
  if (ok && !bad) { passed++; console.log(`ok - forced ${tool.name}: ${notes.join('; ')}`); }
  else { failed++; console.log(`not ok - forced ${tool.name}: ${bad ?? `every reply cut by max_tokens (${notes.join('; ')})`}`); }
  if (bad && notes.length) console.log(`#   before that: ${notes.join('; ')}`);
}
console.log(`# forcing Claude Code's tools: ${passed} of ${forced.length} gave valid arguments`);
process.exit(failed ? 1 : 0);
