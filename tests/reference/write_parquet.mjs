// Independent Parquet writer for the preprocess-data parquet tests: Apache Arrow (npm
// apache-arrow) builds a table of string columns from a JSONL file, and parquet-wasm (the Rust
// arrow-rs parquet writer compiled to WASM) writes it.
//   node write_parquet.mjs IN.jsonl OUT.parquet [--compression none|snappy|gzip|zstd|brotli]
//       [--encoding plain|dictionary|delta-length|delta] [--page-version 1|2]
//       [--row-group-rows N] [--page-bytes N]
// Every key of the first JSON line becomes a nullable string column (JSON null -> null).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const here = path.dirname(new URL(import.meta.url).pathname);
const req = createRequire(path.join(here, "package.json"));
let arrow, pq;
try {
  arrow = req("apache-arrow");
  pq = req("parquet-wasm/node");
} catch (e) {
  console.error("error: npm packages apache-arrow and parquet-wasm are missing (run scripts/node-deps.sh)");
  process.exit(2);
}

const [input, output, ...rest] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: node write_parquet.mjs IN.jsonl OUT.parquet [options]");
  process.exit(2);
}
const value = (f, d) => { const i = rest.indexOf(f); return i >= 0 ? rest[i + 1] : d; };

const rows = fs.readFileSync(input, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
const keys = rows.length ? Object.keys(rows[0]) : ["text"];
const columns = {};
for (const k of keys)
  columns[k] = arrow.vectorFromArray(rows.map((r) => (r[k] === undefined ? null : r[k])), new arrow.Utf8());
const table = new arrow.Table(columns);

const compression = {
  none: pq.Compression.UNCOMPRESSED, snappy: pq.Compression.SNAPPY, gzip: pq.Compression.GZIP,
  zstd: pq.Compression.ZSTD, brotli: pq.Compression.BROTLI,
}[value("--compression", "none")];
const encoding = value("--encoding", "plain");
let props = new pq.WriterPropertiesBuilder()
  .setCompression(compression)
  .setWriterVersion(value("--page-version", "1") === "2" ? pq.WriterVersion.V2 : pq.WriterVersion.V1)
  .setMaxRowGroupSize(Number(value("--row-group-rows", "1000000")))
  .setDataPageSizeLimit(Number(value("--page-bytes", "1048576")))
  .setDictionaryEnabled(encoding === "dictionary");
if (encoding === "delta-length") props = props.setEncoding(pq.Encoding.DELTA_LENGTH_BYTE_ARRAY);
else if (encoding === "delta") props = props.setEncoding(pq.Encoding.DELTA_BYTE_ARRAY);
else if (encoding === "plain") props = props.setEncoding(pq.Encoding.PLAIN);

const wasmTable = pq.Table.fromIPCStream(arrow.tableToIPC(table, "stream"));
fs.writeFileSync(output, pq.writeParquet(wasmTable, props.build()));
