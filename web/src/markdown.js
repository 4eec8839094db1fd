// markdown.js - a reply's Markdown as safe HTML: markdown-it (raw HTML off),
// highlight.js (core plus the languages registered below: the bundle carries
// only these), then DOMPurify over the result as a second fence.  Code blocks
// get a copy button (one listener on the log handles every button: see main.js).
import MarkdownIt from 'markdown-it';
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import c from 'highlight.js/lib/languages/c';
import cpp from 'highlight.js/lib/languages/cpp';
import css from 'highlight.js/lib/languages/css';
import diff from 'highlight.js/lib/languages/diff';
import go from 'highlight.js/lib/languages/go';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import makefile from 'highlight.js/lib/languages/makefile';
import python from 'highlight.js/lib/languages/python';
import rust from 'highlight.js/lib/languages/rust';
import sql from 'highlight.js/lib/languages/sql';
import typescript from 'highlight.js/lib/languages/typescript';
import xml from 'highlight.js/lib/languages/xml';
import yaml from 'highlight.js/lib/languages/yaml';
import DOMPurify from 'dompurify';

const langs = { bash, c, cpp, css, diff, go, javascript, json, makefile, python, rust, sql, typescript, xml, yaml };
for (const [name, def] of Object.entries(langs)) hljs.registerLanguage(name, def);

const esc = (s) => s.replace(/[&<>"]/g, (ch) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[ch]);

const md = new MarkdownIt({ html: false, linkify: true, breaks: false, typographer: false });

// a fenced block: highlighted when its language is known (no guessing: auto-detection
// is slow and often wrong on short code), plain otherwise; a header with the language
// and a copy button
md.renderer.rules.fence = (tokens, idx) => {
  const t = tokens[idx];
  const lang = (t.info || '').trim().split(/\s+/)[0].toLowerCase();
  const known = lang && hljs.getLanguage(lang);
  const body = known ? hljs.highlight(t.content, { language: lang, ignoreIllegals: true }).value : esc(t.content);
  return `<div class="code"><div class="code-head"><span>${esc(lang || 'text')}</span>` +
    `<button type="button" class="copy" data-copy>Copy</button></div>` +
    `<pre><code class="hljs${known ? ' language-' + esc(lang) : ''}">${body}</code></pre></div>`;
};
md.renderer.rules.code_block = md.renderer.rules.fence;

// links open elsewhere and never carry the page's origin along
const linkOpen = md.renderer.rules.link_open ?? ((tokens, idx, opts, env, self) => self.renderToken(tokens, idx, opts));
md.renderer.rules.link_open = (tokens, idx, opts, env, self) => {
  tokens[idx].attrSet('target', '_blank');
  tokens[idx].attrSet('rel', 'noopener noreferrer');
  return linkOpen(tokens, idx, opts, env, self);
};

// DOMPurify keeps what markdown-it and highlight.js write (classes, the copy button's
// data attribute, target/rel on links) and drops anything active
const PURIFY = { ADD_ATTR: ['target', 'data-copy'], FORBID_TAGS: ['style', 'form', 'input', 'img'] };

export function renderMarkdown(text) {
  return DOMPurify.sanitize(md.render(text), PURIFY);
}

// a reply still streaming: an unclosed ``` fence is closed for the rendering only,
// so a half-written code block shows as code, not as a paragraph of backticks
export function renderStreaming(text) {
  const fences = text.match(/^ {0,3}(```|~~~)/gm);
  return renderMarkdown(fences && fences.length % 2 ? text + '\n' + fences[fences.length - 1].trim() : text);
}
