#!/usr/bin/env python3
"""Writes the heuristic-fit corpus: generated, deterministic (seeded) samples of four kinds.

    python3 gen_corpus.py OUT_DIR [--per-kind 48] [--seed 20240611]

- code: Python, Rust and TypeScript source with comments, docstrings and indentation;
- prose: English tutoring prose and students' questions (a little non-ASCII punctuation);
- traceback: Python tracebacks, single and chained, with library frames;
- tools: OpenAI `tools` JSON arrays, compact (no spaces) and pretty-printed (indent 2).

Sizes are drawn log-uniformly between 200 B and 30 KB; a sample is built piece by piece until
it reaches its size. Writes OUT_DIR/<kind>/<subkind>-NNN.txt and OUT_DIR/manifest.tsv
(path, kind, subkind, bytes). Standard library only; no third-party text.

With --from-repo ROOT it writes instead a control corpus of this repository's own Rust source
and Markdown docs (kinds repo-rust, repo-md).
"""

import argparse
import json
import math
import os
import random

MIN_BYTES = 200
MAX_BYTES = 30_000

WORDS = (
    "value index count total result item node edge graph tree list queue stack buffer cache "
    "record student grade score course lesson answer question token parser reader writer "
    "config state event handler request response message user session matrix vector row "
    "column cell weight bias layer batch epoch loss step offset length width height name path "
    "file line word char key entry table pair left right parent child root depth level limit "
    "price order invoice account balance rate interval window timer retry error status code"
).split()
VERBS = (
    "get set load save parse build compute update insert remove find sort merge split check "
    "validate render format read write apply reset count filter map reduce collect process "
    "normalize encode decode flatten resolve evaluate schedule fetch emit handle"
).split()
TYPES_PY = ["int", "str", "float", "bool", "list[int]", "dict[str, int]", "list[str]", "None"]
TYPES_RS = ["u32", "usize", "i64", "f64", "bool", "String", "&str", "Vec<u32>", "Option<usize>"]
TYPES_TS = ["number", "string", "boolean", "number[]", "string[]", "Record<string, number>"]


def ident(rng, parts=None, style="snake"):
    n = parts or rng.choice([1, 2, 2, 3])
    ws = [rng.choice(WORDS if i else VERBS + WORDS) for i in range(n)]
    if style == "snake":
        return "_".join(ws)
    if style == "camel":
        return ws[0] + "".join(w.capitalize() for w in ws[1:])
    return "".join(w.capitalize() for w in ws)  # Pascal


def sentence_fragment(rng, n=None):
    n = n or rng.randint(4, 12)
    return " ".join(rng.choice(WORDS + VERBS + COMMON) for _ in range(n))


COMMON = (
    "the a an of to in for with on is are this that when if then so it we you each every "
    "not only also first next last before after because which while until"
).split()


def comment_text(rng):
    starts = [
        "Returns the", "Keeps the", "Walks every", "Skips the", "Checks that the",
        "Computes the", "Note: the", "TODO: handle the", "Splits the", "Merges the",
    ]
    return f"{rng.choice(starts)} {sentence_fragment(rng, rng.randint(3, 10))}."


# ---------------------------------------------------------------- code


def py_expr(rng, names):
    a, b = rng.choice(names), rng.choice(names)
    forms = [
        f"{a} + {b}", f"{a} * {rng.randint(2, 9)}", f"len({a})", f"{a}[{rng.randint(0, 5)}]",
        f"{a}.get({json.dumps(rng.choice(WORDS))}, 0)", f"max({a}, {b})",
        f"[x for x in {a} if x > {rng.randint(0, 100)}]", f"{a} // {rng.randint(2, 16)}",
        f"sum({a}) / max(len({a}), 1)", f"{ident(rng)}({a}, {b})", f"{a} % {rng.randint(2, 97)}",
        f"f\"{{{a}}}: {{{b}:.2f}}\"", f"sorted({a}, key=lambda r: r.{rng.choice(WORDS)})",
    ]
    return rng.choice(forms)


def py_function(rng, indent=""):
    name = ident(rng)
    params = [ident(rng, rng.choice([1, 2])) for _ in range(rng.randint(1, 4))]
    typed = ", ".join(f"{p}: {rng.choice(TYPES_PY[:-1])}" for p in params)
    names = list(params)
    out = [f"{indent}def {name}({typed}) -> {rng.choice(TYPES_PY)}:"]
    body = indent + "    "
    out.append(f'{body}"""{comment_text(rng)}')
    if rng.random() < 0.6:
        out.append("")
        out.append(f"{body}Args:")
        for p in params:
            out.append(f"{body}    {p}: {sentence_fragment(rng, rng.randint(3, 7))}.")
    out.append(f'{body}"""')
    for _ in range(rng.randint(2, 9)):
        r = rng.random()
        var = ident(rng, rng.choice([1, 2]))
        if r < 0.35:
            out.append(f"{body}{var} = {py_expr(rng, names)}")
            names.append(var)
        elif r < 0.5:
            out.append(f"{body}# {comment_text(rng)}")
        elif r < 0.7:
            out.append(f"{body}for {var} in {rng.choice(names)}:")
            out.append(f"{body}    if {var} {rng.choice(['>', '<', '==', '!='])} {rng.randint(0, 50)}:")
            out.append(f"{body}        {rng.choice(names)} += {var}")
            names.append(var)
        elif r < 0.85:
            out.append(f"{body}if not {rng.choice(names)}:")
            out.append(f"{body}    raise ValueError({json.dumps(comment_text(rng))})")
        else:
            out.append(f"{body}try:")
            out.append(f"{body}    {var} = {py_expr(rng, names)}")
            out.append(f"{body}except (KeyError, IndexError) as exc:")
            out.append(f"{body}    logger.warning(\"{ident(rng)} failed: %s\", exc)")
            out.append(f"{body}    {var} = None")
            names.append(var)
    out.append(f"{body}return {rng.choice(names)}")
    return "\n".join(out)


def py_piece(rng):
    r = rng.random()
    if r < 0.2:
        cls = ident(rng, 2, "pascal")
        fields = [ident(rng, 1) for _ in range(rng.randint(2, 5))]
        out = ["@dataclass", f"class {cls}:", f'    """{comment_text(rng)}"""', ""]
        out += [f"    {f}: {rng.choice(TYPES_PY[:-1])} = {rng.choice(['0', 'None', '0.0', 'False', 'field(default_factory=list)'])}" for f in fields]
        out.append("")
        out.append(py_function(rng, "    ").replace("(", "(self, ", 1))
        return "\n".join(out)
    if r < 0.3:
        mods = rng.sample(["os", "sys", "json", "math", "logging", "itertools", "collections", "re", "pathlib", "typing"], 3)
        return "\n".join([f"import {m}" for m in mods] + ["from dataclasses import dataclass, field", "", "logger = logging.getLogger(__name__)"])
    return py_function(rng)


def rs_function(rng, indent=""):
    name = ident(rng)
    params = [ident(rng, rng.choice([1, 2])) for _ in range(rng.randint(1, 4))]
    sig = ", ".join(f"{p}: {rng.choice(TYPES_RS)}" for p in params)
    out = [f"{indent}/// {comment_text(rng)}"]
    if rng.random() < 0.4:
        out.append(f"{indent}/// {comment_text(rng)}")
    out.append(f"{indent}pub fn {name}({sig}) -> {rng.choice(TYPES_RS)} {{")
    b = indent + "    "
    names = list(params)
    for _ in range(rng.randint(2, 9)):
        r = rng.random()
        var = ident(rng, rng.choice([1, 2]))
        if r < 0.35:
            a = rng.choice(names)
            e = rng.choice([
                f"{a}.len()", f"{a}.iter().map(|x| x * {rng.randint(2, 9)}).sum::<u32>()",
                f"{a}.saturating_sub({rng.randint(1, 64)})", f"{a}.unwrap_or({rng.randint(0, 9)})",
                f"{ident(rng)}(&{a}, {rng.choice(names)})?", f"{a}.clone()",
                f"format!(\"{{}}-{{}}\", {a}, {rng.choice(names)})", f"{a} as f64 / {rng.randint(2, 9)}.0",
            ])
            out.append(f"{b}let {'mut ' if rng.random() < 0.3 else ''}{var} = {e};")
            names.append(var)
        elif r < 0.5:
            out.append(f"{b}// {comment_text(rng)}")
        elif r < 0.7:
            out.append(f"{b}for {var} in {rng.choice(names)}.iter() {{")
            out.append(f"{b}    if *{var} > {rng.randint(0, 99)} {{")
            out.append(f"{b}        continue;")
            out.append(f"{b}    }}")
            out.append(f"{b}}}")
        elif r < 0.85:
            out.append(f"{b}match {rng.choice(names)} {{")
            out.append(f"{b}    Some(v) if v > {rng.randint(1, 9)} => return Err(Error::{ident(rng, 2, 'pascal')}(v)),")
            out.append(f"{b}    Some(_) | None => {{}}")
            out.append(f"{b}}}")
        else:
            out.append(f"{b}if {rng.choice(names)}.is_empty() {{")
            out.append(f"{b}    return Err(Error::{ident(rng, 2, 'pascal')});")
            out.append(f"{b}}}")
    out.append(f"{b}{rng.choice(names)}")
    out.append(f"{indent}}}")
    return "\n".join(out)


def rs_piece(rng):
    r = rng.random()
    if r < 0.2:
        name = ident(rng, 2, "pascal")
        out = [f"/// {comment_text(rng)}", "#[derive(Debug, Clone, PartialEq)]", f"pub struct {name} {{"]
        for _ in range(rng.randint(2, 6)):
            out.append(f"    /// {comment_text(rng)}")
            out.append(f"    pub {ident(rng, rng.choice([1, 2]))}: {rng.choice(TYPES_RS)},")
        out.append("}")
        out.append("")
        out.append(f"impl {name} {{")
        out.append(rs_function(rng, "    ").replace("(", "(&self, ", 1))
        out.append("}")
        return "\n".join(out)
    if r < 0.3:
        return "\n".join([
            "use std::collections::HashMap;",
            f"use crate::{ident(rng, 1)}::{{{ident(rng, 2, 'pascal')}, {ident(rng, 1, 'pascal')}}};",
            "",
            f"const {ident(rng, 2).upper()}: usize = {rng.randint(2, 4096)};",
        ])
    if r < 0.4:
        return "\n".join([
            "#[cfg(test)]", "mod tests {", "    use super::*;", "", "    #[test]",
            f"    fn {ident(rng, 3)}() {{",
            f"        assert_eq!({ident(rng)}({rng.randint(0, 99)}), {rng.randint(0, 99)});",
            "    }", "}",
        ])
    return rs_function(rng)


def ts_function(rng, indent=""):
    name = ident(rng, style="camel")
    params = [ident(rng, rng.choice([1, 2]), "camel") for _ in range(rng.randint(1, 4))]
    sig = ", ".join(f"{p}: {rng.choice(TYPES_TS)}" for p in params)
    out = [f"{indent}/**", f"{indent} * {comment_text(rng)}"]
    for p in params:
        if rng.random() < 0.5:
            out.append(f"{indent} * @param {p} {sentence_fragment(rng, rng.randint(3, 6))}")
    out.append(f"{indent} */")
    asy = "async " if rng.random() < 0.3 else ""
    out.append(f"{indent}export {asy}function {name}({sig}): {rng.choice(TYPES_TS)} {{")
    b = indent + "  "
    names = list(params)
    for _ in range(rng.randint(2, 9)):
        r = rng.random()
        var = ident(rng, rng.choice([1, 2]), "camel")
        if r < 0.35:
            a = rng.choice(names)
            e = rng.choice([
                f"{a}.length", f"{a}.map((x) => x * {rng.randint(2, 9)})", f"{a} ?? {rng.randint(0, 9)}",
                f"await {ident(rng, style='camel')}({a})", f"`${{{a}}}/${{{rng.choice(names)}}}`",
                f"{a}.filter((r) => r.{ident(rng, 1)} !== undefined)", f"Math.max({a}, {rng.choice(names)})",
                f"{{ ...{a}, {ident(rng, 1)}: {rng.randint(0, 99)} }}",
            ])
            out.append(f"{b}const {var} = {e};")
            names.append(var)
        elif r < 0.5:
            out.append(f"{b}// {comment_text(rng)}")
        elif r < 0.7:
            out.append(f"{b}for (const {var} of {rng.choice(names)}) {{")
            out.append(f"{b}  if ({var} > {rng.randint(0, 99)}) {{")
            out.append(f"{b}    break;")
            out.append(f"{b}  }}")
            out.append(f"{b}}}")
        else:
            out.append(f"{b}if (!{rng.choice(names)}) {{")
            out.append(f"{b}  throw new Error({json.dumps(comment_text(rng))});")
            out.append(f"{b}}}")
    out.append(f"{b}return {rng.choice(names)};")
    out.append(f"{indent}}}")
    return "\n".join(out)


def ts_piece(rng):
    r = rng.random()
    if r < 0.2:
        name = ident(rng, 2, "pascal")
        out = [f"/** {comment_text(rng)} */", f"export interface {name} {{"]
        for _ in range(rng.randint(2, 6)):
            out.append(f"  {ident(rng, rng.choice([1, 2]), 'camel')}{'?' if rng.random() < 0.3 else ''}: {rng.choice(TYPES_TS)};")
        out.append("}")
        return "\n".join(out)
    if r < 0.3:
        return "\n".join([
            f"import {{ {ident(rng, 2, 'camel')}, {ident(rng, 2, 'camel')} }} from \"./{ident(rng, 1)}\";",
            f"import type {{ {ident(rng, 2, 'pascal')} }} from \"../{ident(rng, 1)}/{ident(rng, 1)}\";",
        ])
    return ts_function(rng)


# ---------------------------------------------------------------- prose

TOPICS = [
    "recursion", "binary search", "linked lists", "hash maps", "big-O notation", "dynamic programming",
    "closures", "list comprehensions", "pointers", "the borrow checker", "async functions",
    "unit tests", "sorting algorithms", "graph traversal", "floating point rounding", "regular expressions",
    "classes and objects", "immutability", "off-by-one errors", "the call stack",
]
PROSE_SENTENCES = [
    "Let's look at {t} step by step, starting with a small example you can run yourself.",
    "A good way to think about {t} is to ask what changes between one step and the next.",
    "Notice that the loop stops one element early; that is the classic off-by-one mistake.",
    "Before reading on, try to predict what `{f}({n})` returns, then check it in the shell.",
    "When you write {t}, the base case has to come first, or the function never stops.",
    "In this exercise the input has {n} items, so an O(n^2) solution does about {n2} comparisons.",
    "Why does `{v}` still hold the old value after the function returns?",
    "I tried to use {t} for my homework but I keep getting the wrong answer for the last test case.",
    "Could you explain the difference between {t} and {t2} with a short example?",
    "The test expects {n} but my function returns {m}, and I don't understand where the extra comes from.",
    "Here is a hint: print `{v}` at the start of each iteration and compare it with what you expected.",
    "Great question! The short answer is that {t} trades memory for speed.",
    "You're close — the condition is right, but the update happens in the wrong place.",
    "Remember that indexes start at 0, so the last element of a list of length {n} is at index {m}.",
    "If the list is already sorted, we can halve the search range at every step.",
    "My teacher said to avoid global variables, but I'm not sure how to pass `{v}` between functions instead.",
    "Try rewriting the function so it takes `{v}` as a parameter and returns the new value.",
    "This is where {t} really helps: each call solves a smaller version of the same problem.",
    "What would happen if the input were empty? Walk through the code with `[]` and see.",
    "The error message says “index out of range”, which means we asked for an element that isn't there.",
    "On line {n}, `{v}` is compared with `=` instead of `==`, so Python raises a SyntaxError.",
    "Good work so far. Next, think about how {t} could make the second part shorter.",
]


def prose_paragraph(rng):
    out = []
    for _ in range(rng.randint(2, 6)):
        n = rng.randint(2, 200)
        t, t2 = rng.sample(TOPICS, 2)
        out.append(rng.choice(PROSE_SENTENCES).format(
            t=t, t2=t2, f=ident(rng), v=ident(rng, rng.choice([1, 2])),
            n=n, n2=n * n, m=n - 1,
        ))
    para = " ".join(out)
    r = rng.random()
    if r < 0.15:
        items = [f"{i + 1}. {rng.choice(PROSE_SENTENCES).format(t=rng.choice(TOPICS), t2=rng.choice(TOPICS), f=ident(rng), v=ident(rng, 1), n=i + 2, n2=(i + 2) ** 2, m=i + 1)}" for i in range(rng.randint(2, 5))]
        para += "\n\n" + "\n".join(items)
    elif r < 0.25:
        para = f"**Question {rng.randint(1, 20)}.** " + para
    return para


# ---------------------------------------------------------------- tracebacks

LIB_FRAMES = [
    ("/usr/lib/python3.11/json/__init__.py", "loads", "return _default_decoder.decode(s)"),
    ("/usr/lib/python3.11/json/decoder.py", "decode", "obj, end = self.raw_decode(s, idx=_w(s, 0).end())"),
    ("/usr/lib/python3.11/json/decoder.py", "raw_decode", "raise JSONDecodeError(\"Expecting value\", s, err.value) from None"),
    ("/home/student/.venv/lib/python3.11/site-packages/pandas/core/frame.py", "__getitem__", "indexer = self.columns.get_loc(key)"),
    ("/home/student/.venv/lib/python3.11/site-packages/pandas/core/indexes/base.py", "get_loc", "raise KeyError(key) from err"),
    ("/home/student/.venv/lib/python3.11/site-packages/numpy/core/fromnumeric.py", "_wrapfunc", "return bound(*args, **kwds)"),
    ("/home/student/.venv/lib/python3.11/site-packages/requests/api.py", "request", "return session.request(method=method, url=url, **kwargs)"),
    ("/home/student/.venv/lib/python3.11/site-packages/requests/sessions.py", "send", "r = adapter.send(request, **kwargs)"),
    ("/usr/lib/python3.11/asyncio/base_events.py", "run_until_complete", "return future.result()"),
    ("/usr/lib/python3.11/unittest/case.py", "_callTestMethod", "if method() is not None:"),
]
EXCEPTIONS = [
    ("KeyError", lambda rng: repr(rng.choice(WORDS))),
    ("IndexError", lambda rng: "list index out of range"),
    ("TypeError", lambda rng: f"unsupported operand type(s) for +: 'int' and '{rng.choice(['str', 'NoneType', 'list'])}'"),
    ("ValueError", lambda rng: f"invalid literal for int() with base 10: '{rng.choice(WORDS)}{rng.randint(0, 9)}'"),
    ("AttributeError", lambda rng: f"'NoneType' object has no attribute '{ident(rng, 1)}'"),
    ("ZeroDivisionError", lambda rng: "division by zero"),
    ("json.decoder.JSONDecodeError", lambda rng: f"Expecting value: line {rng.randint(1, 40)} column {rng.randint(1, 80)} (char {rng.randint(0, 2000)})"),
    ("RecursionError", lambda rng: "maximum recursion depth exceeded in comparison"),
    ("AssertionError", lambda rng: f"{rng.randint(0, 99)} != {rng.randint(0, 99)}"),
]


def user_frame(rng):
    f = f"/home/student/{rng.choice(['project', 'hw3', 'lab_05', 'exercises'])}/{ident(rng, rng.choice([1, 2]))}.py"
    code = rng.choice([
        f"{ident(rng, 1)} = {ident(rng)}({ident(rng, 1)}, {ident(rng, 1)})",
        f"return {ident(rng)}({ident(rng, 1)}[{rng.randint(0, 9)}])",
        f"total += {ident(rng, 1)}[{ident(rng, 1)}] / {ident(rng, 1)}",
        f"for {ident(rng, 1)} in {ident(rng)}({ident(rng, 1)}):",
        f"print(f\"{{{ident(rng, 1)}}}\")",
    ])
    return f, ident(rng), code


def one_traceback(rng):
    out = ["Traceback (most recent call last):"]
    frames = [user_frame(rng) for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.5:
        frames += rng.sample(LIB_FRAMES, rng.randint(1, 4))
    if rng.random() < 0.15:
        f = user_frame(rng)
        frames += [f] * 3
        extra = rng.randint(10, 990)
    else:
        extra = 0
    for i, (path, fn, code) in enumerate(frames):
        out.append(f'  File "{path}", line {rng.randint(1, 900)}, in {fn}')
        out.append(f"    {code}")
        if rng.random() < 0.2:
            out.append("    " + " " * rng.randint(0, 12) + "^" * rng.randint(3, 20))
        if extra and i == len(frames) - 1:
            out.append(f"  [Previous line repeated {extra} more times]")
    name, msg = rng.choice(EXCEPTIONS)
    out.append(f"{name}: {msg(rng)}")
    return "\n".join(out)


def traceback_piece(rng, first):
    if first:
        return one_traceback(rng)
    link = rng.choice([
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    ])
    return f"\n{link}\n\n{one_traceback(rng)}"


# ---------------------------------------------------------------- tools

PARAM_TYPES = ["string", "integer", "number", "boolean"]


def one_tool(rng):
    props = {}
    for _ in range(rng.randint(1, 6)):
        t = rng.choice(PARAM_TYPES + ["enum", "array"])
        p = {"description": comment_text(rng)}
        if t == "enum":
            p["type"] = "string"
            p["enum"] = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        elif t == "array":
            p["type"] = "array"
            p["items"] = {"type": rng.choice(PARAM_TYPES)}
        else:
            p["type"] = t
            if t == "integer" and rng.random() < 0.4:
                p["minimum"] = 0
                p["maximum"] = rng.randint(10, 10000)
        props[ident(rng, rng.choice([1, 2]))] = p
    required = [k for k in props if rng.random() < 0.6]
    desc = " ".join(comment_text(rng) for _ in range(rng.randint(1, 3)))
    return {
        "type": "function",
        "function": {
            "name": ident(rng, rng.choice([2, 3])),
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def tools_sample(rng, target, pretty):
    tools = [one_tool(rng)]
    dump = (lambda ts: json.dumps(ts, indent=2)) if pretty else (lambda ts: json.dumps(ts, separators=(",", ":")))
    while len(dump(tools).encode()) < target:
        tools.append(one_tool(rng))
    if len(tools) > 1 and len(dump(tools).encode()) > target * 1.3:
        tools.pop()
    return dump(tools)


# ---------------------------------------------------------------- assembly


def build(rng, target, piece, sep):
    parts = [piece(rng, True)]
    while len(sep.join(parts).encode()) < target:
        parts.append(piece(rng, False))
    # Drop the last piece when that lands nearer the target.
    if len(parts) > 1:
        with_last = len(sep.join(parts).encode())
        without = len(sep.join(parts[:-1]).encode())
        if without >= MIN_BYTES and abs(without - target) < abs(with_last - target):
            parts.pop()
    return sep.join(parts) + "\n"


def from_repo(root, out):
    """The control corpus: this repository's own Rust source and Markdown docs, each cut to at
    most MAX_BYTES at a line end (real text of the project, to check the generated corpus)."""
    files = []
    for sub, ext, kind in [("src", ".rs", "repo-rust"), ("wire/src", ".rs", "repo-rust"), ("docs", ".md", "repo-md")]:
        for dirpath, _, names in os.walk(os.path.join(root, sub)):
            files += [(os.path.join(dirpath, n), kind) for n in names if n.endswith(ext)]
    files += [(os.path.join(root, "README.md"), "repo-md"), (os.path.join(root, "sim", "README.md"), "repo-md")]
    rows = []
    for path, kind in sorted(files):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if len(text.encode()) > MAX_BYTES:
            text = text.encode()[:MAX_BYTES].decode("utf-8", "ignore")
            text = text[: text.rfind("\n") + 1]
        if len(text.encode()) < MIN_BYTES:
            continue
        rel = os.path.relpath(path, root).replace(os.sep, "__")
        dst = os.path.join(out, kind, rel + ".txt")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w", encoding="utf-8") as f:
            f.write(text)
        rows.append((dst, kind, kind, len(text.encode())))
    return rows


def write_manifest(out, rows):
    with open(os.path.join(out, "manifest.tsv"), "w", encoding="utf-8") as f:
        f.write("path\tkind\tsubkind\tbytes\n")
        for r in rows:
            f.write("\t".join(map(str, r)) + "\n")
    print(f"wrote {len(rows)} samples to {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--per-kind", type=int, default=48)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--from-repo", metavar="ROOT", help="write the control corpus from ROOT instead")
    args = ap.parse_args()
    if args.from_repo:
        write_manifest(args.out, from_repo(args.from_repo, args.out))
        return
    rng = random.Random(args.seed)

    def size():
        return int(math.exp(rng.uniform(math.log(MIN_BYTES), math.log(MAX_BYTES))))

    code_pieces = {
        "python": lambda r, first: py_piece(r),
        "rust": lambda r, first: rs_piece(r),
        "typescript": lambda r, first: ts_piece(r),
    }
    rows = []
    for kind in ["code", "prose", "traceback", "tools"]:
        os.makedirs(os.path.join(args.out, kind), exist_ok=True)
        for i in range(args.per_kind):
            target = size()
            if kind == "code":
                sub = ["python", "rust", "typescript"][i % 3]
                text = build(rng, target, code_pieces[sub], "\n\n")
            elif kind == "prose":
                sub = "tutoring"
                text = build(rng, target, lambda r, first: prose_paragraph(r), "\n\n")
            elif kind == "traceback":
                text = build(rng, target, traceback_piece, "\n")
                sub = "chained" if "exception occurred" in text or "direct cause" in text else "single"
            else:
                sub = ["compact", "pretty"][i % 2]
                text = tools_sample(rng, target, sub == "pretty")
            path = os.path.join(args.out, kind, f"{sub}-{i:03}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            rows.append((path, kind, sub, len(text.encode())))
    write_manifest(args.out, rows)


if __name__ == "__main__":
    main()
