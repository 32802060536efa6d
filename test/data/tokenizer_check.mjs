// Reference encodings for test_data: js-tiktoken's gpt2 encoding (an independent implementation).
// usage: node tokenizer_check.mjs DIR   (js-tiktoken installed in test/data/node_modules)
// For every DIR/*.txt (read as UTF-8) writes DIR/*.ord (encode_ordinary: <|endoftext|> is text)
// and DIR/*.all (allowed_special = all: <|endoftext|> is 50256), ids separated by spaces.
import fs from "fs";
import path from "path";
import { getEncoding } from "js-tiktoken";

const enc = getEncoding("gpt2");
const dir = process.argv[2];
let n = 0;
for (const name of fs.readdirSync(dir).filter((f) => f.endsWith(".txt")).sort()) {
  const text = fs.readFileSync(path.join(dir, name), "utf8");
  const stem = path.join(dir, name.slice(0, -4));
  fs.writeFileSync(stem + ".ord", enc.encode(text, [], []).join(" ") + "\n");
  fs.writeFileSync(stem + ".all", enc.encode(text, "all").join(" ") + "\n");
  n++;
}
console.log(`js-tiktoken: encoded ${n} files`);
