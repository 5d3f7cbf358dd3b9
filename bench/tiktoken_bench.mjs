// Reference for bench/preprocess_bench.sh: what a user would run instead of preprocess-data to
// tokenize a JSONL corpus with GPT-2 BPE — OpenAI's tiktoken (Rust compiled to WASM, npm
// package), one thread. Reads the file line by line, parses each JSON line, encodes the chosen
// key with the gpt2 encoding (special-token strings encoded as plain text, as Megatron's GPT-2
// tokenizer does), and counts tokens. Prints one JSON line: {"seconds", "bytes", "documents",
// "tokens", "mb_per_s", "tokens_per_s"}.
// Usage: node bench/tiktoken_bench.mjs CORPUS.jsonl [KEY] [APPEND_EOD=0|1]
// tiktoken is resolved from tests/reference/node_modules (scripts/node-deps.sh installs it),
// or from NODE_PATH.
import { createRequire } from "node:module";
import fs from "node:fs";
import readline from "node:readline";

function loadTiktoken() {
  const roots = [new URL("../tests/reference/package.json", import.meta.url).pathname,
                 new URL("./package.json", import.meta.url).pathname];
  for (const dir of (process.env.NODE_PATH || "").split(":").filter(Boolean)) roots.push(dir + "/x.js");
  for (const root of roots) {
    try { return createRequire(root)("tiktoken"); } catch (e) { /* try the next place */ }
  }
  console.error("error: the tiktoken npm package is not installed (run scripts/node-deps.sh)");
  process.exit(2);
}

const [corpus, key = "text", appendEod = "0"] = process.argv.slice(2);
if (!corpus) {
  console.error("usage: node bench/tiktoken_bench.mjs CORPUS.jsonl [KEY] [APPEND_EOD]");
  process.exit(2);
}
const { get_encoding } = loadTiktoken();
const enc = get_encoding("gpt2");
const bytes = fs.statSync(corpus).size;
const t0 = process.hrtime.bigint();
let documents = 0, tokens = 0;
const rl = readline.createInterface({ input: fs.createReadStream(corpus), crlfDelay: Infinity });
for await (const line of rl) {
  if (!line) continue;
  const text = JSON.parse(line)[key];
  const n = enc.encode(text, [], []).length;
  tokens += n + (appendEod === "1" && n > 0 ? 1 : 0);
  ++documents;
}
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
enc.free();
console.log(JSON.stringify({ seconds, bytes, documents, tokens,
                             mb_per_s: bytes / 1e6 / seconds, tokens_per_s: tokens / seconds }));
