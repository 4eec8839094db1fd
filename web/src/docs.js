// docs.js - documents attached to a message (text, Markdown, PDF), as the
// server reads them: sent as OpenAI chat `file` parts (data: URLs), counted
// before sending by /v1/messages/count_tokens (an Anthropic `document` block
// renders to the same text, src/app/document.c), refused there with the
// server's own message (a scan without text, a file that is not UTF-8).
// Nothing here touches the DOM.
import { headers } from './api.js';

export const ACCEPT = '.txt,.md,.markdown,.pdf,.csv,.json,text/plain,text/markdown,application/pdf';

// a file's media type: its own when the browser knows it, else by extension
export function mediaType(f) {
  const n = f.name.toLowerCase();
  if (n.endsWith('.pdf')) return 'application/pdf';
  if (n.endsWith('.md') || n.endsWith('.markdown')) return 'text/markdown';
  if (f.type) return f.type;
  return 'text/plain';
}

function base64(buf) {
  const b = new Uint8Array(buf);
  let s = '';
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode.apply(null, b.subarray(i, i + 0x8000));
  return btoa(s);
}

export async function readDoc(f) {
  return { name: f.name, type: mediaType(f), data: base64(await f.arrayBuffer()), size: f.size };
}

async function count(content, key) {
  const r = await fetch('/v1/messages/count_tokens', {
    method: 'POST', headers: headers(key), body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] }),
  });
  const t = await r.text();
  let j = null;
  try { j = JSON.parse(t); } catch { /* not JSON */ }
  // the server names the block ("messages[0].content[0]: "); the page shows the reason
  if (!r.ok) throw new Error((j?.error?.message ?? `HTTP ${r.status}`).replace(/^messages\[\d+\]\.content\[\d+\]: /, ''));
  return j.input_tokens;
}

// the tokens a document adds to a message: counted with and without it
export async function docTokens(d, key) {
  const probe = { type: 'text', text: '?' };
  const block = { type: 'document', title: d.name, source: { type: 'base64', media_type: d.type, data: d.data } };
  const [withDoc, without] = await Promise.all([count([block, probe], key), count([probe], key)]);
  return withDoc - without;
}

// a user message's content for the chat API: its documents first, then its text
export function userContent(m) {
  if (!m.docs || !m.docs.length) return m.content;
  const parts = m.docs.map((d) => ({ type: 'file', file: { filename: d.name, file_data: `data:${d.type};base64,${d.data}` } }));
  if (m.content) parts.push({ type: 'text', text: m.content });
  return parts;
}
