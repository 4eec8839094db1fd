// docstore.js - the bytes of attached documents, kept in the browser's
// IndexedDB (database "deltafin", store "docs", key: the document's ref).
// localStorage holds the conversations as JSON and has a small quota (a few
// MB per origin in every browser): one PDF's base64 there would make every
// later save fail.  So a message keeps { name, type, size, tokens, ref } in
// localStorage and its bytes here, where the quota is a share of the disk;
// in memory the page also keeps `data` (base64) for the documents it has
// read or loaded.  Nothing here touches the DOM.

const DB = 'deltafin', STORE = 'docs';
let opened = null;

function db() {
  if (!opened) {
    opened = new Promise((resolve, reject) => {
      if (typeof indexedDB === 'undefined') { reject(new Error('this browser has no IndexedDB')); return; }
      const r = indexedDB.open(DB, 1);
      r.onupgradeneeded = () => r.result.createObjectStore(STORE);
      r.onsuccess = () => resolve(r.result);
      r.onerror = () => reject(r.error ?? new Error('IndexedDB did not open'));
    });
    opened.catch(() => { opened = null; }); // try again next time
  }
  return opened;
}

// one request in its own transaction: resolves with its result once the transaction commits
async function run(mode, make) {
  const d = await db();
  return new Promise((resolve, reject) => {
    const t = d.transaction(STORE, mode);
    const rq = make(t.objectStore(STORE));
    t.oncomplete = () => resolve(rq.result);
    t.onerror = () => reject(t.error ?? rq.error);
    t.onabort = () => reject(t.error ?? new Error('the IndexedDB transaction was aborted'));
  });
}

export const putDoc = (ref, data) => run('readwrite', (s) => s.put(data, ref));
export const getDoc = (ref) => run('readonly', (s) => s.get(ref));
export const docRefs = () => run('readonly', (s) => s.getAllKeys());
export const deleteDoc = (ref) => run('readwrite', (s) => s.delete(ref));

// the documents of a message list as localStorage keeps them: no bytes
export function withoutData(list) {
  return list.map((c) => ({
    ...c,
    messages: c.messages.map((m) => (m.docs ? { ...m, docs: m.docs.map(({ data, ...rest }) => rest) } : m)),
  }));
}

// every document of msgs has its bytes in memory (read back from IndexedDB where needed);
// throws naming a document whose bytes this browser no longer has
export async function loadData(msgs) {
  for (const m of msgs) {
    for (const d of m.docs ?? []) {
      if (d.data) continue;
      let data;
      try { data = d.ref ? await getDoc(d.ref) : undefined; } catch (e) { throw new Error(`${d.name}: ${e.message}`); }
      if (typeof data !== 'string') throw new Error(`${d.name} is no longer stored in this browser: attach it again`);
      d.data = data;
    }
  }
}

// documents whose bytes are in memory but not yet stored get a ref and are stored; resolves
// with the names that could not be stored (IndexedDB missing or full): they stay in memory only
export async function storeData(msgs, newRef) {
  const failed = [];
  for (const m of msgs) {
    for (const d of m.docs ?? []) {
      if (!d.data || d.stored) continue;
      if (!d.ref) d.ref = newRef();
      try { await putDoc(d.ref, d.data); d.stored = true; } catch (e) { failed.push(`${d.name} (${e.message})`); }
    }
  }
  return failed;
}

// the stored documents no conversation names any more are deleted
export async function pruneDocs(list) {
  const keep = new Set();
  for (const c of list) for (const m of c.messages) for (const d of m.docs ?? []) if (d.ref) keep.add(d.ref);
  for (const ref of await docRefs()) if (!keep.has(ref)) await deleteDoc(ref);
}
