// compare_logits.mjs - llama.cpp's logits against deltafin's, for the oracle
// test (run_llama_oracle.sh).
//
// usage: node compare_logits.mjs LLAMA.bin DELTAFIN.bin VOCAB N_PROMPT LLAMA_IDS DF_IDS
//   LLAMA.bin    f32 [N_PROMPT][VOCAB] from llama_peer --dump-logits
//   DELTAFIN.bin f32 [N_PROMPT + generated][VOCAB] from deltafin run --dump-logits
//   *_IDS        the greedy continuations, ids separated by spaces or commas
//
// Checks, and exits 1 on failure:
//   1. every prompt position: max |llama - deltafin| <= ABS + REL * max|logit|
//      of that row (ABS = 6e-4, REL = 0; see run_llama_oracle.sh for why);
//   2. the top-1 of every prompt position agrees wherever deltafin's top-1
//      margin is safe (> 2 * the tolerance);
//   3. the greedy continuations are identical up to the first step whose
//      margin is not safe (the rest is then not comparable: a near-tie may
//      flip legitimately); at least one step must be compared.
import { readFileSync } from "node:fs";

const [llPath, dfPath, vocabArg, nPromptArg, llIdsArg, dfIdsArg] = process.argv.slice(2);
if (!dfIdsArg) {
    console.error("usage: compare_logits.mjs LLAMA.bin DELTAFIN.bin VOCAB N_PROMPT LLAMA_IDS DF_IDS");
    process.exit(2);
}
const V = Number(vocabArg), P = Number(nPromptArg);
const ABS = 6e-4, REL = 0;
const f32 = (p) => {
    const b = readFileSync(p);
    return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
};
const ids = (s) => s.trim().split(/[\s,]+/).filter((x) => x.length).map(Number);
const ll = f32(llPath), df = f32(dfPath);
if (ll.length !== P * V) throw new Error(`${llPath}: ${ll.length} floats, expected ${P}x${V}`);
if (df.length < P * V || df.length % V) throw new Error(`${dfPath}: ${df.length} floats, not >= ${P} rows of ${V}`);
const llIds = ids(readFileSync(llIdsArg, "utf8")), dfIds = ids(readFileSync(dfIdsArg, "utf8"));

function top2(a, off) {
    let b = -1, s = -1;
    for (let i = 0; i < V; i++) {
        const v = a[off + i];
        if (b < 0 || v > a[off + b]) { s = b; b = i; }
        else if (s < 0 || v > a[off + s]) s = i;
    }
    return { top: b, margin: a[off + b] - a[off + s] };
}

let fail = 0, worst = 0, worstRel = 0, maxAbs = 0;
for (let t = 0; t < P; t++) {
    let rowMax = 0, d = 0;
    for (let i = 0; i < V; i++) {
        rowMax = Math.max(rowMax, Math.abs(df[t * V + i]));
        d = Math.max(d, Math.abs(ll[t * V + i] - df[t * V + i]));
    }
    const tol = ABS + REL * rowMax;
    worst = Math.max(worst, d);
    worstRel = Math.max(worstRel, d / tol);
    maxAbs = Math.max(maxAbs, rowMax);
    if (d > tol) { console.error(`position ${t}: max |diff| ${d.toExponential(3)} > tolerance ${tol.toExponential(3)}`); fail = 1; }
    const a = top2(ll, t * V), b = top2(df, t * V);
    if (b.margin > 2 * tol && a.top !== b.top) {
        console.error(`position ${t}: top-1 llama ${a.top} vs deltafin ${b.top} (margin ${b.margin.toFixed(4)})`);
        fail = 1;
    }
}
let compared = 0;
for (let i = 0; i < Math.min(llIds.length, dfIds.length); i++) {
    const row = P - 1 + i;
    if ((row + 1) * V > df.length) break;
    let rowMax = 0;
    for (let j = 0; j < V; j++) rowMax = Math.max(rowMax, Math.abs(df[row * V + j]));
    const m = top2(df, row * V);
    if (m.top !== dfIds[i]) { console.error(`step ${i}: deltafin's logits say ${m.top}, its ids ${dfIds[i]}`); fail = 1; break; }
    if (m.margin <= 2 * (ABS + REL * rowMax)) break;
    if (llIds[i] !== dfIds[i]) { console.error(`greedy step ${i}: llama ${llIds[i]} vs deltafin ${dfIds[i]} (margin ${m.margin.toFixed(4)})`); fail = 1; break; }
    compared++;
}
if (compared === 0) { console.error("no greedy step had a safe margin to compare"); fail = 1; }
console.log(`positions ${P}: max |diff| ${worst.toExponential(2)} (max |logit| ${maxAbs.toFixed(2)}, ` +
            `${(100 * worstRel).toFixed(1)}% of tolerance); greedy ids identical for ${compared} of ${dfIds.length} steps`);
process.exit(fail);
