// live.js - the live view: GET /metrics polled once a second while a reply
// runs (and once when it ends, or when the view opens), its counters shown as
// they are.  Each cell carries the metric it shows (data-metric) and the raw
// value read (data-value), and its text is that value formatted here, so a
// test can check the numbers against /metrics.  The figures of the reply
// running (expert MiB per position evaluated, tokens per decode pass) are
// differences of two readings.
import { metrics } from './api.js';

const pct = (v) => (100 * v).toFixed(1) + ' %';
const mib = (v) => (v / 1048576).toFixed(1) + ' MiB';
const int = (v) => String(Math.round(v));

// [metric, label, format]; the order on the page
export const CELLS = [
  ['deltafin_running_prompt_done', 'prompt ids done (running)', int],
  ['deltafin_running_prompt_total', 'prompt ids (running)', int],
  ['deltafin_running_tokens_per_second', 'tok/s (running)', (v) => v.toFixed(2)],
  ['deltafin_decode_tokens_per_second', 'decode tok/s (last reply)', (v) => v.toFixed(2)],
  ['deltafin_expert_cache_hit_ratio', 'expert cache hits', pct],
  ['deltafin_prompt_cache_hit_ratio', 'prompt tokens reused', pct],
  ['deltafin_expert_bytes_read_total', 'experts read', mib],
  ['deltafin_expert_reads_total', 'expert reads', int],
  ['deltafin_io_wait_seconds_total', 'I/O wait', (v) => v.toFixed(3) + ' s'],
  ['deltafin_positions_evaluated_total', 'positions evaluated', int],
  ['deltafin_generated_tokens_total', 'tokens generated', int],
  ['deltafin_prompt_tokens_total', 'prompt tokens', int],
  ['deltafin_decode_passes_total', 'decode passes', int],
  ['deltafin_verify_passes_total', 'draft verify passes', int],
  ['deltafin_draft_accepted_total', 'drafts accepted', int],
  ['deltafin_draft_proposed_total', 'drafts proposed', int],
  ['deltafin_queue_length', 'queued', int],
  ['deltafin_requests_total', 'requests', int],
];

export function formatCell(name, v) {
  const c = CELLS.find((x) => x[0] === name);
  return c ? c[2](v) : String(v);
}

export class Live {
  constructor(grid, when, getKey) {
    this.grid = grid; this.when = when; this.getKey = getKey;
    this.timer = null; this.base = null; this.last = null; this.reads = 0; this.asked = 0; this.shown = 0;
    for (const [name, label] of CELLS) {
      const d = document.createElement('div');
      d.className = 'cell'; d.dataset.metric = name;
      d.innerHTML = '<span class="v">–</span><span class="k"></span>';
      d.querySelector('.k').textContent = label;
      grid.appendChild(d);
    }
    const extra = document.createElement('div');
    extra.className = 'cell derived'; extra.id = 'live-derived';
    extra.innerHTML = '<span class="v">–</span><span class="k">acceptance · MiB/position · tokens/pass (this reply)</span>';
    grid.appendChild(extra);
  }

  async poll() {
    // readings answered out of order: only a later request's answer replaces the cells
    const seq = ++this.asked;
    let m;
    try { m = await metrics(this.getKey()); } catch (e) { this.when.textContent = 'metrics: ' + e.message; return null; }
    if (seq < this.shown) return m;
    this.shown = seq; this.last = m; this.reads++;
    for (const cell of this.grid.querySelectorAll('[data-metric]')) {
      const v = m[cell.dataset.metric];
      if (v === undefined) continue;
      cell.dataset.value = String(v);
      cell.querySelector('.v').textContent = formatCell(cell.dataset.metric, v);
    }
    const acc = m.deltafin_draft_proposed_total ? pct(m.deltafin_draft_accepted_total / m.deltafin_draft_proposed_total) : 'no drafts';
    let per = '–', tpp = '–';
    if (this.base) {
      const dt = m.deltafin_positions_evaluated_total - this.base.deltafin_positions_evaluated_total;
      const db = m.deltafin_expert_bytes_read_total - this.base.deltafin_expert_bytes_read_total;
      if (dt > 0) per = (db / dt / 1048576).toFixed(2);
      // tokens per decode pass: above 1 when verified drafts are accepted (the running job's
      // count while it runs, the finished total's difference after); the first token comes
      // from the prompt's last pass, so it is not one a decode pass made
      const dp = m.deltafin_decode_passes_total - this.base.deltafin_decode_passes_total;
      const g = m.deltafin_running_generated_tokens || (m.deltafin_generated_tokens_total - this.base.deltafin_generated_tokens_total);
      if (dp > 0 && g > 1) tpp = ((g - 1) / dp).toFixed(2);
    }
    this.grid.querySelector('#live-derived .v').textContent = acc + ' · ' + per + ' · ' + tpp;
    this.when.textContent = `read ${this.reads} time${this.reads === 1 ? '' : 's'}, last ${new Date().toLocaleTimeString()}`;
    return m;
  }

  // a reply starts: a first reading as the base of its differences, then one a second
  async start() {
    this.stop();
    this.base = null;
    this.timer = setInterval(() => this.poll(), 1000);
    this.base = await this.poll();
  }

  async end() {
    this.stop();
    return this.poll();
  }

  stop() { if (this.timer) clearInterval(this.timer); this.timer = null; }
}
