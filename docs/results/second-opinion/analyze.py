#!/usr/bin/env python3
"""Reads runs/<seed>-<preset>/ (written by run.sh) and prints the per-run figures and the
table of the report (median of seeds (min-max)) as Markdown; writes runs/analysis.json.

Window: guidellm's questions whose scheduled (Poisson) start falls in [t0 + WARMUP_S, t0 + RUN_S),
t0 = guidellm's first scheduled request. A question that did not complete counts as infinitely
late. TTFT "client": guidellm's own time_to_first_token_ms (request sent -> first token);
"from arrival": first token - scheduled start (guidellm's own sending lag included, as the
headline's tutor-load counts it); "gateway": the gateway's request log (arrival at the gateway
-> first token relayed). Reviews: tutor-load's large requests arriving in its window.
Tokens/s: every request the gateway completed, prompt tokens at its first token and output
tokens spread evenly from first token to end, the part inside the window, per second.
Usage: analyze.py [RUNS_DIR] [TAG]
"""
import glob, json, math, os, statistics, sys

RUNS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "runs")
TAG = sys.argv[2] if len(sys.argv) > 2 else ""
WARMUP_S, RUN_S = 60.0, 180.0
INF = math.inf


def q(v, p):
    """Nearest-rank quantile; inf when it falls among the incomplete."""
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, max(0, math.ceil(p * len(v)) - 1))]


M64 = (1 << 64) - 1


class SplitMix:
    """tutor-load's generator (wire/src/stats.rs), to redraw its open-loop schedule."""
    def __init__(self, seed):
        self.s = seed & M64

    def u64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def f64(self):
        return (self.u64() >> 11) / float(1 << 53)


def schedule(seed, rate, shares, until):
    """tutor-load run's Poisson arrivals (loadtest/src/arrivals.rs Stream, no waves):
    [(scheduled s, class index)] before `until`."""
    rng, at, out, total = SplitMix(seed), 0.0, [], sum(shares)
    while True:
        at += -math.log(1.0 - rng.f64()) / rate
        pick = rng.f64() * total
        ci = next((i for i, sh in enumerate(shares) if (pick := pick - sh) < 0), len(shares) - 1)
        if at >= until:
            return out
        out.append((at, ci))


def run_figures(d):
    params = dict(kv.split("=", 1) for kv in open(f"{d}/params.txt").read().split() if "=" in kv)
    g = json.load(open(f"{d}/guidellm.json"))["benchmarks"][0]
    reqs = [(r, True) for r in g["requests"]["successful"]]
    reqs += [(r, False) for k in ("incomplete", "errored") for r in (g["requests"][k] or [])]
    # guidellm 0.8.1 sometimes records the first requests of a worker with a targeted start
    # relative to its own start (seconds, not an epoch time); all of them were sent in the
    # first second, inside the warm-up, so they are left out (counted in "unplaced").
    placed = lambda r: r["info"]["timings"]["targeted_start"] >= 1e9
    stray = [r for r, _ in reqs if not placed(r)]
    reqs = [(r, ok) for r, ok in reqs if placed(r)]
    t0 = min(r["info"]["timings"]["targeted_start"] for r, _ in reqs)
    assert all(r["info"]["timings"]["request_start"] < t0 + WARMUP_S for r in stray)
    unplaced = len(stray)
    w0, w1 = t0 + WARMUP_S, t0 + RUN_S
    client, arrival, lag, n_in, n_fail = [], [], [], 0, 0
    for r, ok in reqs:
        t = r["info"]["timings"]
        if not (w0 <= t["targeted_start"] < w1):
            continue
        n_in += 1
        if ok and t.get("first_token_iteration"):
            client.append(r["time_to_first_token_ms"] / 1000)
            arrival.append(t["first_token_iteration"] - t["targeted_start"])
            lag.append(t["request_start"] - t["targeted_start"])
        else:
            n_fail += 1
            client.append(INF)
            arrival.append(INF)
    agg = g["metrics"]["time_to_first_token_ms"]["successful"]["percentiles"]
    out = {
        "preset": params["preset"], "seed": int(params["seed"]),
        "questions": n_in, "questions_failed": n_fail,
        "ttft_client": [q(client, p) for p in (.5, .95, .99)],
        "ttft_arrival": [q(arrival, p) for p in (.5, .95, .99)],
        "guidellm_agg_ms": [agg["p50"], agg["p95"], agg["p99"]],
        "send_lag_ms": [q(lag, .5) * 1000, q(lag, .99) * 1000],
        "q_rate_achieved": n_in / (RUN_S - WARMUP_S),
        "unplaced": unplaced,
    }
    # Gateway request log: questions (guidellm's, route chat_completions) and tokens/s.
    gw_ttft, tok, out_tok, bg_arrivals = [], 0.0, 0.0, []
    for line in open(f"{d}/request-log.jsonl"):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        tm = j["timings"]
        end = j["ts_ms"] / 1000
        arr = end - (tm.get("total_ms") or 0) / 1000
        if j["route"] == "answer":
            bg_arrivals.append(arr)
        if j["route"] == "chat_completions" and w0 <= arr < w1:
            f = tm.get("time_to_first_token_ms")
            gw_ttft.append(f / 1000 if f is not None and j["outcome"] == "ok" else INF)
        if j["outcome"] != "ok" or tm.get("time_to_first_token_ms") is None:
            continue
        ft = arr + tm["time_to_first_token_ms"] / 1000
        if w0 <= ft < w1:
            tok += j.get("input_tokens") or 0
        o = j.get("output_tokens") or 0
        if o and end > ft:
            inside = max(0.0, min(end, w1) - max(ft, w0)) / (end - ft)
            tok += o * inside
            out_tok += o * inside
    out["ttft_gateway"] = [q(gw_ttft, p) for p in (.5, .95, .99)]
    # When the background's first request reached the gateway, from guidellm's first arrival
    # (the two streams must overlap over the whole window; the 2026-12-06 run did not).
    out["bg_first_arrival_s"] = min(bg_arrivals) - t0 if bg_arrivals else None
    out["tokens_per_s"] = tok / (RUN_S - WARMUP_S)
    out["output_tokens_per_s"] = out_tok / (RUN_S - WARMUP_S)
    # Background: tutor-load's records (start_s from its start; window [warmup, warmup + window)).
    bgp = f"{d}/background/results.json"
    if os.path.exists(bgp):
        bg = json.load(open(bgp))
        # tutor-load before 2026-12-06 built each prompt (tokenizing it) in the request's task
        # before sending, so a request was sent late when the CPUs were busy (it now writes them
        # ahead and records each one's lag_s); a record's start_s is the send time.
        # Redraw the schedule, match each class's records to its last scheduled arrivals in
        # order, and count a request in the window by its scheduled time (the same requests for
        # every preset of a seed); lag = sent - scheduled.
        sc = open(f"{d}/background.toml").read()
        rate = float(sc.split("rate = ")[1].split()[0])
        shares = [float(x.split()[0]) for x in sc.split("share = ")[1:]]
        names = [x.split('"')[1] for x in sc.split("[[class]]")[1:] for x in [x.split("name = ")[1]]]
        sched = schedule(int(params["seed"]), rate, shares, RUN_S)
        lags = []
        for ci, cls in enumerate(names):
            sc_c = [t for t, c in sched if c == ci]
            got = sorted((r for r in bg["records"] if r["class"] == cls), key=lambda r: r["start_s"])
            pairs = list(zip(sc_c[len(sc_c) - len(got):], got)) if len(got) <= len(sc_c) else []
            lags += [r["start_s"] - t for t, r in pairs]
            rec = [r for t, r in pairs if WARMUP_S <= t < RUN_S]
            e2e = [r["e2e_s"] if r["status"] == "ok" and r["e2e_s"] is not None else INF for r in rec]
            out[cls] = {"offered": len(rec), "completed": sum(r["status"] == "ok" for r in rec),
                        "e2e_p50": q(e2e, .5), "e2e_p95": q(e2e, .95),
                        "errors": sorted({r.get("error") for r in rec if r["status"] != "ok"} - {None})}
        out["bg_send_lag_s"] = [q(lags, .5), q(lags, .95), max(lags) if lags else None]
        out["bg_errors_all"] = bg["errors"]
        out["bg_start_offset_s"] = float(open(f"{d}/background-start.txt").read()) - t0
    # Simulator: step lateness over the run (up to guidellm's end), and load average.
    try:
        lat = json.load(open(f"{d}/sim-engine.json"))["lateness"]
        out["sim_late_ms"] = [lat["p50_ms"], lat["p99_ms"], lat["max_ms"]]
    except (OSError, ValueError, KeyError):
        out["sim_late_ms"] = None
    la = [float(l.split()[1]) for l in open(f"{d}/loadavg.txt") if len(l.split()) > 1]
    out["loadavg1_mean"] = statistics.mean(la) if la else None
    out["loadavg1_max"] = max(la) if la else None
    return out


def fmt(x, nd=3):
    if x is None:
        return "-"
    if x == INF:
        return "inf"
    return f"{x:.{nd}f}"


def cell(vals, nd=3):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    m = statistics.median(vals) if INF not in vals else sorted(vals)[len(vals) // 2]
    lo, hi = min(vals), max(vals)
    return fmt(m, nd) if lo == hi else f"{fmt(m, nd)} ({fmt(lo, nd)}-{fmt(hi, nd)})"


runs = []
import re
for d in sorted(glob.glob(f"{RUNS}/*-*{TAG}")):
    if not re.fullmatch(r"\d+-(floor|fifo|lanes)" + re.escape(TAG), os.path.basename(d)):
        continue
    if not os.path.exists(f"{d}/guidellm.json"):
        continue
    try:
        runs.append(run_figures(d))
    except Exception as e:  # a broken run is reported, not fatal
        print(f"<!-- {d}: {e!r} -->")
json.dump(runs, open(f"{RUNS}/analysis{TAG}.json", "w"), indent=1, default=str)

print("## Per run\n")
print("| seed | preset | questions (failed) | q/s | guidellm TTFT p50 / p95 / p99 s | from arrival p95 | gateway-logged p95 | guidellm agg p95 ms | send lag p50 / p99 ms | large offered / done | large e2e p95 s | medium e2e p95 s | tok/s | sim late p50 / p99 / max ms | load avg mean (max) | bg start s | bg first arrival s | bg send lag p50 / p95 / max s |")
print("|---:|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|---:|---:|---|")
for r in sorted(runs, key=lambda r: (r["seed"], ["floor", "fifo", "lanes"].index(r["preset"]))):
    L, M = r.get("large", {}), r.get("medium", {})
    print(f"| {r['seed']} | {r['preset']} | {r['questions']} ({r['questions_failed']}) | {r['q_rate_achieved']:.2f} | "
          f"{' / '.join(fmt(x) for x in r['ttft_client'])} | {fmt(r['ttft_arrival'][1])} | {fmt(r['ttft_gateway'][1])} | "
          f"{r['guidellm_agg_ms'][1]:.0f} | {r['send_lag_ms'][0]:.1f} / {r['send_lag_ms'][1]:.1f} | "
          f"{L.get('offered', '-')} / {L.get('completed', '-')} | {fmt(L.get('e2e_p95'), 1)} | {fmt(M.get('e2e_p95'), 1)} | "
          f"{r['tokens_per_s']:.0f} | {' / '.join(fmt(x, 1) for x in (r['sim_late_ms'] or []))} | "
          f"{fmt(r['loadavg1_mean'], 1)} ({fmt(r['loadavg1_max'], 1)}) | {fmt(r.get('bg_start_offset_s'), 1)} | {fmt(r.get('bg_first_arrival_s'), 1)} | "
          f"{' / '.join(fmt(x, 2) for x in r.get('bg_send_lag_s') or [])} |")
stray = [f"{r['seed']}-{r['preset']} {r['unplaced']}" for r in runs if r.get("unplaced")]
if stray:
    print("\nLeft out as unplaced (guidellm recorded their targeted start relative, not as an epoch"
          " time; every one was sent inside the warm-up): " + ", ".join(stray) + " requests.")

by = {p: [r for r in runs if r["preset"] == p] for p in ("floor", "fifo", "lanes")}
print("\n## Median of seeds (min-max)\n")
print("| preset | seeds | guidellm question TTFT p50 s | p95 s | p99 s | TTFT from arrival p95 s | gateway-logged TTFT p95 s | large offered / completed | large e2e p95 s | medium e2e p95 s | prompt+output tok/s | output tok/s | sim late p99 ms | load avg |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for p, rs in by.items():
    if not rs:
        continue
    print(f"| {p} | {len(rs)} | " + " | ".join(cell([r['ttft_client'][i] for r in rs]) for i in range(3)) +
          f" | {cell([r['ttft_arrival'][1] for r in rs])} | {cell([r['ttft_gateway'][1] for r in rs])} | "
          f"{cell([r.get('large', {}).get('offered') for r in rs], 0)} / {cell([r.get('large', {}).get('completed') for r in rs], 0)} | "
          f"{cell([r.get('large', {}).get('e2e_p95') for r in rs], 1)} | {cell([r.get('medium', {}).get('e2e_p95') for r in rs], 1)} | "
          f"{cell([r['tokens_per_s'] for r in rs], 0)} | {cell([r['output_tokens_per_s'] for r in rs], 0)} | "
          f"{cell([(r['sim_late_ms'] or [None] * 3)[1] for r in rs], 1)} | {cell([r['loadavg1_mean'] for r in rs], 1)} |")

# Ratios per seed (same seed's runs), then the median (min-max) over seeds.
print("\n## Ratios (per seed, then median (min-max) of seeds)\n")
seeds = sorted({r["seed"] for r in runs})
get = lambda p, s: next((r for r in runs if r["preset"] == p and r["seed"] == s), None)
rows = []
for name, key in (("guidellm TTFT", "ttft_client"), ("TTFT from arrival", "ttft_arrival"), ("gateway-logged TTFT", "ttft_gateway")):
    for i, qn in enumerate(("p50", "p95", "p99")):
        lf, ll = [], []
        for s in seeds:
            fl, fi, la = get("floor", s), get("fifo", s), get("lanes", s)
            if la and fi and fi[key][i]:
                lf.append(la[key][i] / fi[key][i])
            if la and fl and fl[key][i]:
                ll.append(la[key][i] / fl[key][i])
        rows.append(f"| {name} {qn} | {cell(lf, 2)} | {cell(ll, 2)} |")
print("| figure | lanes / fifo | lanes / floor |\n|---|---:|---:|")
print("\n".join(rows))
le, lt = [], []
for s in seeds:
    fi, la = get("fifo", s), get("lanes", s)
    if fi and la and fi.get("large") and la.get("large"):
        le.append(la["large"]["e2e_p95"] / fi["large"]["e2e_p95"])
        lt.append(la["tokens_per_s"] / fi["tokens_per_s"])
print(f"| reviews e2e p95 | {cell(le, 2)} | - |")
print(f"| prompt+output tok/s | {cell(lt, 3)} | - |")
