#!/usr/bin/env python3
"""Prints the side-by-side table of ab.sh's runs: per seed, the autopilot with the window fix
over the one without (questions' TTFT p95 and p99, p99 over the run's own engine bound,
reviews' and medium requests' end to end p95, prompt+output tokens/s), and the knob changes
each run made. Usage: ab_table.py OUTDIR [BASE ARM] (ab.sh's; default: nofix fix)."""
import json
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ab"
base, arm_b = sys.argv[2:4] if len(sys.argv) > 3 else ("nofix", "fix")


def run(arm, seed):
    with open(f"{out}/{arm}/seed{seed}/summary.json") as f:
        d = json.load(f)
    (engine,) = d["engines"].values()
    return engine["loads"][0]["presets"]["autopilot"]["per_seed"][0]


def figures(r):
    c = r["classes"]
    states = [
        (t["prefill_budget"], t["large_seats"], t["piece_tokens"], t["small_seats"])
        for t in r["autopilot_trace"]
    ]
    return {
        "small p95": c["small"]["ttft_p95_s"],
        "small p99": c["small"]["ttft_p99_s"],
        "p99 x bound": c["small"]["ttft_p99_s"] / r["engine_bound"]["p99_s"],
        "reviews e2e p95": c["large"]["e2e_p95_s"],
        "medium e2e p95": c["medium"]["e2e_p95_s"],
        "tok/s": r["tokens_per_s"],
        "changes": sum(a != b for a, b in zip(states, states[1:])),
        "within objective": r["small_within_objective"],
        "reviews done": f'{c["large"]["completed"]}/{c["large"]["offered"]}',
    }


rows = {(arm, s): figures(run(arm, s)) for arm in (base, arm_b) for s in (1, 2, 3)}
keys = list(rows[(arm_b, 1)])
print("| seed | arm | " + " | ".join(keys) + " |")
print("|---|---|" + "---:|" * len(keys))
for s in (1, 2, 3):
    for arm in (base, arm_b):
        cells = [
            f"{v:.3f}" if isinstance(v, float) else str(v) for v in rows[(arm, s)].values()
        ]
        print(f"| {s} | {arm} | " + " | ".join(cells) + " |")
print()
for k in keys[:6]:
    ratios = [rows[(arm_b, s)][k] / rows[(base, s)][k] for s in (1, 2, 3)]
    print(
        f"{k}: {arm_b} / {base} {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )
