// build.mjs - the chat page as ONE self-contained HTML file, gzip-compressed.
//
// Usage: node build.mjs OUT.html.gz [--html OUT.html]
// esbuild bundles src/main.js (and the npm libraries it imports) and
// src/style.css, minified; both are inlined into src/index.html, so the page
// makes no request for a script, a style sheet, a font or an image.  The
// result is gzip-compressed (zlib level 9, no file name, mtime 0) and
// compiled into deltafin by the Makefile (web/dist/index.html.gz ->
// $(BUILD)/web_page.c), so `make` needs no npm.
//
// Reproducible: the same package-lock.json and sources give the same HTML
// bytes (esbuild's output has no timestamps or paths: no source maps, paths
// relative to this folder, a fixed target).  The gzip bytes also depend on
// node's zlib, so web/check.sh compares the HTML inside the .gz, not the .gz.
import * as esbuild from 'esbuild';
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import zlib from 'node:zlib';

const here = dirname(fileURLToPath(import.meta.url));
const cwd0 = process.cwd(); // where the command line's paths are relative to
process.chdir(here); // esbuild names files relative to the working directory

export async function buildHtml() {
  const common = { bundle: true, minify: true, write: false, logLevel: 'warning', legalComments: 'inline',
    target: ['chrome100', 'firefox100', 'safari15'], absWorkingDir: here, charset: 'utf8' };
  const js = await esbuild.build({ ...common, entryPoints: ['src/main.js'], format: 'iife' });
  const css = await esbuild.build({ ...common, entryPoints: ['src/style.css'] });
  let script = js.outputFiles[0].text, style = css.outputFiles[0].text;
  // an inline script ends at the first "</script" whatever the JS means; "<\/" is the same
  // string in every JS literal it can sit in (strings, templates, regular expressions)
  script = script.replace(/<\/(script)/gi, '<\\/$1');
  style = style.replace(/<\/(style)/gi, '<\\/$1');
  if (script.includes(here) || style.includes(here)) throw new Error('an absolute path leaked into the bundle');
  const page = readFileSync('src/index.html', 'utf8');
  if (!page.includes('/*STYLE*/') || !page.includes('/*SCRIPT*/')) throw new Error('src/index.html lacks /*STYLE*/ or /*SCRIPT*/');
  // split/join, not replace: "$&" in the bundle must stay as it is
  return page.split('/*STYLE*/').join(style.trim()).split('/*SCRIPT*/').join(script.trim());
}

export function gzip(html) {
  // gzip header: no name, mtime 0, OS byte from zlib (Unix); level 9, default window and strategy
  return zlib.gzipSync(Buffer.from(html, 'utf8'), { level: 9, memLevel: 8, windowBits: 15, strategy: zlib.constants.Z_DEFAULT_STRATEGY });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const out = args[0] && resolve(cwd0, args[0]);
  if (!out) { console.error('usage: node build.mjs OUT.html.gz [--html OUT.html]'); process.exit(2); }
  const html = await buildHtml();
  const gz = gzip(html);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, gz);
  const h = args.indexOf('--html');
  if (h >= 0) writeFileSync(resolve(cwd0, args[h + 1]), html);
  console.log(`web: ${out}: ${html.length} bytes of HTML, ${gz.length} gzip-compressed`);
}
