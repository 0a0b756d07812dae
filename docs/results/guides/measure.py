#!/usr/bin/env python3
"""Measure xgrammar compile time and per-token mask-fill time for structured-output guides.

Usage:
  measure.py                -> runs every guide in its own subprocess (timeout 60 s each), prints table
  measure.py --guide NAME   -> child mode: measure one guide, print one JSON line
  measure.py --only 'A;;B'     -> parent mode restricted to some guides

CPU only, 2 threads (GrammarCompiler max_threads=2), compiler cache disabled,
fresh GrammarCompiler per compile.
"""
import json, os, random, subprocess, sys, time, statistics, warnings, importlib.metadata as md

VOCAB_TARGET = 128000
MAX_STEPS = 2000
CHILD_TIMEOUT_S = 60

# ----------------------------------------------------------------------------------------------
# Synthetic BPE-like vocabulary
# ----------------------------------------------------------------------------------------------
COMMON = """the of and to in is was for that on as with by he at from his it an were are which
this be or has had not but first one their its new after who they have two her she been other
when there all during into school time may years more most only over city some world would where
later up such used many can state about national out known university united then made also
than between while under both season three through american team part game county well film
found back became area north south east west high government before year group because number
same people john each international second day these series since early album music war
known being include including however system company work life name called way based public
answer value result data error status message type items list key true false null object array
string integer number boolean question response text content user assistant model json schema
field property required description title example format date email id code price total count
""".split()
ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "v",
          "w", "y", "z", "bl", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gl", "gr", "pl", "pr", "sc",
          "sh", "sk", "sl", "sm", "sn", "sp", "st", "str", "sw", "th", "tr", "wh"]
NUCLEI = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oa", "oo", "ou", "y"]
CODAS = ["", "", "b", "ck", "d", "ft", "g", "l", "ll", "m", "n", "nd", "ng", "nt", "p", "r", "rd",
         "rt", "s", "ss", "st", "t", "x", "tion", "ing", "ed", "er", "ly", "ment", "ness", "able"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
JSON_PIECES = ['":', '{"', '",', '":"', '"}', '["', '"]', '},', '},{', '"},', '"}]', '": "', '", "',
               ' "', '":{', '":[', '{\n', '}\n', '\n}', ',\n', '": ', '":"', '"],', '"]}', '}}', ']}',
               '}]', '[{', '[{"', '{"answer', '{"answer":', '"answer"', 'answer":', '", "answer',
               '\\n', '\\"', '\\\\', '\\u', 'null', 'true', 'false', ' null', ' true', ' false',
               '{}', '[]', '":[]', '":{}', '"\n', '",\n', ' {', ' [', ' }', ' ]', '"]\n']
STOP = "<|end_of_text|>"


def build_vocab(target=VOCAB_TARGET, seed=0):
    rng = random.Random(seed)
    toks, seen = [], set()

    def add(x):
        b = x.encode("utf-8") if isinstance(x, str) else x
        if b and b not in seen:
            seen.add(b)
            toks.append(b)

    for i in range(256):                                  # all single bytes (byte-level BPE base)
        add(bytes([i]))
    for i in range(1000):                                 # 0..999 (Llama-3 style digit chunks)
        add(str(i)); add(f"{i:02d}"); add(f"{i:03d}")
    for p in JSON_PIECES:
        add(p)
    for k in range(1, 65):                                # whitespace runs
        add(" " * k); add("\n" + " " * k)
    for k in range(1, 17):
        add("\t" * k); add("\n" + "\t" * k); add("\n" * k)
    for a in PUNCT:                                       # punctuation runs
        for b in PUNCT:
            add(a + b)
        for k in range(3, 9):
            add(a * k)
    for a in PUNCT:
        add(" " + a)
    for w in COMMON:                                      # real common words, 4 variants each
        for v in (w, " " + w, w.capitalize(), " " + w.capitalize()):
            add(v)
    # letter runs that a real BPE vocab has (e.g. "aa", "aaa"), limited to short ones
    for c in "abcdefghijklmnopqrstuvwxyz":
        for k in range(2, 5):
            add(c * k)
    # pseudo-English sub-words from syllables, with/without leading space and capitalisation
    while len(toks) < target - 1:
        nsyl = rng.choice([1, 1, 2, 2, 2, 3])
        w = "".join(rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS) for _ in range(nsyl))
        r = rng.random()
        if r < 0.45:
            w = " " + w
        elif r < 0.55:
            w = " " + w.capitalize()
        elif r < 0.60:
            w = w.capitalize()
        add(w)
    add(STOP)
    return toks[:target]


# ----------------------------------------------------------------------------------------------
# Guides and valid instances
# ----------------------------------------------------------------------------------------------
def words_text(n_chars, rng):
    out = []
    L = 0
    while L < n_chars:
        w = rng.choice(COMMON)
        out.append(w)
        L += len(w) + 1
    s = " ".join(out)
    return s[:n_chars]


def obj(prop_schema):
    return {"type": "object", "properties": {"answer": prop_schema}, "required": ["answer"]}


def anyof_flat(n, kw):
    alts = [{"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
            for i in range(n)]
    return obj({kw: alts})


def anyof_nested(depth):
    s = {"type": "string"}
    for d in range(depth):
        s = {"anyOf": [{"type": "object", "properties": {"v": s}, "required": ["v"]},
                       {"type": "integer"}]}
    return obj(s)


def nested_instance(depth, leaf):
    v = leaf
    for _ in range(depth):
        v = {"v": v}
    return {"answer": v}


def guides():
    rng = random.Random(1)
    G = []  # (name, kind, guide, instance_text)

    def J(name, schema, inst):
        G.append((name, "json", schema, json.dumps(inst)))

    def R(name, regex, text):
        G.append((name, "regex", regex, text))

    J("baseline", obj({"type": "string"}), {"answer": words_text(4096, rng)})
    for n in (64, 128, 256, 512, 1024, 4096, 100000):
        J(f"maxLength={n}", obj({"type": "string", "maxLength": n}),
          {"answer": words_text(min(n, 20000), rng)})
    J("minLength=1000", obj({"type": "string", "minLength": 1000}), {"answer": words_text(4096, rng)})
    J("array(noBound)", obj({"type": "array", "items": {"type": "string"}}),
      {"answer": [rng.choice(COMMON) for _ in range(1000)]})
    for n in (10, 100, 128, 129, 200, 1000, 100000):
        J(f"array maxItems={n}", obj({"type": "array", "items": {"type": "string"}, "maxItems": n}),
          {"answer": [rng.choice(COMMON) for _ in range(min(n, 1000))]})
    J("array minItems=100", obj({"type": "array", "items": {"type": "string"}, "minItems": 100}),
      {"answer": [rng.choice(COMMON) for _ in range(1000)]})
    J("array minItems=1000", obj({"type": "array", "items": {"type": "string"}, "minItems": 1000}),
      {"answer": [rng.choice(COMMON) for _ in range(1000)]})
    for n in (2, 8, 32):
        J(f"anyOf x{n}", anyof_flat(n, "anyOf"), {"answer": {f"k{n-1}": words_text(2000, rng)}})
    for n in (2, 8, 32):
        J(f"oneOf x{n}", anyof_flat(n, "oneOf"), {"answer": {f"k{n-1}": words_text(2000, rng)}})
    for d in (3, 10):
        J(f"anyOf nest depth={d}", anyof_nested(d), nested_instance(d, words_text(2000, rng)))
    R("regex [a-z]+ (ref)", "[a-z]+", "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(4096)))
    R("regex a{1,64}", "a{1,64}", "a" * 64)
    for n in (64, 128, 129, 256, 1024):
        R(f"regex [a-z]{{1,{n}}}", f"[a-z]{{1,{n}}}", "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)))
    R("regex [a-z]{1,4096}", "[a-z]{1,4096}", "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(4096)))
    R("regex (ab|cd){0,1000}", "(ab|cd){0,1000}", "".join(rng.choice(["ab", "cd"]) for _ in range(1000)))
    R("regex (ab|cd){0,100000}", "(ab|cd){0,100000}", "".join(rng.choice(["ab", "cd"]) for _ in range(4000)))
    J("pattern ^[a-z]{1,10000}$", obj({"type": "string", "pattern": "^[a-z]{1,10000}$"}),
      {"answer": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10000))})
    for n in (16, 32, 64, 128, 129, 200, 1000):
        J(f"pattern ^[a-z]{{1,{n}}}$", obj({"type": "string", "pattern": f"^[a-z]{{1,{n}}}$"}),
          {"answer": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))})
    J("pattern ^[a-z]+$ (ref)", obj({"type": "string", "pattern": "^[a-z]+$"}),
      {"answer": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(4000))})
    J("pattern ^[a-z]{1,300}$", obj({"type": "string", "pattern": "^[a-z]{1,300}$"}),
      {"answer": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(300))})
    J("pattern ^[a-z]{1,100}$", obj({"type": "string", "pattern": "^[a-z]{1,100}$"}),
      {"answer": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(100))})
    enum_vals = [f"option_{i}_{rng.choice(COMMON)}" for i in range(1000)]
    J("enum x1000", obj({"enum": enum_vals}), {"answer": enum_vals[-1]})
    return G


# ----------------------------------------------------------------------------------------------
# Child: measure one guide
# ----------------------------------------------------------------------------------------------
def greedy_tokenize(text_b, tok2id, maxlen):
    ids, i = [], 0
    while i < len(text_b):
        for L in range(min(maxlen, len(text_b) - i), 0, -1):
            t = tok2id.get(text_b[i:i + L])
            if t is not None:
                ids.append(t)
                i += L
                break
    return ids


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def child(name):
    import xgrammar as xgr
    import torch
    torch.set_num_threads(2)
    wlog = []
    warnings.simplefilter("always")
    old_show = warnings.showwarning
    warnings.showwarning = lambda m, c, f, l, file=None, line=None: wlog.append(f"{c.__name__}: {m}")

    vocab = build_vocab()
    stop_id = len(vocab) - 1
    t0 = time.perf_counter()
    ti = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=[stop_id])
    ti_ms = (time.perf_counter() - t0) * 1e3
    tok2id = {b: i for i, b in enumerate(vocab)}
    maxlen = max(len(b) for b in vocab)

    g = {n: (k, gd, inst) for n, k, gd, inst in guides()}[name]
    kind, guide, inst = g
    guide_str = json.dumps(guide) if kind == "json" else guide

    def compile_once():
        comp = xgr.GrammarCompiler(ti, max_threads=2, cache_enabled=False)
        t = time.perf_counter()
        cg = comp.compile_json_schema(guide_str) if kind == "json" else comp.compile_regex(guide_str)
        return (time.perf_counter() - t) * 1e3, cg

    times = []
    ms, cg = compile_once()
    times.append(ms)
    # repeat (fresh compiler each time) while cheap, report the median
    while len(times) < 3 and sum(times) < 3000:
        ms, cg = compile_once()
        times.append(ms)
    compile_ms = statistics.median(times)
    # report compile result immediately, so a fill walk killed by the 60 s timeout still leaves it
    print("COMPILE " + json.dumps(dict(name=name, compile_ms=round(compile_ms, 2),
                                       compile_runs=[round(x, 1) for x in times])), flush=True)

    m = xgr.GrammarMatcher(cg)
    bm = xgr.allocate_token_bitmask(1, ti.vocab_size)
    ids = greedy_tokenize(inst.encode(), tok2id, maxlen)
    ids = ids[:MAX_STEPS]
    nsteps = len(ids) + 1
    # repeat short walks (matcher.reset()) so that every guide gets >= ~1500 fill samples (>= 3 walks, stop after 20 s)
    walks = max(3, min(60, -(-1500 // nsteps)))
    t_walk0 = time.perf_counter()
    per_step = [[] for _ in range(nsteps)]
    accs = []
    states = []
    first_fill = None
    truncated = False
    for w in range(walks):
        if w:
            if time.perf_counter() - t_walk0 > 20:
                walks = w
                break
            m.reset()
        pos = 0
        for step in range(nsteps):
            if time.perf_counter() - t_walk0 > 25:   # very slow fills: stop walking, keep what we have
                truncated = True
                break
            t = time.perf_counter_ns()
            m.fill_next_token_bitmask(bm)
            dt = (time.perf_counter_ns() - t) / 1e3
            if first_fill is None:
                first_fill = dt
            per_step[step].append(dt)
            if w == 0:
                states.append(pos)
            if step == len(ids):
                break
            tid = ids[step]
            if w == 0:  # sanity: the token must be allowed by the mask we just computed
                word = int(bm[0, tid // 32].item()) & 0xFFFFFFFF
                if not (word >> (tid % 32)) & 1:
                    raise RuntimeError(f"mask disallows token {tid} {vocab[tid]!r} at step {step}")
            t = time.perf_counter_ns()
            ok = m.accept_token(tid)
            accs.append((time.perf_counter_ns() - t) / 1e3)
            if not ok:
                raise RuntimeError(f"token {tid} {vocab[tid]!r} rejected at step {step}, "
                                   f"prefix={inst.encode()[:pos][-60:]!r}")
            pos += len(vocab[tid])
    per_step = [xs for xs in per_step if xs]
    nsteps = len(per_step)
    states = states[:nsteps]
    fills = [x for xs in per_step for x in xs]
    n_allowed_end = int(sum(bin(int(x) & 0xFFFFFFFF).count("1") for x in bm[0].tolist()))
    step_med = [statistics.median(xs) for xs in per_step]
    worst = max(range(1, nsteps), key=lambda i: step_med[i]) if nsteps > 1 else 0
    ib = inst.encode()
    wpos = states[worst]
    res = dict(
        name=name, kind=kind, guide_bytes=len(guide_str.encode()), instance_bytes=len(ib),
        walked_bytes=pos, steps=nsteps, samples=len(fills), tokenizerinfo_ms=round(ti_ms, 1),
        compile_ms=round(compile_ms, 2), compile_runs=[round(x, 1) for x in times],
        compiled_mem_bytes=cg.memory_size_bytes,
        fill_med_us=round(statistics.median(fills), 2), fill_p99_us=round(pct(fills, 99), 2),
        fill_max_us=round(max(fills), 2), fill_first_us=round(first_fill, 2), walks=walks, walk_truncated_at_25s=truncated,
        worst_step_med_us=round(step_med[worst], 2),
        fill_mean_us=round(statistics.mean(fills), 2),
        fill_med_head200_us=round(statistics.median(step_med[1:201]), 2) if nsteps > 1 else None,
        fill_med_tail200_us=round(statistics.median(step_med[-200:]), 2),
        accept_med_us=round(statistics.median(accs), 2) if accs else None,
        worst_step=worst, worst_pos=wpos, worst_ctx=ib[max(0, wpos - 30):wpos].decode("utf-8", "replace"),
        n_allowed_at_end=n_allowed_end, completed=m.is_completed() if hasattr(m, "is_completed") else None,
        py_warnings=wlog,
    )
    print("RESULT " + json.dumps(res), flush=True)


# ----------------------------------------------------------------------------------------------
# Parent
# ----------------------------------------------------------------------------------------------
def parent(only=None):
    import xgrammar  # noqa: F401 (version check only)
    print(f"xgrammar {md.version('xgrammar')}  torch {md.version('torch')}  python {sys.version.split()[0]}")
    v = build_vocab()
    import collections
    print(f"vocab: {len(v)} distinct byte strings; max len {max(map(len, v))}; "
          f"with leading space {sum(1 for b in v if b[:1] == b' ')}")
    rows = []
    for name, kind, guide, inst in guides():
        if only and name not in only:
            continue
        gs = json.dumps(guide) if kind == "json" else guide
        t0 = time.time()
        try:
            p = subprocess.run(["timeout", "-s", "KILL", str(CHILD_TIMEOUT_S), sys.executable, __file__, "--guide", name],
                               capture_output=True, text=True)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except Exception as e:  # pragma: no cover
            out, err, rc = "", repr(e), -1
        wall = time.time() - t0
        res = None
        comp = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
            if line.startswith("COMPILE "):
                comp = json.loads(line[8:])
        if comp and not res:
            print(f"(compile finished: {comp}; fill walk did not finish)")
            errtail = (errtail + "\n" if errtail else "") + f"COMPILED in {comp['compile_ms']} ms, killed during fill walk"
        
        errtail = "\n".join(l for l in err.strip().splitlines()[-6:])
        print(f"\n=== {name}  (rc={rc}, wall {wall:.1f}s, guide {len(gs.encode())} B)")
        if res:
            print(json.dumps(res))
        if errtail:
            print("STDERR:", errtail)
        rows.append((name, len(gs.encode()), res, rc, wall, errtail))
    base = next((r for n, _, r, *_ in rows if n == "baseline" and r), None)
    print("\n\n| guide | JSON/regex bytes | compile ms | fill median µs | fill p99 µs | worst step (median µs, state) | compile x base | fill-med x base | fill-p99 x base | notes |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for name, gb, r, rc, wall, err in rows:
        if not r:
            note = "> 60 s (killed)" if rc in (137, -9, 124) else f"failed rc={rc}: {err.splitlines()[-1] if err else ''}"
            if "COMPILED in" in (err or ""):
                note = err.splitlines()[-1]
            print(f"| {name} | {gb} | {'> 60 s' if note == '> 60 s (killed)' else note.split()[2] if 'COMPILED' in note else '-'} | - | - | - | - | - | - | {note} |")
            continue
        cb = r["compile_ms"] / base["compile_ms"] if base else float("nan")
        fb = r["fill_med_us"] / base["fill_med_us"] if base else float("nan")
        pb = r["fill_p99_us"] / base["fill_p99_us"] if base else float("nan")
        ctx = r["worst_ctx"][-14:].replace("|", "/").replace("\n", "\\n")
        notes = []
        if r["py_warnings"]:
            notes.append("warn: " + "; ".join(r["py_warnings"])[:80])
        if r.get("walk_truncated_at_25s"):
            notes.append("walk stopped at 25 s")
        if err:
            notes.append("stderr: " + err.splitlines()[-1][:160])
        notes.append(f"{r['steps']} steps x{r['walks']}; first fill {r['fill_first_us']:.0f} µs; "
                     f"med first/last 200 steps {r['fill_med_head200_us']}/{r['fill_med_tail200_us']} µs")
        print(f"| {name} | {gb} | {r['compile_ms']:.1f} | {r['fill_med_us']:.1f} | {r['fill_p99_us']:.1f} | "
              f"{r['worst_step_med_us']:.0f} @step {r['worst_step']} …`{ctx}` | {cb:.2f} | {fb:.2f} | {pb:.2f} | {'; '.join(notes)} |")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--guide":
        child(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "--only":
        parent(set(sys.argv[2].split(";;")))
    else:
        parent()
