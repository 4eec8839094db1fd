// model.js - the Model panel: what the server runs (GET /v1/plan: the model's
// numbers, the memory plan as `deltafin plan` prints it, the model card from
// the model folder's README.md) and the router plot of the conversation shown
// (GET /v1/routes?id=: for its last reply, how many of the rows the server
// evaluated for it went to each expert, one row of cells per MoE layer).
// The plot is SVG built here; each cell carries its layer, expert and count
// (data-*) and a <title> with them, so a test can compare it with /v1/routes.
import { headers } from './api.js';
import { renderMarkdown } from './markdown.js';

const SVG = 'http://www.w3.org/2000/svg';
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};
const size = (b) => b >= 1048576 ? (b / 1048576).toFixed(2) + ' MiB' : (b / 1024).toFixed(1) + ' KiB';

async function getJson(url, key) {
  const r = await fetch(url, { headers: headers(key) });
  const t = await r.text();
  let j = null;
  try { j = JSON.parse(t); } catch { /* not JSON */ }
  if (!r.ok) throw new Error(j?.error?.message ?? `HTTP ${r.status}`);
  return j;
}

export async function plan(key) { return getJson('/v1/plan', key); }
export async function routes(id, key) { return getJson('/v1/routes?id=' + encodeURIComponent(id), key); }

// the panel's first part: the model's numbers, the plan's text, the card
export function renderPlan(box, p) {
  box.replaceChildren();
  const i = p.info;
  const dl = el('dl', 'facts');
  const facts = [
    ['model', `${p.model} (${p.path})`],
    ['layers', `${i.layers} (${i.kda_layers} KDA, ${i.mla_layers} MLA), hidden ${i.hidden}, vocabulary ${i.vocab}`],
    ['experts', `${i.experts} per MoE layer, ${i.experts_per_token} per token, ${size(i.expert_bytes)} each (${i.expert_type})`],
    ['trunk', `${i.trunk}, ${p.plan.trunk}`],
    ['context', `${i.context} tokens`],
    ['kernels', `${i.kernels}, ${i.threads} thread${i.threads === 1 ? '' : 's'}`],
  ];
  for (const [k, v] of facts) dl.append(el('dt', '', k), el('dd', '', v));
  box.appendChild(dl);
  const pre = el('pre', 'plan-text', p.plan_text);
  pre.id = 'plan-text';
  box.append(el('h3', '', 'Memory plan'), pre);
  box.appendChild(el('h3', '', 'Model card'));
  const card = el('div', 'card');
  card.id = 'model-card';
  if (p.card) card.innerHTML = renderMarkdown(p.card); else card.textContent = 'This model folder has no README.md.';
  box.appendChild(card);
}

// the router plot: a cell per MoE layer and expert, shaded by its share of the layer's routes
export function renderRoutes(box, r) {
  box.replaceChildren();
  const cell = 12, left = 34, top = 18;
  const w = left + r.experts * cell + 4, h = top + r.counts.length * cell + 4;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('width', String(w));
  svg.setAttribute('class', 'routes');
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', `routes of ${r.rows} rows: ${r.counts.length} MoE layers x ${r.experts} experts`);
  const text = (x, y, s, anchor) => {
    const t = document.createElementNS(SVG, 'text');
    t.setAttribute('x', String(x)); t.setAttribute('y', String(y));
    if (anchor) t.setAttribute('text-anchor', anchor);
    t.textContent = s;
    svg.appendChild(t);
  };
  text(left, 12, `expert 0 … ${r.experts - 1}`);
  r.counts.forEach((row, li) => {
    const layer = r.moe_layers[li], max = Math.max(1, ...row), y = top + li * cell;
    text(left - 4, y + cell - 2, 'L' + layer, 'end');
    row.forEach((n, x) => {
      const c = document.createElementNS(SVG, 'rect');
      c.setAttribute('x', String(left + x * cell)); c.setAttribute('y', String(y));
      c.setAttribute('width', String(cell - 1)); c.setAttribute('height', String(cell - 1));
      c.setAttribute('class', n ? 'hit' : 'zero');
      if (n) c.setAttribute('fill-opacity', (0.12 + 0.88 * n / max).toFixed(3));
      c.dataset.layer = String(layer); c.dataset.expert = String(x); c.dataset.count = String(n);
      const t = document.createElementNS(SVG, 'title');
      t.textContent = `layer ${layer}, expert ${x}: ${n} of ${r.rows} rows (${r.rows ? (100 * n / r.rows).toFixed(1) : 0} %)`;
      c.appendChild(t);
      svg.appendChild(c);
    });
  });
  const used = r.counts.map((row) => row.filter((n) => n > 0).length);
  box.append(el('p', 'muted', `The last reply of this conversation: ${r.rows} rows evaluated for it (the prompt less the prefix ` +
    `the server reused, the reply, draft verify rows included), ${r.top_k} experts a row at each of ${r.counts.length} MoE ` +
    `layers; experts used per layer ${Math.min(...used)}-${Math.max(...used)} of ${r.experts}. Darker: more of the layer's routes.`), svg);
}
