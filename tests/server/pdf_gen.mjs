// pdf_gen.mjs - small, valid PDFs for the document tests (no PDF library needed).
//
// makePdf(pages): one page per string (lines split on \n, Helvetica 12 pt),
// with a correct cross-reference table, so poppler reads it without repair.
// makePdf([], { blank: n }): n pages with empty content streams (a "scan"
// without a text layer, as far as text extraction can tell).  { pad: n } adds an
// object of n incompressible bytes that no page uses (a large file with little text).

function esc(s) {
  return s.replace(/\\/g, '\\\\').replace(/\(/g, '\\(').replace(/\)/g, '\\)');
}

export function makePdf(pages, { blank = 0, pad = 0 } = {}) {
  const list = blank ? Array(blank).fill(null) : pages;
  const objs = [];
  objs.push('<< /Type /Catalog /Pages 2 0 R >>');
  const kids = list.map((_, i) => `${3 + 2 * i} 0 R`).join(' ');
  objs.push(`<< /Type /Pages /Kids [${kids}] /Count ${list.length} >>`);
  const font = 3 + 2 * list.length;
  list.forEach((text, i) => {
    objs.push(`<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 ${font} 0 R >> >> ` +
      `/Contents ${4 + 2 * i} 0 R >>`);
    const s = text === null ? '' : 'BT /F1 12 Tf 72 720 Td 14 TL ' +
      text.split('\n').map((l) => `(${esc(l)}) '`).join(' ') + ' ET';
    objs.push(`<< /Length ${Buffer.byteLength(s, 'latin1')} >>\nstream\n${s}\nendstream`);
  });
  objs.push('<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>');
  if (pad) {
    // an object nothing refers to: pad bytes that do not compress (a fixed xorshift sequence), no text
    let x = 0x9e3779b9, b = '';
    for (let i = 0; i < pad; i++) { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; b += String.fromCharCode(x & 0xff); }
    objs.push(`<< /Length ${pad} >>\nstream\n${b}\nendstream`);
  }
  let out = '%PDF-1.4\n';
  const offs = [];
  objs.forEach((o, i) => {
    offs.push(Buffer.byteLength(out, 'latin1'));
    out += `${i + 1} 0 obj\n${o}\nendobj\n`;
  });
  const x = Buffer.byteLength(out, 'latin1');
  out += `xref\n0 ${objs.length + 1}\n0000000000 65535 f \n`;
  for (const o of offs) out += `${String(o).padStart(10, '0')} 00000 n \n`;
  out += `trailer\n<< /Size ${objs.length + 1} /Root 1 0 R >>\nstartxref\n${x}\n%%EOF\n`;
  return Buffer.from(out, 'latin1');
}
