// flip_tensor.mjs DIR TENSOR-SUBSTRING OFFSET [BYTE]: in the first safetensors
// shard of DIR holding a tensor whose name contains TENSOR-SUBSTRING, set the
// byte at OFFSET inside that tensor to BYTE (hex), or flip it (xor 0xff) when
// BYTE is not given.  Tests use it to make a model that differs in one byte,
// or holds a NaN (BF16 0xffff), without a Python of their own.
import { openSync, readSync, writeSync, closeSync, readdirSync } from 'node:fs';

const [dir, sub, offArg, byteArg] = process.argv.slice(2);
if (!dir || !sub || offArg === undefined) {
  console.error('usage: flip_tensor.mjs DIR TENSOR-SUBSTRING OFFSET [BYTE-HEX]');
  process.exit(2);
}
for (const f of readdirSync(dir).filter((n) => n.endsWith('.safetensors')).sort()) {
  const fd = openSync(`${dir}/${f}`, 'r+');
  const len = Buffer.alloc(8);
  readSync(fd, len, 0, 8, 0);
  const n = Number(len.readBigUInt64LE(0));
  const head = Buffer.alloc(n);
  readSync(fd, head, 0, n, 8);
  const h = JSON.parse(head.toString('utf8'));
  const name = Object.keys(h).sort().find((k) => k !== '__metadata__' && k.includes(sub));
  if (name) {
    const at = 8 + n + h[name].data_offsets[0] + Number(offArg);
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, at);
    b[0] = byteArg !== undefined ? parseInt(byteArg, 16) : b[0] ^ 0xff;
    writeSync(fd, b, 0, 1, at);
    closeSync(fd);
    console.log(`${f}: ${name} byte ${offArg} set to ${b[0].toString(16)}`);
    process.exit(0);
  }
  closeSync(fd);
}
console.error(`no tensor containing "${sub}" in ${dir}`);
process.exit(1);
