#!/usr/bin/env python3
"""Text written to be undercounted by the token heuristic, and the heuristic's rule before and
after the change of digits, `<|name|>` markers and 4-byte characters.

    python3 adversarial.py gen OUT_DIR            # the seven texts and OUT_DIR/manifest.tsv
    python3 adversarial.py count {old,new} MANIFEST.tsv   # path<TAB>count, like heuristic_count
    python3 adversarial.py table COUNTS.tsv       # Markdown table, old and new rule

`gen` writes seven texts (fixed seed, standard library only), each its own kind, in the
manifest format of gen_corpus.py, so that count_mistral.py and fit.mjs count them as they count
the corpus (run.sh does, into WORK/adv). `table` reads the counts.tsv that fit.mjs writes and
prints real / heuristic per text and tokenizer under the old rule and the new one.

OLD and NEW below re-implement `tutor_wire::tokens::heuristic_ids` (no BOS): NEW is the rule of
wire/src/tokens.rs, OLD the one before it (git history). `table` checks that NEW gives the
counts.tsv heuristic column, i.e. the Rust example's count, on every text.
"""

import os
import random
import sys

SEED = 20240611

# wire/src/tokens.rs: SPECIAL_MARKERS, plus Llama 3's reserved_special_token_<n> (n: 1-3 digits).
SPECIAL_MARKERS = {
    "im_start", "im_end", "im_sep", "endoftext", "begin_of_text", "end_of_text",
    "start_header_id", "end_header_id", "eot_id", "eom_id", "python_tag",
    "finetune_right_pad_id", "start", "end", "message", "channel", "constrain", "return", "call",
    "tool_call", "vision_start", "vision_end", "image_pad", "video_pad",
}
WS = " \t\n\r\x0c"  # Rust's u8::is_ascii_whitespace
NAME = set("abcdefghijklmnopqrstuvwxyz0123456789_")


def _alpha(c):
    return c.isascii() and c.isalpha()


def _digit(c):
    return c.isascii() and c.isdigit()


def _marker(text, i, new):
    """Length of the `<|name|>` marker at text[i] that the rule counts as one token, or 0."""
    if not text.startswith("<|", i):
        return 0
    j = i + 2
    while j < len(text) and j - i - 2 < 33 and text[j] in NAME:
        j += 1
    name = text[i + 2 : j]
    if not text.startswith("|>", j):
        return 0
    if new:
        rest = name[len("reserved_special_token_"):]
        known = name in SPECIAL_MARKERS or (
            name.startswith("reserved_special_token_") and 1 <= len(rest) <= 3 and rest.isdigit())
    else:
        known = 0 < len(name) <= 32
    return len(name) + 4 if known else 0


def count(text, new):
    """Tokens by the heuristic, no BOS. new=False: the rule before the change (a run of letters
    and digits is ceil(n/4); any `<|name|>` of at most 32 [a-z0-9_] is one; every other
    character is one). new=True: letters ceil(n/4), a digit one (the space before a number a token
    of its own), only special markers one, a 4-byte UTF-8 character four."""
    n, i, end = 0, 0, len(text)
    word = _alpha if new else (lambda c: _alpha(c) or _digit(c))
    while i < end:
        m = _marker(text, i, new)
        if m:
            n += 1
            i += m
            continue
        c = text[i]
        if c == " " and i + 1 < end and (_alpha(text[i + 1]) or (not new and _digit(text[i + 1]))):
            i += 1
            c = text[i]
        if word(c):
            j = i
            while j < end and word(text[j]):
                j += 1
            n += -(-(j - i) // 4)
            i = j
        elif new and _digit(c):
            while i < end and _digit(text[i]):
                n += 1
                i += 1
        elif c == "\n":
            n += 1
            i += 1
        elif c in WS:
            j = i
            while j < end and text[j] in WS and text[j] != "\n":
                j += 1
            n += -(-(j - i) // 4)
            i = j
        else:
            n += 4 if new and len(c.encode()) == 4 else 1
            i += 1
    return n


def texts(rng):
    """The seven texts, in table order: (kind, description)."""
    lower_digits = "abcdefghijklmnopqrstuvwxyz0123456789"
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    # Emoji: the 4-byte code points of the emoji blocks that are emoji presentation by default.
    emoji = [c for c in range(0x1F300, 0x1FAFF + 1) if _is_emoji(c)]
    yield ("a-markers", "100 random `<\\|name\\|>` markers, 32-char lowercase/digit names",
           "".join("<|" + "".join(rng.choice(lower_digits) for _ in range(32)) + "|>"
                   for _ in range(100)))
    yield ("b-cjk-ext-b", "2,000 random CJK Extension B characters (U+20000..U+2A6DF, 4 bytes)",
           "".join(chr(rng.randint(0x20000, 0x2A6DF)) for _ in range(2000)))
    yield ("c-emoji", "2,000 random emoji (4 bytes each)",
           "".join(chr(rng.choice(emoji)) for _ in range(2000)))
    yield ("d-digit-groups", "5 KB of space-separated random 4-digit groups",
           " ".join(f"{rng.randrange(10000):04}" for _ in range(1000)))
    yield ("e-digit-run", "5 KB of digits, no spaces",
           "".join(rng.choice("0123456789") for _ in range(5000)))
    yield ("f-mixed-case", "5 KB of random mixed-case ASCII letters in 8-letter words",
           " ".join("".join(rng.choice(letters) for _ in range(8)) for _ in range(556)))
    yield ("g-rare-cjk", "2,000 random CJK characters U+9F00..U+9FFF (3 bytes)",
           "".join(chr(rng.randint(0x9F00, 0x9FFF)) for _ in range(2000)))


def _is_emoji(cp):
    # Emoticons, transport and map, supplemental symbols and pictographs, symbols and
    # pictographs extended-A, and the pictographs of U+1F300..U+1F5FF: assigned ones only.
    import unicodedata

    try:
        unicodedata.name(chr(cp))
    except ValueError:
        return False
    return (0x1F300 <= cp <= 0x1F64F or 0x1F680 <= cp <= 0x1F6FF or 0x1F900 <= cp <= 0x1F9FF
            or 0x1FA70 <= cp <= 0x1FAFF)


def gen(out):
    rng = random.Random(SEED)
    os.makedirs(out, exist_ok=True)
    rows = []
    for kind, _, text in texts(rng):
        path = os.path.join(out, kind + ".txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        rows.append((path, kind, kind, len(text.encode())))
    with open(os.path.join(out, "manifest.tsv"), "w", encoding="utf-8") as f:
        f.write("path\tkind\tsubkind\tbytes\n")
        for r in rows:
            f.write("\t".join(map(str, r)) + "\n")
    print(f"wrote {len(rows)} texts to {out}", file=sys.stderr)


def read_tsv(path):
    with open(path, encoding="utf-8") as f:
        lines = [l.rstrip("\n").split("\t") for l in f if l.strip() and not l.startswith("#")]
    return lines[0], lines[1:]


LABELS = {"llama3": "Llama 3", "qwen2_5": "Qwen 2.5", "o200k": "o200k",
          "mistral_v3": "Mistral v3", "mistral_nemo": "NeMo"}


def table(counts_path):
    head, rows = read_tsv(counts_path)
    cols = [c for c in LABELS if c in head]
    desc = {k: d for k, d, _ in texts(random.Random(SEED))}
    print("| text | bytes | heuristic old / new | " + " | ".join(LABELS[c] for c in cols) + " |")
    print("|---|---:|---:|" + "---:|" * len(cols))
    for r in rows:
        s = dict(zip(head, r))
        with open(s["path"], encoding="utf-8") as f:
            text = f.read()
        old, new = count(text, False), count(text, True)
        if new != int(s["heuristic"]):
            sys.exit(f"{s['path']}: new rule {new} here, {s['heuristic']} by the Rust example")
        cells = [f"{int(s[c]) / old:.2f} → {int(s[c]) / new:.2f}" for c in cols]
        print(f"| ({s['kind'][0]}) {desc[s['kind']]} | {s['bytes']} | {old} / {new} | "
              + " | ".join(cells) + " |")
    print()
    print("Real token counts: " + "; ".join(
        f"{s[1]}: " + ", ".join(f"{LABELS[c]} {dict(zip(head, s))[c]}" for c in cols)
        for s in rows))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "gen":
        gen(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "count" and sys.argv[2] in ("old", "new"):
        _, rows = read_tsv(sys.argv[3])
        for path, *_ in rows:
            with open(path, encoding="utf-8") as f:
                print(f"{path}\t{count(f.read(), sys.argv[2] == 'new')}")
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
