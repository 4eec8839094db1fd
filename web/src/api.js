// api.js - the server's HTTP APIs as the page uses them: the streamed chat
// completion (SSE read event by event: reasoning_content and content deltas,
// the usage chunk, error events), the model list, the Prometheus metrics.
// Nothing here touches the DOM.

export function headers(key) {
  const h = { 'Content-Type': 'application/json' };
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

// the request body of a conversation under the settings (only the fields set)
export function chatBody(messages, s) {
  const body = { messages, stream: true, stream_options: { include_usage: true }, max_tokens: +s.max_tokens || 1024 };
  if (s.temperature !== '' && s.temperature != null) body.temperature = +s.temperature;
  if (s.top_p !== '' && s.top_p != null) body.top_p = +s.top_p;
  if (s.seed !== '' && s.seed != null) body.seed = Math.trunc(+s.seed);
  // K3's thinking: reasoning_effort "none" turns it off, the others set its effort
  if (s.thinking) body.reasoning_effort = s.thinking;
  return body;
}

// POST /v1/chat/completions with stream: true; on(kind, text) for each delta
// ('reasoning' | 'content' | 'tool' | 'error'), on('usage', obj) once, and
// on('progress', { prompt_done, prompt_total, prompt_reused, seconds }) for each
// ping the server sends while it evaluates the prompt (server.c progress_ping),
// on('id', id) once with the completion's id (GET /v1/routes?id= names it).
// Resolves with the finish reason; rejects on an HTTP error (with its message)
// or when signal aborts (AbortError).
export async function streamChat(body, key, signal, on) {
  const r = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(key), body: JSON.stringify(body), signal });
  if (!r.ok) {
    let msg = await r.text();
    try { msg = JSON.parse(msg).error.message; } catch { /* not JSON: the text as it is */ }
    throw new Error(`HTTP ${r.status}: ${msg}`);
  }
  const rd = r.body.getReader(), dec = new TextDecoder();
  let buf = '', finish = null, lastId = null;
  for (;;) {
    const { done, value } = await rd.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of ev.split('\n')) {
        // ": ping" comments keep the connection; during the prompt they say how far it is
        if (line.startsWith(': ping {')) { try { on('progress', JSON.parse(line.slice(7))); } catch { /* a plain ping */ } }
        if (!line.startsWith('data: ')) continue;
        const d = line.slice(6);
        if (d === '[DONE]') continue;
        const j = JSON.parse(d);
        if (j.error) { on('error', j.error.message ?? String(j.error)); continue; }
        if (j.id && j.id !== lastId) { lastId = j.id; on('id', j.id); }
        if (j.usage) on('usage', j.usage);
        const ch = j.choices && j.choices[0];
        if (!ch) continue;
        if (ch.finish_reason) finish = ch.finish_reason;
        const dl = ch.delta || {};
        if (dl.reasoning_content) on('reasoning', dl.reasoning_content);
        if (dl.content) on('content', dl.content);
        if (dl.tool_calls) on('tool', JSON.stringify(dl.tool_calls));
      }
    }
  }
  return finish;
}

export async function modelInfo(key) {
  const r = await fetch('/v1/models', { headers: headers(key) });
  if (!r.ok) throw new Error(`HTTP ${r.status}`);
  return (await r.json()).data[0];
}

// Prometheus text -> { name: number } (the lines without labels, which is all /metrics writes)
export function parseMetrics(text) {
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const sp = line.lastIndexOf(' ');
    if (sp > 0) m[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return m;
}

export async function metrics(key) {
  const r = await fetch('/metrics', { headers: headers(key) });
  if (!r.ok) throw new Error(`HTTP ${r.status}`);
  return parseMetrics(await r.text());
}
