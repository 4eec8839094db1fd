// conv_trace.mjs - a coding-agent-like trace against a running `deltafin serve`
// (used by bench_conv.sh): two conversations that share a long system prompt,
// interleaved turn by turn, each turn sending the whole history (as agents
// do, the earlier replies without their reasoning).  Prints one JSON line:
// prompt tokens sent, reused (cached_tokens) and the seconds to first byte.
// Usage: node bench/conv_trace.mjs URL [turns] [system_words]
const [url, turnsArg, wordsArg] = process.argv.slice(2);
const turns = Number(turnsArg ?? 10), words = Number(wordsArg ?? 3200);
const vocab = ['function', 'return', 'value', 'file', 'error', 'the', 'test', 'build', 'make', 'check', 'list', 'path',
               'config', 'parse', 'read', 'write', 'when', 'never', 'always', 'state'];
let system = 'You are a coding agent. Rules: ';
for (let i = 0; i < words; i++) system += vocab[(i * 7 + (i >> 3)) % vocab.length] + (i % 13 === 12 ? '. ' : ' ');
const conv = [[{ role: 'system', content: system }], [{ role: 'system', content: system }]];
let sent = 0, reused = 0, ttfb = 0;
for (let t = 0; t < turns; t++) {
  for (let c = 0; c < 2; c++) {
    conv[c].push({ role: 'user', content: `Task ${c}.${t}: look at src/file${t}.c and fix the ${vocab[t % vocab.length]} check.` });
    const t0 = performance.now();
    const r = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'x', messages: conv[c], max_tokens: 24 }),
    });
    const j = await r.json();
    ttfb += (performance.now() - t0) / 1000;
    if (!r.ok) { console.error(JSON.stringify(j)); process.exit(1); }
    sent += j.usage.prompt_tokens;
    reused += j.usage.prompt_tokens_details.cached_tokens;
    const m = j.choices[0].message;
    conv[c].push({ role: 'assistant', content: m.content ?? '', reasoning_content: m.reasoning_content });
  }
}
console.log(JSON.stringify({ requests: 2 * turns, prompt_tokens: sent, reused_tokens: reused, evaluated_tokens: sent - reused,
                             seconds: Number(ttfb.toFixed(3)) }));
