// Reference for the TikTokenizer and HuggingFaceTokenizer parity tests and benchmark, built on
// OpenAI's tiktoken (npm package; ships the gpt2, cl100k_base and o200k_base ranks).
//   node tiktoken_ranks.mjs ranks ENCODING OUT [--json]
//       writes the encoding's ranks as a .tiktoken file ("BASE64 RANK" lines) or, with --json,
//       as Megatron's JSON list [{"rank", "token_bytes", "token_str"}]
//   node tiktoken_ranks.mjs hf ENCODING OUT_DIR [--merge-pairs] [--ignore-merges] [--bos TOKEN:ID]
//       writes OUT_DIR/tokenizer.json (byte-level BPE whose merges are derived from the ranks,
//       the encoding's pattern as a Split pre-tokenizer, or ByteLevel's own regex for gpt2; its
//       special tokens as added tokens; --bos adds a TemplateProcessing BOS) and
//       OUT_DIR/tokenizer_config.json (eos_token <|endoftext|>). ENCODING qwen2: a Qwen2-style
//       file on the cl100k_base ranks: Qwen2's Split pattern (single digits, case-insensitive
//       contractions), an NFC normalizer and Qwen's added tokens (QWEN2_ADDED) after the ranks.
//   node tiktoken_ranks.mjs encode ENCODING --out IDS.bin [--pattern v1|v2 --cut N --offset K]
//       [--all-special] [--hex] [--decoded DECODED.jsonl] [--bench] FILE.jsonl...
//       for every {"text"} line: uint32 count, then the ids (little-endian). With --pattern, a
//       custom encoding as Megatron's TikTokenizer builds it (the first N ranks, its pattern,
//       ids shifted by K); --all-special parses the encoding's special tokens in the text.
//       ENCODING qwen2: what the tokenizer.json of `hf qwen2` means, written out here: the added
//       tokens split off first (leftmost, then longest), each text between them NFC-normalised
//       and encoded with tiktoken on the cl100k_base ranks under Qwen2's pattern.
//       --hex: the lines are {"hex": "..."}, raw bytes that may hold invalid UTF-8 (no JS string
//       can); each maximal run of valid UTF-8 is encoded as above, and each maximal run of
//       invalid bytes is one piece for tiktoken's byte-pair merge over its bytes (see
//       encodeBytes). --decoded: {"text"} lines of each document's ids decoded by tiktoken to
//       bytes, then to text by TextDecoder (U+FFFD per maximal ill-formed subpart, as
//       Python's errors='replace' and Rust's from_utf8_lossy).
//       --bench: no output file; prints {"bytes","documents","tokens","seconds","mb_per_s"}.
//   node tiktoken_ranks.mjs decode ENCODING IDS.json
//       IDS.json: [[id, ...], ...]; prints the JSON list of their texts (tiktoken's decode to
//       bytes, then TextDecoder as for --decoded)
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

// Qwen2's pre-tokenizer pattern (its tokenizer.json's Split) and added tokens ([content,
// special]; Qwen2.5's tool-call tags are added but not special), ids after the ranks.
const QWEN2_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const QWEN2_ADDED = [["<|endoftext|>", true], ["<|im_start|>", true], ["<|im_end|>", true],
                     ["<|fim_prefix|>", true], ["<|fim_middle|>", true], ["<|fim_suffix|>", true],
                     ["<tool_call>", false], ["</tool_call>", false]];

function loadEncoding(name) {
  if (name === "qwen2") {
    const { data, tokens } = loadEncoding("cl100k_base");
    const special_tokens = Object.fromEntries(QWEN2_ADDED.map(([t], i) => [t, tokens.length + i]));
    return { data: { ...data, pat_str: QWEN2_PATTERN, special_tokens }, tokens };
  }
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
    { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
      special: name !== "qwen2" || QWEN2_ADDED.find(([t]) => t === content)[1] }));
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
    version: "1.0", truncation: null, padding: null, added_tokens: added,
    normalizer: name === "qwen2" ? { type: "NFC" } : null,
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

function readTexts(files, hex) {
  const texts = [];
  for (const f of files)
    for (const line of fs.readFileSync(f, "utf8").split("\n"))
      if (line.length) texts.push(hex ? Buffer.from(JSON.parse(line).hex, "hex") : JSON.parse(line).text);
  return texts;
}

// The length of the well-formed UTF-8 sequence at b[i] (Unicode Table 3-7), 0 if there is none.
function utf8Length(b, i) {
  const b0 = b[i];
  if (b0 < 0x80) return 1;
  let need = 0, lo = 0x80, hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf) need = 1;
  else if (b0 >= 0xe0 && b0 <= 0xef) { need = 2; if (b0 === 0xe0) lo = 0xa0; if (b0 === 0xed) hi = 0x9f; }
  else if (b0 >= 0xf0 && b0 <= 0xf4) { need = 3; if (b0 === 0xf0) lo = 0x90; if (b0 === 0xf4) hi = 0x8f; }
  else return 0;
  for (let k = 1; k <= need; ++k) {
    const c = b[i + k];
    if (c === undefined || c < (k === 1 ? lo : 0x80) || c > (k === 1 ? hi : 0xbf)) return 0;
  }
  return need + 1;
}

// tiktoken's encoding of one piece of bytes: the piece's own rank if it is a token, else the
// byte-pair merge (lowest-ranked pair first, leftmost on a tie).
function bytePairEncode(bytes, rankOf) {
  const whole = rankOf.get(Buffer.from(bytes).toString("latin1"));
  if (whole !== undefined) return [whole];
  return bpeParts(bytes, rankOf, Infinity).map((p) => rankOf.get(p.toString("latin1")));
}

// Raw bytes: every maximal run of well-formed UTF-8 encoded as text, every maximal run of
// invalid bytes one piece of its own. This is what a byte-level BPE whose pre-tokenizer regex
// treats invalid bytes as barriers it never matches (PCRE2's MATCH_INVALID_UTF) produces: no match
// crosses them, an assertion looking at one sees no character (as at the text's end), and the
// bytes between matches are a piece. (Python tiktoken's private _encode_bytes instead merges
// everything after the first invalid byte, with the last valid piece, as one piece.)
function encodeBytes(buf, encodeText, rankOf) {
  const ids = [];
  for (let i = 0; i < buf.length;) {
    const valid = utf8Length(buf, i) > 0;
    let j = i;
    while (j < buf.length && (utf8Length(buf, j) > 0) === valid) j += valid ? utf8Length(buf, j) : 1;
    const part = valid ? encodeText(buf.subarray(i, j).toString("utf8")) : bytePairEncode(buf.subarray(i, j), rankOf);
    for (const id of part) ids.push(id);
    i = j;
  }
  return ids;
}

// A tokenizer.json's added tokens over tiktoken: split off leftmost (then longest) added
// token, NFC-normalise the text between them and encode it with the pattern.
function addedTokenEncoder(enc, added) {
  const entries = Object.entries(added);
  return (text) => {
    const ids = [];
    const plain = (t) => { for (const id of enc.encode_ordinary(t.normalize("NFC"))) ids.push(id); };
    let seg = 0;
    for (let pos = 0; pos < text.length;) {
      let best = null;
      for (const [t, id] of entries)
        if (text.startsWith(t, pos) && (!best || t.length > best[0].length)) best = [t, id];
      if (!best) { ++pos; continue; }
      plain(text.slice(seg, pos));
      ids.push(best[1]);
      pos = seg = pos + best[0].length;
    }
    plain(text.slice(seg));
    return ids;
  };
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
  const takesValue = new Set(["--out", "--pattern", "--cut", "--offset", "--decoded"]);
  const files = rest.filter((a, i) => !a.startsWith("--") && !takesValue.has(rest[i - 1]));
  let enc, offset = 0, { data, tokens } = loadEncoding(name);
  if (value("--pattern")) {
    tokens = tokens.slice(0, Number(value("--cut") || tokens.length));
    enc = new tiktoken.Tiktoken("! 0 " + tokens.map((t) => t.toString("base64")).join(" "),
                                {}, PATTERNS[value("--pattern")]);
    offset = Number(value("--offset") || 0);
  } else if (name === "qwen2") {
    enc = new tiktoken.Tiktoken(loadEncoding("cl100k_base").data.bpe_ranks, data.special_tokens, data.pat_str);
  } else {
    enc = tiktoken.get_encoding(name);
  }
  const texts = readTexts(files, flag("--hex"));
  const encodeText = name === "qwen2" ? addedTokenEncoder(enc, data.special_tokens)
    : flag("--all-special") ? (t) => enc.encode(t, "all", []) : (t) => enc.encode_ordinary(t);
  const rankOf = new Map(tokens.map((t, r) => [t.toString("latin1"), r]));
  const encodeOne = (doc) => typeof doc === "string" ? encodeText(doc) : encodeBytes(doc, encodeText, rankOf);
  if (flag("--bench")) {
    let bytes = 0, count = 0;
    const encoder = new TextEncoder();
    for (const t of texts) bytes += encoder.encode(t).length;
    encodeOne(texts[0] || "");
    const t0 = process.hrtime.bigint();
    for (const t of texts) count += encodeOne(t).length;
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ bytes, documents: texts.length, tokens: count, seconds,
                                 mb_per_s: bytes / 1e6 / seconds, tokens_per_s: count / seconds }));
  } else {
    const chunks = [], decoded = [];
    const decoder = new TextDecoder("utf-8", { ignoreBOM: true });  // keeps a leading U+FEFF
    for (const t of texts) {
      const ids = encodeOne(t);
      const buf = new Uint32Array(ids.length + 1);
      buf[0] = ids.length;
      for (let i = 0; i < ids.length; ++i) buf[i + 1] = ids[i] + offset;
      chunks.push(Buffer.from(buf.buffer));
      if (value("--decoded")) decoded.push(JSON.stringify({ text: decoder.decode(enc.decode(Uint32Array.from(ids))) }) + "\n");
    }
    fs.writeFileSync(value("--out"), Buffer.concat(chunks));
    if (value("--decoded")) fs.writeFileSync(value("--decoded"), decoded.join(""));
  }
  enc.free();
} else if (mode === "decode") {
  const enc = name === "qwen2"
    ? new tiktoken.Tiktoken(loadEncoding("cl100k_base").data.bpe_ranks, loadEncoding(name).data.special_tokens, QWEN2_PATTERN)
    : tiktoken.get_encoding(name);
  const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  const lists = JSON.parse(fs.readFileSync(rest[0], "utf8"));
  console.log(JSON.stringify(lists.map((ids) => decoder.decode(enc.decode(Uint32Array.from(ids))))));
  enc.free();
} else {
  console.error("usage: node tiktoken_ranks.mjs (ranks|hf|encode|decode) ENCODING ...");
  process.exit(2);
}
