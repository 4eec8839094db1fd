// main.js - deltafin's chat page: conversations, streaming replies, settings,
// the live view.  Served at / from the binary (web/build.mjs bundles it).
//
// Why no UI framework: the page is one list of messages and a few panels, and
// a reply streams in at one delta per event; a framework would add tens of KB to a
// page compiled into the binary and re-diff the whole conversation on every
// delta.  Here each message is built once as DOM and only the message streaming
// is re-rendered (its Markdown, at most once an animation frame), so a long
// conversation costs nothing while a reply grows.
//
// State: `convs` (every conversation, saved to localStorage after each change),
// `cur` (the one shown), `run` (the request in flight: its AbortController, the
// conversation and the message it writes), `settings`.  Every reply goes through
// generate(): it sends the conversation up to the message it fills, so
// regenerate and edit-and-resend are "truncate the history, then generate"
// (the server reuses the prefix it already evaluated).
import { renderMarkdown, renderStreaming } from './markdown.js';
import { chatBody, modelInfo, streamChat } from './api.js';
import { exportJson, importJson, loadConversations, loadSettings, newId, saveConversations, saveSettings, titleOf } from './store.js';
import { Live } from './live.js';
import { plan, renderPlan, renderRoutes, routes } from './model.js';
import { loadData, pruneDocs, storeData, withoutData } from './docstore.js';
import { ACCEPT, docTokens, readDoc, userContent } from './docs.js';

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

const DEFAULTS = { system: '', temperature: '', top_p: '', seed: '', max_tokens: '1024', thinking: 'max', key: '' };
const FIELDS = { system: 'system', temperature: 'temperature', top_p: 'top_p', seed: 'seed', max_tokens: 'mt', thinking: 'thinking', key: 'key' };

let convs = loadConversations();
let cur = null;
let run = null;
let pending = []; // documents for the next message: { name, type, data, size, tokens | error }
const settings = loadSettings(DEFAULTS);
const live = new Live($('live-grid'), $('live-when'), () => settings.key);

const conv = () => convs.find((c) => c.id === cur);
// the conversations into localStorage without the documents' bytes, which go to IndexedDB
// first (docstore.js: localStorage's quota is a few MB); without a document to store, at once
let storing = Promise.resolve();
const allMessages = () => convs.flatMap((c) => c.messages);
function save() {
  try { saveConversations(withoutData(convs)); } catch (e) { status('not saved in this browser: ' + e.message); } // quota
}
function persist() {
  if (!allMessages().some((m) => (m.docs ?? []).some((d) => d.data && !d.stored))) { save(); return; }
  storing = storing.then(() => storeData(allMessages(), newId)).then((failed) => {
    if (failed.length) status('documents kept in this tab only, not in the browser: ' + failed.join(', '));
    save();
  }).catch((e) => status('not saved in this browser: ' + e.message));
}

/* ---- the conversation list ---- */

function renderSide() {
  const ul = $('convs');
  ul.replaceChildren();
  for (const c of [...convs].sort((a, b) => b.updated - a.updated)) {
    const li = el('li', c.id === cur ? 'conv current' : 'conv');
    li.dataset.id = c.id;
    const t = el('button', 'title', c.title);
    t.onclick = () => { select(c.id); document.body.classList.remove('side-shown'); };
    const ren = el('button', 'icon rename', '✎');
    ren.title = 'Rename'; ren.setAttribute('aria-label', 'Rename');
    ren.onclick = () => {
      const name = prompt('Name of the conversation', c.title);
      if (name && name.trim()) { c.title = name.trim(); persist(); renderSide(); }
    };
    const del = el('button', 'icon delete', '×');
    del.title = 'Delete'; del.setAttribute('aria-label', 'Delete');
    del.onclick = () => {
      if (!confirm(`Delete "${c.title}"?`)) return;
      if (run && run.conv === c) run.ctl.abort();
      convs = convs.filter((x) => x !== c);
      persist();
      storing = storing.then(() => pruneDocs(convs)).catch(() => { /* kept: nothing names them */ });
      select(convs.length ? [...convs].sort((a, b) => b.updated - a.updated)[0].id : null);
    };
    li.append(t, ren, del);
    ul.appendChild(li);
  }
}

function select(id) {
  cur = id;
  renderSide();
  renderLog();
  if (!$('model-panel').hidden) showRoutes();
}

function newConversation() {
  const c = { id: newId(), title: 'New conversation', created: Date.now(), updated: Date.now(), messages: [] };
  convs.push(c);
  persist();
  select(c.id);
  $('q').focus();
  return c;
}

/* ---- messages ---- */

// a message's element: .m.user (text, Edit) or .m.assistant (the reasoning folded,
// the reply as Markdown, its numbers, Copy / Regenerate)
function messageEl(m, i, c) {
  const d = el('div', 'm ' + m.role);
  d.dataset.i = i;
  if (m.role === 'user') {
    if (m.docs && m.docs.length) {
      const ds = el('div', 'docs');
      for (const x of m.docs) ds.appendChild(el('span', 'doc', `${x.name}${x.tokens != null ? ` · ${x.tokens} tokens` : ''}`));
      d.appendChild(ds);
    }
    d.appendChild(el('div', 'text', m.content));
    const acts = el('div', 'acts');
    const ed = el('button', 'edit', 'Edit');
    ed.onclick = () => editMessage(d, c, i);
    acts.appendChild(ed);
    d.appendChild(acts);
    return d;
  }
  const det = el('details', 'reasoning');
  det.append(el('summary', '', 'Reasoning'), el('div', 'reasoning-text'));
  const body = el('div', 'content');
  d.append(det, body, el('div', 'meta'));
  const acts = el('div', 'acts');
  const cp = el('button', 'copy-reply', 'Copy');
  cp.onclick = () => copyText(m.content, cp);
  const rg = el('button', 'regen', 'Regenerate');
  rg.onclick = () => regenerate(c, i);
  acts.append(cp, rg);
  d.appendChild(acts);
  fillAssistant(d, m, !!run && run.msg === m); // the reply still streaming when the log is drawn again
  return d;
}

function fillAssistant(d, m, streaming) {
  const det = d.querySelector('.reasoning');
  det.hidden = !m.reasoning;
  d.querySelector('.reasoning-text').textContent = m.reasoning || '';
  det.querySelector('summary').textContent = streaming && !m.content ? 'Thinking…' :
    `Reasoning (${(m.reasoning || '').length} characters)`;
  d.querySelector('.content').innerHTML = (streaming ? renderStreaming : renderMarkdown)(m.content || '');
  const s = m.stats;
  d.querySelector('.meta').textContent = s && !streaming ? statsLine(s) : ''; // the status line has them meanwhile
  d.classList.toggle('streaming', streaming);
}

function statsLine(s) {
  const parts = [`${s.chunks} chunks`];
  if (s.tps) parts.push(`${s.tps.toFixed(2)} tok/s`);
  if (s.first != null) parts.push(`first token ${s.first.toFixed(2)} s`);
  if (s.usage) parts.push(`prompt ${s.usage.prompt_tokens} (${s.usage.prompt_tokens_details?.cached_tokens ?? 0} reused), reply ${s.usage.completion_tokens}`);
  if (s.stopped) parts.push('stopped');
  if (s.finish && s.finish !== 'stop') parts.push(`finish: ${s.finish}`);
  if (s.error) parts.push('error: ' + s.error);
  return parts.join(' · ');
}

function renderLog() {
  const log = $('log'), c = conv();
  log.replaceChildren();
  if (!c) { log.appendChild(el('div', 'empty', 'Start a conversation below.')); return; }
  c.messages.forEach((m, i) => log.appendChild(messageEl(m, i, c)));
  log.scrollTop = log.scrollHeight;
}

function editMessage(d, c, i) {
  if (d.querySelector('textarea')) return;
  const ta = el('textarea', 'edit-box');
  ta.value = c.messages[i].content;
  ta.rows = Math.min(12, ta.value.split('\n').length + 1);
  const ok = el('button', 'primary save', 'Send'), no = el('button', 'cancel', 'Cancel');
  const box = el('div', 'editing');
  box.append(ta, el('div', 'acts'));
  box.lastChild.append(ok, no);
  d.replaceChildren(box);
  ta.focus();
  no.onclick = () => renderLog();
  const save = async () => {
    const text = ta.value.trim();
    if (!text) return;
    if (run) { run.ctl.abort(); await run.done; } // the reply running ends first (kept, then cut below)
    const docs = c.messages[i].docs;
    c.messages = c.messages.slice(0, i);
    c.messages.push(docs ? { role: 'user', content: text, docs } : { role: 'user', content: text });
    generate(c);
  };
  ok.onclick = save;
  ta.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); save(); }
    if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); renderLog(); }
  });
}

function regenerate(c, i) {
  if (run) return;
  c.messages = c.messages.slice(0, i);
  generate(c);
}

async function copyText(text, btn) {
  try { await navigator.clipboard.writeText(text); } catch {
    const ta = el('textarea'); // http on a non-local address: no clipboard API
    ta.value = text; document.body.appendChild(ta); ta.select(); document.execCommand('copy'); ta.remove();
  }
  const was = btn.textContent;
  btn.textContent = 'Copied';
  setTimeout(() => { btn.textContent = was; }, 1200);
}

/* ---- a reply ---- */

function send() {
  const text = $('q').value.trim();
  const docs = pending.filter((x) => x.tokens != null);
  if ((!text && !docs.length) || run || pending.some((x) => x.tokens == null && !x.error)) return;
  const c = conv() || newConversation();
  $('q').value = '';
  pending = [];
  renderPending();
  c.messages.push(docs.length ? { role: 'user', content: text, docs } : { role: 'user', content: text });
  if (c.messages.length === 1) c.title = titleOf(c.messages);
  generate(c);
}

// the messages the server gets for a conversation's history (the system prompt first)
function apiMessages(history) {
  const out = [];
  if (settings.system.trim()) out.push({ role: 'system', content: settings.system });
  for (const m of history) {
    const x = { role: m.role, content: m.role === 'user' ? userContent(m) : m.content };
    if (m.role === 'assistant' && m.reasoning) x.reasoning_content = m.reasoning;
    out.push(x);
  }
  return out;
}

async function generate(c) {
  const history = c.messages.slice();
  // the documents' bytes, from IndexedDB after a reload
  try { await loadData(history); } catch (e) { status(e.message); return; }
  const m = { role: 'assistant', content: '', reasoning: '', stats: { chunks: 0 } };
  c.messages.push(m);
  c.updated = Date.now();
  persist();
  if (cur !== c.id) cur = c.id;
  renderSide();
  renderLog();
  // the message's element now: none while another conversation is shown, a new one after
  // the log was drawn again (switching away and back while the reply streams)
  const node = () => {
    const i = cur === c.id ? c.messages.indexOf(m) : -1;
    return i < 0 ? null : $('log').querySelector(`.m[data-i="${i}"]`);
  };
  const ctl = new AbortController();
  let ended;
  run = { ctl, conv: c, msg: m, done: new Promise((resolve) => { ended = resolve; }) };
  setRunning(true);
  const t0 = performance.now();
  let t1 = 0, frame = 0;
  const draw = () => {
    frame = 0;
    const d = node();
    if (!d) return;
    fillAssistant(d, m, true);
    const follow = $('log');
    follow.scrollTop = follow.scrollHeight;
  };
  let prog = null; // the server's latest progress ping
  const tick = setInterval(() => { if (!m.stats.chunks) status(prefillLine(prog, (performance.now() - t0) / 1000)); }, 500);
  live.start();
  try {
    m.stats.finish = await streamChat(chatBody(apiMessages(history), settings), settings.key, ctl.signal, (kind, v) => {
      if (kind === 'id') { m.id = v; return; }
      if (kind === 'progress') {
        prog = v;
        status(prefillLine(prog, (performance.now() - t0) / 1000));
        $('pbar').hidden = false;
        $('pbar').firstChild.style.width = (100 * v.prompt_done / v.prompt_total).toFixed(1) + '%';
        return;
      }
      $('pbar').hidden = true;
      if (kind === 'usage') { m.stats.usage = v; return; }
      if (kind === 'error') { m.stats.error = v; return; }
      if (kind === 'reasoning') m.reasoning += v; else m.content += kind === 'tool' ? ` [tool call ${v}]` : v;
      m.stats.chunks++;
      const now = performance.now();
      if (!t1) { t1 = now; m.stats.first = (t1 - t0) / 1000; }
      if (m.stats.chunks > 1) m.stats.tps = (m.stats.chunks - 1) / ((now - t1) / 1000);
      status(statsLine(m.stats));
      if (!frame) frame = requestAnimationFrame(draw);
    });
  } catch (e) {
    if (e.name === 'AbortError') m.stats.stopped = true; else m.stats.error = e.message;
  } finally {
    clearInterval(tick);
    $('pbar').hidden = true;
    if (frame) cancelAnimationFrame(frame);
    run = null;
    c.updated = Date.now();
    persist();
    const d = node();
    if (d) fillAssistant(d, m, false);
    status(statsLine(m.stats));
    setRunning(false);
    live.end();
    if (!$('model-panel').hidden && cur === c.id) showRoutes();
    ended();
  }
}

function status(t) { $('st').textContent = t; }

// while the prompt is evaluated: the server's progress (ids done of total, the rate of
// the ids evaluated here, what is left at that rate), or only the time waited so far
function prefillLine(p, waited) {
  if (!p || !p.prompt_total) return `evaluating the prompt… ${waited.toFixed(0)} s`;
  const here = p.prompt_done - p.prompt_reused, rate = p.seconds > 0 ? here / p.seconds : 0;
  const left = rate > 0 ? (p.prompt_total - p.prompt_done) / rate : null;
  return `evaluating the prompt: ${p.prompt_done} of ${p.prompt_total} ids` +
    ` (${(100 * p.prompt_done / p.prompt_total).toFixed(0)} %, ${p.prompt_reused} reused)` +
    (rate > 0 ? ` · ${rate.toFixed(1)} ids/s` : '') + (left != null ? ` · about ${fmtTime(left)} left` : '') +
    ` · ${waited.toFixed(0)} s`;
}

const fmtTime = (s) => s < 90 ? `${s.toFixed(0)} s` : s < 5400 ? `${(s / 60).toFixed(0)} min` : `${(s / 3600).toFixed(1)} h`;

function setRunning(on) {
  $('stop').disabled = !on;
  $('go').disabled = on;
  document.body.classList.toggle('running', on);
}

/* ---- documents for the next message ---- */

// the chips above the message box: name, size and the tokens the server counts, or its refusal
function renderPending() {
  const box = $('pending');
  box.replaceChildren();
  box.hidden = !pending.length;
  for (const x of pending) {
    const chip = el('span', 'doc' + (x.error ? ' bad' : ''));
    chip.append(el('span', 'name', x.name),
      el('span', 'cost', x.error ? ` · ${x.error}` : x.tokens == null ? ' · counting…' : ` · ${x.tokens} tokens`));
    const rm = el('button', 'icon remove', '×');
    rm.title = 'Remove'; rm.setAttribute('aria-label', `Remove ${x.name}`);
    rm.onclick = () => { pending = pending.filter((y) => y !== x); renderPending(); };
    chip.appendChild(rm);
    box.appendChild(chip);
  }
}

async function attach(files) {
  for (const f of files) {
    const x = { name: f.name, size: f.size, tokens: null };
    pending.push(x);
    renderPending();
    try {
      Object.assign(x, await readDoc(f));
      x.tokens = await docTokens(x, settings.key);
    } catch (e) {
      x.error = e.message;
    }
    renderPending();
  }
}

/* ---- settings, theme, panels ---- */

function bindSettings() {
  for (const [k, id] of Object.entries(FIELDS)) {
    const e = $(id);
    e.value = settings[k];
    e.addEventListener('input', () => { settings[k] = e.value; saveSettings(settings); if (k === 'key') showModel(); });
  }
}

const THEMES = ['system', 'light', 'dark'];
function applyTheme(t) {
  if (t === 'system') delete document.documentElement.dataset.theme; else document.documentElement.dataset.theme = t;
  $('theme').textContent = { system: '◐ auto', light: '☀ light', dark: '☾ dark' }[t];
  $('theme').title = `Theme: ${t} (light / dark / as the system says)`;
  localStorage.setItem('deltafin.theme', t);
}

function togglePanel(btn, panel) {
  panel.hidden = !panel.hidden;
  btn.setAttribute('aria-pressed', String(!panel.hidden));
  return !panel.hidden;
}

async function showModel() {
  try {
    const m = await modelInfo(settings.key);
    $('model').textContent = m.id;
    $('model').title = `context ${m.context_length} tokens · trunk ${m.trunk}${m.trunk_quantized ? ' (quantized)' : ''} · ` +
      `experts ${m.experts}${m.experts_requantized ? ' (requantized)' : ''}`;
  } catch (e) {
    $('model').textContent = 'deltafin (' + (e.message.includes('401') ? 'API key needed: Settings' : e.message) + ')';
  }
}

/* ---- the Model panel: the plan and card (once), the routes of the conversation's last reply ---- */

let planShown = false;
async function showPlan() {
  try {
    renderPlan($('plan-box'), await plan(settings.key));
    planShown = true;
  } catch (e) { $('plan-box').replaceChildren(el('p', 'muted', '/v1/plan: ' + e.message)); }
}

async function showRoutes() {
  const box = $('routes-box'), c = conv();
  const m = c && [...c.messages].reverse().find((x) => x.role === 'assistant' && x.id);
  if (!m) { box.replaceChildren(el('p', 'muted', 'No reply yet in this conversation.')); return; }
  if (run && run.msg === m) { box.replaceChildren(el('p', 'muted', 'The reply is still running.')); return; }
  try {
    renderRoutes(box, await routes(m.id, settings.key));
  } catch (e) {
    // a seat keeps its last reply's routes only; a later reply or a restart replaced them
    box.replaceChildren(el('p', 'muted', `The routes of this conversation's last reply (${m.id}) are no longer kept: ${e.message}`));
  }
}

function download(name, text) {
  const a = el('a');
  a.href = URL.createObjectURL(new Blob([text], { type: 'application/json' }));
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function bind() {
  $('go').onclick = send;
  $('stop').onclick = () => run && run.ctl.abort();
  $('new').onclick = () => { if (!run) newConversation(); };
  $('q').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && run) { e.preventDefault(); run.ctl.abort(); }
  });
  // every code block's copy button, whenever it was rendered
  $('log').addEventListener('click', (e) => {
    const b = e.target.closest('button[data-copy]');
    if (b) copyText(b.closest('.code').querySelector('code').textContent, b);
  });
  $('settings-toggle').onclick = () => togglePanel($('settings-toggle'), $('settings'));
  $('live-toggle').onclick = () => { if (togglePanel($('live-toggle'), $('live'))) live.poll(); };
  $('live-refresh').onclick = () => live.poll();
  $('model-toggle').onclick = () => {
    if (!togglePanel($('model-toggle'), $('model-panel'))) return;
    if (!planShown) showPlan();
    showRoutes();
  };
  $('theme').onclick = () => applyTheme(THEMES[(THEMES.indexOf(localStorage.getItem('deltafin.theme') || 'system') + 1) % 3]);
  $('side-open').onclick = () => document.body.classList.add('side-shown');
  $('side-close').onclick = () => document.body.classList.remove('side-shown');
  $('export').onclick = async () => {
    // self-contained: each document with its bytes (from IndexedDB), without this browser's ref
    const missing = [];
    for (const c of convs) { try { await loadData(c.messages); } catch (e) { missing.push(e.message); } }
    const out = convs.map((c) => ({ ...c, messages: c.messages.map((m) => (m.docs ?
      { ...m, docs: m.docs.map(({ ref, stored, ...d }) => d) } : m)) }));
    download('deltafin-conversations.json', exportJson(out));
    if (missing.length) status('exported without: ' + missing.join('; '));
  };
  // documents: the Attach button, a drop anywhere on the page, a paste of files
  $('attach').accept = ACCEPT;
  $('attach').onchange = (e) => { const fs = [...e.target.files]; e.target.value = ''; attach(fs); };
  document.addEventListener('dragover', (e) => { if (e.dataTransfer?.types?.includes('Files')) { e.preventDefault(); document.body.classList.add('dropping'); } });
  document.addEventListener('dragleave', (e) => { if (!e.relatedTarget) document.body.classList.remove('dropping'); });
  document.addEventListener('drop', (e) => {
    document.body.classList.remove('dropping');
    if (!e.dataTransfer?.files?.length) return;
    e.preventDefault();
    attach([...e.dataTransfer.files]);
  });
  $('q').addEventListener('paste', (e) => {
    const fs = [...(e.clipboardData?.files ?? [])];
    if (fs.length) { e.preventDefault(); attach(fs); }
  });
  $('import').onchange = async (e) => {
    const f = e.target.files[0];
    e.target.value = '';
    if (!f) return;
    try {
      const got = importJson(await f.text(), convs);
      for (const c of got) for (const m of c.messages) for (const d of m.docs ?? []) { delete d.ref; delete d.stored; }
      convs.push(...got);
      persist();
      if (got.length) select(got[got.length - 1].id);
      status(`imported ${got.length} conversation${got.length === 1 ? '' : 's'}`);
    } catch (err) { status('import: ' + err.message); }
  };
}

bind();
bindSettings();
applyTheme(localStorage.getItem('deltafin.theme') || 'system');
select(convs.length ? [...convs].sort((a, b) => b.updated - a.updated)[0].id : null);
showModel();
persist(); // conversations saved by an older page kept documents' bytes in localStorage: moved to IndexedDB
// for the tests and the curious: the page's state, read-only in spirit (storing: the saves in flight)
window.deltafin = { get convs() { return convs; }, get running() { return !!run; }, get pending() { return pending; }, live,
  get storing() { return storing; } };
