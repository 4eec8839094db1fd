// svg_test.mjs - the research wing's plots (deltafin trace stats|cache --svg)
// rendered by headless Chromium (run by run_server_tests.sh, which writes
// them first).  Each file must parse as SVG (no parser error), render at its
// declared size, and hold what the data says: a heat-map cell per layer and
// expert, a reuse line per layer plus the pooled one, a hit-rate line per
// policy, a cell per kept attention weight.  Environment: SVG_DIR (the
// plots), SVG_LAYERS, SVG_EXPERTS (the trace's MoE layers and experts),
// SVG_ATTN and SVG_ATTN_CELLS (an attention map in SVG_DIR and its cells),
// SVG_SHOTS (optional: screenshots there).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

const DIR = process.env.SVG_DIR;
const LAYERS = Number(process.env.SVG_LAYERS);
const EXPERTS = Number(process.env.SVG_EXPERTS);
const BROWSER = process.env.CHROMIUM ?? '/usr/bin/chromium';

test('trace plots render in Chromium', async () => {
  assert.ok(DIR && LAYERS > 0 && EXPERTS > 0, 'SVG_DIR, SVG_LAYERS and SVG_EXPERTS are needed');
  assert.ok(existsSync(BROWSER), `${BROWSER} not found: install Debian's chromium package`);
  const browser = await chromium.launch({ executablePath: BROWSER, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'] });
  try {
    const page = await browser.newPage();
    const want = {
      'popularity.svg': { sel: 'rect.cell', n: LAYERS * EXPERTS },
      'reuse.svg': { sel: 'polyline.layer', n: LAYERS, also: 'polyline.pooled' },
      // every policy: the runner's trace has look-ahead records and a --prior, so all eleven
      'cache.svg': { sel: 'polyline', n: 11 },
    };
    // an attention map (trace attention), when the runner made one: a cell per kept weight
    if (process.env.SVG_ATTN) want[process.env.SVG_ATTN] = { sel: 'rect.cell', n: Number(process.env.SVG_ATTN_CELLS) };
    for (const [name, w] of Object.entries(want)) {
      const file = join(DIR, name);
      assert.ok(existsSync(file), `${file} was not written`);
      await page.goto(pathToFileURL(file).href);
      const info = await page.evaluate((sel) => {
        const root = document.documentElement;
        const box = root.getBoundingClientRect();
        return { tag: root.tagName, parseError: document.getElementsByTagName('parsererror').length,
          n: document.querySelectorAll(sel).length, w: box.width, h: box.height,
          declared: [Number(root.getAttribute('width')), Number(root.getAttribute('height'))] };
      }, w.sel);
      assert.equal(info.tag, 'svg', `${name}: the document is not an SVG`);
      assert.equal(info.parseError, 0, `${name}: Chromium reports a parse error`);
      assert.equal(info.n, w.n, `${name}: ${info.n} of ${w.sel}, expected ${w.n}`);
      assert.deepEqual([Math.round(info.w), Math.round(info.h)], info.declared, `${name}: rendered size`);
      if (w.also) assert.equal(await page.locator(w.also).count(), 1, `${name}: no ${w.also}`);
      // every line has points inside the picture
      const bad = await page.evaluate(() => [...document.querySelectorAll('polyline')].filter((p) => {
        const b = p.getBBox();
        const W = Number(document.documentElement.getAttribute('width'));
        const H = Number(document.documentElement.getAttribute('height'));
        return !(b.x >= 0 && b.y >= 0 && b.x + b.width <= W && b.y + b.height <= H);
      }).length);
      assert.equal(bad, 0, `${name}: a line leaves the picture`);
      if (process.env.SVG_SHOTS) await page.screenshot({ path: join(process.env.SVG_SHOTS, name + '.png') });
    }
  } finally {
    await browser.close();
  }
});
