// store.js - conversations and settings kept in the browser (localStorage):
// one key for the list of conversations, one for the settings, one for the
// theme.  A conversation: { id, title, created, updated, messages: [{ role,
// content, reasoning?, stats? }] }.  Export writes { deltafin: 1,
// conversations: [...] }; import takes that (or one conversation, or an
// array of them), checks each message and gives a conversation whose id is
// already here a new one.
const KEY = 'deltafin.conversations', SKEY = 'deltafin.settings';

export const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

export function loadConversations() {
  try {
    const a = JSON.parse(localStorage.getItem(KEY) || '[]');
    return Array.isArray(a) ? a.filter(validConversation) : [];
  } catch { return []; }
}

export function saveConversations(list) {
  localStorage.setItem(KEY, JSON.stringify(list));
}

export function loadSettings(defaults) {
  try { return { ...defaults, ...JSON.parse(localStorage.getItem(SKEY) || '{}') }; } catch { return { ...defaults }; }
}

export function saveSettings(s) { localStorage.setItem(SKEY, JSON.stringify(s)); }

function validMessage(m) {
  return m && typeof m === 'object' && ['user', 'assistant', 'system'].includes(m.role) && typeof m.content === 'string' &&
    (m.reasoning === undefined || typeof m.reasoning === 'string');
}

function validConversation(c) {
  return c && typeof c === 'object' && typeof c.id === 'string' && Array.isArray(c.messages) && c.messages.every(validMessage);
}

export function exportJson(list) {
  return JSON.stringify({ deltafin: 1, conversations: list }, null, 2);
}

// the imported conversations (already-present ids renamed); throws on a bad file
export function importJson(text, have) {
  const j = JSON.parse(text);
  const arr = Array.isArray(j) ? j : Array.isArray(j.conversations) ? j.conversations : [j];
  const ids = new Set(have.map((c) => c.id)), out = [];
  for (const c0 of arr) {
    const c = { ...c0 };
    if (typeof c.id !== 'string') c.id = newId();
    if (!validConversation(c)) throw new Error('not a conversation: each needs messages [{role, content}]');
    if (ids.has(c.id)) c.id = newId();
    ids.add(c.id);
    c.title = typeof c.title === 'string' && c.title ? c.title : titleOf(c.messages);
    c.created = +c.created || Date.now();
    c.updated = +c.updated || c.created;
    out.push(c);
  }
  return out;
}

export function titleOf(messages) {
  const u = messages.find((m) => m.role === 'user');
  const t = u ? u.content.replace(/\s+/g, ' ').trim() : '';
  return t ? (t.length > 48 ? t.slice(0, 47) + '…' : t) : 'New conversation';
}
