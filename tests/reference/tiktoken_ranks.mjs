// Reference for the TikTokenizer and HuggingFaceTokenizer parity tests and benchmark, built on
// OpenAI's tiktoken (npm package; ships the gpt2, cl100k_base and o200k_base ranks).
//   node tiktoken_ranks.mjs ranks ENCODING OUT [--json]
//       writes the encoding's ranks as a .tiktoken file ("BASE64 RANK" lines) or, with --json,
//       as Megatron's JSON list [{"rank", "token_bytes", "token_str"}]
//   node tiktoken_ranks.mjs hf ENCODING OUT_DIR [--merge-pairs] [--ignore-merges] [--bos TOKEN:ID]
//       writes OUT_DIR/tokenizer.json (byte-level BPE whose merges are derived from the ranks,
//       the encoding's pattern as a Split pre-tokenizer, or ByteLevel's own regex for gpt2; its
//       special tokens as added tokens; --bos adds a TemplateProcessing BOS) and
//       OUT_DIR/tokenizer_config.json (eos_token <|endoftext|>)
//   node tiktoken_ranks.mjs encode ENCODING --out IDS.bin [--pattern v1|v2 --cut N --offset K]
//       [--all-special] [--bench] FILE.jsonl...
//       for every {"text"} line: uint32 count, then the ids (little-endian). With --pattern, a
//       custom encoding as Megatron's TikTokenizer builds it (the first N ranks, its pattern,
//       ids shifted by K); --all-special parses the encoding's special tokens in the text.
//       --bench: no output file; prints {"bytes","documents","tokens","seconds","mb_per_s"}.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const here = path.dirname(new URL(import.meta.url).pathname);
const req = createRequire(path.join(here, "package.json"));
let tiktoken;
try {
  tiktoken = req("tiktoken");
} catch (e) {
  console.error("error: npm package tiktoken is missing (run scripts/node-deps.sh)");
  process.exit(2);
}

const PATTERNS = {
  v1: String.raw`[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`,
  v2: String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};

function loadEncoding(name) {
  const data = req(`tiktoken/encoders/${name}.json`);
  const parts = data.bpe_ranks.split(" ");
  if (parts[0] !== "!" || parts[1] !== "0") throw new Error("unexpected bpe_ranks layout");
  const tokens = parts.slice(2).map((b64) => Buffer.from(b64, "base64"));
  return { data, tokens };
}

// GPT-2's bytes_to_unicode.
function byteToUnicode() {
  const table = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    table[b] = String.fromCodePoint(printable ? b : 256 + extra++);
  }
  return table;
}

// tiktoken's merge restricted to ranks below maxRank: the parts a token is built from.
function bpeParts(bytes, rankOf, maxRank) {
  let parts = Array.from(bytes, (b) => Buffer.from([b]));
  for (;;) {
    let best = -1, bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; ++i) {
      const r = rankOf.get(Buffer.concat([parts[i], parts[i + 1]]).toString("latin1"));
      if (r !== undefined && r < maxRank && r < bestRank) { bestRank = r; best = i; }
    }
    if (best < 0) return parts;
    parts.splice(best, 2, Buffer.concat([parts[best], parts[best + 1]]));
  }
}

function writeHf(name, outDir, opts) {
  const { data, tokens } = loadEncoding(name);
  const b2u = byteToUnicode();
  const str = (buf) => Array.from(buf, (b) => b2u[b]).join("");
  const rankOf = new Map(tokens.map((t, r) => [t.toString("latin1"), r]));
  const vocab = {};
  tokens.forEach((t, r) => { vocab[str(t)] = r; });
  const merges = [];
  tokens.forEach((t, r) => {
    if (t.length < 2) return;
    const parts = bpeParts(t, rankOf, r);
    if (parts.length !== 2) throw new Error(`token ${r} does not split into two parts`);
    merges.push(opts.mergePairs ? [str(parts[0]), str(parts[1])] : `${str(parts[0])} ${str(parts[1])}`);
  });
  const added = Object.entries(data.special_tokens).map(([content, id]) => (
    { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  let post = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false };
  if (opts.bos) {
    const [tok, id] = [opts.bos.slice(0, opts.bos.lastIndexOf(":")), Number(opts.bos.slice(opts.bos.lastIndexOf(":") + 1))];
    added.push({ id, content: tok, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
    post = { type: "TemplateProcessing",
             single: [{ SpecialToken: { id: tok, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
             pair: [], special_tokens: { [tok]: { id: tok, ids: [id], tokens: [tok] } } };
  }
  const pre = name === "gpt2"
    ? { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }
    : { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { Regex: data.pat_str }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] };
  const tok = {
    version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: pre, post_processor: post,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
             ignore_merges: !!opts.ignoreMerges, vocab, merges },
  };
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tok));
  fs.writeFileSync(path.join(outDir, "tokenizer_config.json"),
                   JSON.stringify({ eos_token: "<|endoftext|>", clean_up_tokenization_spaces: false }));
}

function readTexts(files) {
  const texts = [];
  for (const f of files)
    for (const line of fs.readFileSync(f, "utf8").split("\n"))
      if (line.length) texts.push(JSON.parse(line).text);
  return texts;
}

const [mode, name, ...rest] = process.argv.slice(2);
const flag = (f) => rest.includes(f);
const value = (f) => { const i = rest.indexOf(f); return i >= 0 ? rest[i + 1] : undefined; };
if (mode === "ranks") {
  const { tokens } = loadEncoding(name);
  const out = rest[0];
  if (flag("--json")) {
    fs.writeFileSync(out, JSON.stringify(tokens.map((t, r) => (
      { rank: r, token_bytes: t.toString("base64"), token_str: t.toString("utf8") }))));
  } else {
    fs.writeFileSync(out, tokens.map((t, r) => `${t.toString("base64")} ${r}\n`).join(""));
  }
} else if (mode === "hf") {
  writeHf(name, rest[0], { mergePairs: flag("--merge-pairs"), ignoreMerges: flag("--ignore-merges"),
                           bos: value("--bos") });
} else if (mode === "encode") {
  const takesValue = new Set(["--out", "--pattern", "--cut", "--offset"]);
  const files = rest.filter((a, i) => !a.startsWith("--") && !takesValue.has(rest[i - 1]));
  let enc, offset = 0;
  if (value("--pattern")) {
    const { tokens } = loadEncoding(name);
    const cut = Number(value("--cut") || tokens.length);
    enc = new tiktoken.Tiktoken("! 0 " + tokens.slice(0, cut).map((t) => t.toString("base64")).join(" "),
                                {}, PATTERNS[value("--pattern")]);
    offset = Number(value("--offset") || 0);
  } else {
    enc = tiktoken.get_encoding(name);
  }
  const texts = readTexts(files);
  const encodeOne = flag("--all-special") ? (t) => enc.encode(t, "all", []) : (t) => enc.encode_ordinary(t);
  if (flag("--bench")) {
    let bytes = 0, tokens = 0;
    const encoder = new TextEncoder();
    for (const t of texts) bytes += encoder.encode(t).length;
    encodeOne(texts[0] || "");
    const t0 = process.hrtime.bigint();
    for (const t of texts) tokens += encodeOne(t).length;
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ bytes, documents: texts.length, tokens, seconds,
                                 mb_per_s: bytes / 1e6 / seconds, tokens_per_s: tokens / seconds }));
  } else {
    const chunks = [];
    for (const t of texts) {
      const ids = encodeOne(t);
      const buf = new Uint32Array(ids.length + 1);
      buf[0] = ids.length;
      for (let i = 0; i < ids.length; ++i) buf[i + 1] = ids[i] + offset;
      chunks.push(Buffer.from(buf.buffer));
    }
    fs.writeFileSync(value("--out"), Buffer.concat(chunks));
  }
  enc.free();
} else {
  console.error("usage: node tiktoken_ranks.mjs (ranks|hf|encode) ENCODING ...");
  process.exit(2);
}
