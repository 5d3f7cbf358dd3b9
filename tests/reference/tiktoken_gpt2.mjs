// Reference for the GPT2BPETokenizer parity test and throughput bench: OpenAI's tiktoken
// `gpt2` encoding (npm package, Rust compiled to WASM). Special-token strings are encoded as
// plain text (encode_ordinary), as Megatron's GPT-2 tokenizer does.
//   node tiktoken_gpt2.mjs --out IDS.bin FILE.jsonl...
//       writes, for every {"text": ...} line of every file in order: uint32 count, then count
//       uint32 ids (little-endian)
//   node tiktoken_gpt2.mjs --bench FILE.jsonl...
//       encodes all texts once (after reading and parsing them) on one thread and prints one
//       JSON line {"bytes","documents","tokens","seconds","mb_per_s","tokens_per_s"}
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const here = path.dirname(new URL(import.meta.url).pathname);
let tiktoken;
try {
  tiktoken = createRequire(path.join(here, "package.json"))("tiktoken");
} catch (e) {
  console.error("error: npm package tiktoken is missing (run scripts/node-deps.sh)");
  process.exit(2);
}

const args = process.argv.slice(2);
let out = null, bench = false;
const files = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--out") out = args[++i];
  else if (args[i] === "--bench") bench = true;
  else files.push(args[i]);
}
if ((!out && !bench) || files.length === 0) {
  console.error("usage: node tiktoken_gpt2.mjs (--out IDS.bin | --bench) FILE.jsonl...");
  process.exit(2);
}

const texts = [];
for (const f of files) {
  for (const line of fs.readFileSync(f, "utf8").split("\n")) {
    if (line.length) texts.push(JSON.parse(line).text);
  }
}
const enc = tiktoken.get_encoding("gpt2");
if (bench) {
  const encoder = new TextEncoder();
  let bytes = 0, tokens = 0;
  for (const t of texts) bytes += encoder.encode(t).length;
  enc.encode_ordinary(texts[0] || "");  // warm up
  const t0 = process.hrtime.bigint();
  for (const t of texts) tokens += enc.encode_ordinary(t).length;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ bytes, documents: texts.length, tokens, seconds,
                               mb_per_s: bytes / 1e6 / seconds, tokens_per_s: tokens / seconds }));
} else {
  const chunks = [];
  for (const t of texts) {
    const ids = enc.encode_ordinary(t);
    const buf = new Uint32Array(ids.length + 1);
    buf[0] = ids.length;
    buf.set(ids, 1);
    chunks.push(Buffer.from(buf.buffer));
  }
  fs.writeFileSync(out, Buffer.concat(chunks));
}
enc.free();
