// compare_gguf_tensors.mjs A.gguf B.gguf TYPE_ID|all - the data of every
// tensor that both files hold in ggml type TYPE_ID (8 = Q8_0), byte for
// byte; `all`: both files hold the same tensors, each of the same type and
// shape with the same bytes.
// Prints "N tensors identical (M bytes)" and exits 0, or names the first
// tensor that differs and exits 1; 2 when none is held in that type by both.
// A GGUF v3 header reader written from the format's definition: magic,
// version, counts, key/value pairs (skipped by type), tensor infos, the data
// section at the alignment (general.alignment, default 32).
import { readFileSync } from 'node:fs';

function parse(path) {
  const b = readFileSync(path);
  let o = 0;
  const u32 = () => { const v = b.readUInt32LE(o); o += 4; return v; };
  const u64 = () => { const v = Number(b.readBigUInt64LE(o)); o += 8; return v; };
  const str = () => { const n = u64(); const s = b.toString('utf8', o, o + n); o += n; return s; };
  const sizes = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
  let align = 32;
  const skip = (t) => {
    if (t === 8) { str(); return; }
    if (t === 9) { const et = u32(); const n = u64(); for (let i = 0; i < n; i++) skip(et); return; }
    if (!(t in sizes)) throw new Error(`${path}: unknown value type ${t}`);
    o += sizes[t];
  };
  if (b.toString('latin1', 0, 4) !== 'GGUF') throw new Error(`${path}: not a GGUF file`);
  o = 4;
  const version = u32();
  if (version !== 3) throw new Error(`${path}: GGUF version ${version}`);
  const nt = u64(), nkv = u64();
  for (let i = 0; i < nkv; i++) {
    const key = str(), t = u32();
    if (key === 'general.alignment' && t === 4) { align = b.readUInt32LE(o); o += 4; } else skip(t);
  }
  const tensors = new Map();
  for (let i = 0; i < nt; i++) {
    const name = str(), nd = u32();
    const ne = []; for (let d = 0; d < nd; d++) ne.push(u64());
    const type = u32(), off = u64();
    tensors.set(name, { ne, type, off });
  }
  const data = Math.ceil(o / align) * align;
  return { b, tensors, data };
}

const [a, bfile, typeArg] = process.argv.slice(2);
const all = typeArg === 'all', type = Number(typeArg);
// bytes per block and values per block of the types these files hold
const blk = { 0: [4, 1], 1: [2, 1], 30: [2, 1], 8: [34, 32], 39: [17, 32] };
const A = parse(a), B = parse(bfile);
// a tensor's bytes: from its offset to the next tensor's (or the file's end), as far as the shorter needs
const bytesOf = (F, t) => {
  const offs = [...F.tensors.values()].map((x) => x.off).filter((x) => x > t.off);
  const end = offs.length ? Math.min(...offs) : F.b.length - F.data;
  return F.b.subarray(F.data + t.off, F.data + end);
};
let n = 0, bytes = 0;
if (all && A.tensors.size !== B.tensors.size) { console.log(`${A.tensors.size} tensors vs ${B.tensors.size}`); process.exit(1); }
for (const [name, ta] of A.tensors) {
  const tb = B.tensors.get(name);
  if (all && (!tb || ta.type !== tb.type)) { console.log(`${name}: ${tb ? `type ${ta.type} vs ${tb.type}` : 'missing from B'}`); process.exit(1); }
  if (!tb || (!all && (ta.type !== type || tb.type !== type))) continue;
  if (ta.ne.join() !== tb.ne.join()) { console.log(`${name}: shapes differ`); process.exit(1); }
  if (!(ta.type in blk)) { console.log(`${name}: type ${ta.type} not sized here`); process.exit(1); }
  const [bb, bv] = blk[ta.type];
  const need = ta.ne.reduce((x, y) => x * y, 1) / bv * bb;
  const xa = bytesOf(A, ta).subarray(0, need), xb = bytesOf(B, tb).subarray(0, need);
  if (xa.length !== need || !xa.equals(xb)) {
    let k = 0; while (k < need && xa[k] === xb[k]) k++;
    console.log(`${name}: data differs at byte ${k} (block ${Math.floor(k / bb)})`);
    process.exit(1);
  }
  n++; bytes += need;
}
if (!n) { console.log(`no tensor of type ${typeArg} in both files`); process.exit(2); }
console.log(`${n} tensors identical (${bytes} bytes)`);
