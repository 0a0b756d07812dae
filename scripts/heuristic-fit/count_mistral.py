#!/usr/bin/env python3
"""Counts each corpus sample with the Mistral tokenizers that the `mistral-common` wheel ships in
`mistral_common/data/` (no special tokens, no BOS/EOS), as vLLM's `--tokenizer-mode mistral`
would for plain text.

    python count_mistral.py MANIFEST.tsv > mistral.tsv

Prints `path<TAB>mistral_v3<TAB>mistral_nemo`, after `# ...` lines naming the package version
and the tokenizer files with their SHA-256 (fit.mjs lists them under "Packages").
"""

import hashlib
import os
import sys
from importlib.metadata import version

import mistral_common
from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

DATA = os.path.join(os.path.dirname(mistral_common.__file__), "data")
# Mistral 7B v0.3 / Mixtral 8x22B: SentencePiece, 32768 ids (the "v3" tokenizer).
V3 = "mistral_instruct_tokenizer_240323.model.v3"
# Mistral NeMo 12B (2407): Tekken (tiktoken BPE), 131072 ids.
NEMO = "tekken_240718.json"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    v3 = SentencePieceTokenizer(os.path.join(DATA, V3))
    nemo = Tekkenizer.from_file(os.path.join(DATA, NEMO))
    pkg = f"mistral-common@{version('mistral-common')}"
    for name in (V3, NEMO):
        print(f"# {pkg} mistral_common/data/{name} (sha256 {sha256(os.path.join(DATA, name))})")
    with open(sys.argv[1], encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    for path, *_ in rows:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        a = len(v3.encode(text, bos=False, eos=False))
        b = len(nemo.encode(text, bos=False, eos=False))
        print(f"{path}\t{a}\t{b}")


if __name__ == "__main__":
    main()
