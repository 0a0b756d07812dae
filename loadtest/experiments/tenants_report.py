"""The summary of loadtest/experiments/tenants.sh: OUT/summary.md."""
import json
import sys

out, parts, budget, b_rate, phase_s, speed, fair_b_rate, fair_speed = sys.argv[1:]
parts = parts.split(",")
budget = int(budget)
lines = ["# Tenants across two replicas (one Redis)", "",
         "`loadtest/experiments/tenants.sh` (two gateway replicas, one Redis quota, one simulated "
         "vLLM: llama-3.1-8b-h100 profile, `--long-prefill-token-threshold 512`; the seed mix, "
         f"open loop, {phase_s} s per run).", ""]


def res(name):
    return json.load(open(f"{out}/{name}/results.json"))


def served(r):
    return sum(c["ok"] for c in r["classes"].values())


if "budget" in parts:
    samples = [tuple(map(float, l.split())) for l in open(f"{out}/a-alone-tokens.tsv")
               if len(l.split()) == 2]
    worst = 0
    for i, (t0, n0) in enumerate(samples):
        for t1, n1 in samples[i + 1:]:
            if t1 - t0 > 60.0:
                break
            worst = max(worst, n1 - n0)
    alone, both, a = res("b-alone"), res("both-b"), res("a-alone")
    lines += ["## Token budget", "",
              f"School A: `tokens_per_minute = {budget}`, offered 10x that; B: {b_rate} requests/s, "
              f"no budget; simulator speed {speed}.", "",
              f"- **A's tokens in any 60 s, counted by the simulator** (A alone; prompt + "
              f"generation counters read every second): max {worst:,.0f} against the budget "
              f"{budget:,} ({worst / budget:.3f}x).",
              f"- A alone: {a['requests']} sent, {served(a)} served, errors by code "
              f"{json.dumps(a['errors_by_code'])}.",
              f"- With A: B sent {both['requests']}, served {served(both)}, errors "
              f"{json.dumps(both['errors_by_code'])} (alone: {alone['requests']} sent, "
              f"{served(alone)} served).", "",
              "| B's small TTFT | alone | with A at 10x its budget | ratio |",
              "|---|---:|---:|---:|"]
    for k in ["ttft_p50_s", "ttft_p95_s", "ttft_p99_s"]:
        x = (alone["classes"].get("small") or {}).get(k)
        y = (both["classes"].get("small") or {}).get(k)
        if x and y:
            lines.append(f"| {k[5:8]} | {x:.3f} s | {y:.3f} s | {y / x:.2f}x |")
    lines.append("")


def service_series(name):
    """Per whole second since the earlier start: the tenant's served tokens (prompt + output of
    completed requests, credited at completion), and the run's start (epoch s)."""
    r = res(name)
    start = float(open(f"{out}/{name}.started").read())
    done = []
    for rec in r["records"]:
        if rec.get("status") != "ok" or rec.get("e2e_s") is None:
            continue
        tokens = (rec.get("prompt_tokens") or 0) + rec["output_tokens"]
        done.append((start + rec["start_s"] + rec["e2e_s"], tokens))
    return start, done


def jain(xs):
    s = sum(xs)
    return s * s / (len(xs) * sum(x * x for x in xs)) if any(xs) else None


if "fairness" in parts:
    lines += ["## Fairness across the fleet", "",
              f"School A sends 10x school B's load through replica 1 only; B sends "
              f"{fair_b_rate} requests/s (about 0.8 of the engine) through both replicas in turn; "
              f"simulator speed {fair_speed}. Service: prompt + output tokens of each tenant's "
              "completed requests (the clients' own records), credited at completion. Counted "
              "from 30 s after the start to the end of the sending (both backlogged), in 10 s "
              "windows.", "",
              "| `auth.fleet_fairness` | A's service | B's service | A / B | Jain's index (whole "
              "period) | Jain's index, worst 10 s window | largest gap since the start of the "
              "period, tokens | gap at the end |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in ["false", "true"]:
        sa, da = service_series(f"fair-{mode}-a")
        sb, db = service_series(f"fair-{mode}-b")
        t0 = max(sa, sb) + 30.0
        t1 = min(sa, sb) + float(phase_s)
        windows = []
        gap_max, gap = 0.0, 0.0
        t = t0
        while t < t1:
            xa = sum(n for at, n in da if t0 <= at < t + 1)
            xb = sum(n for at, n in db if t0 <= at < t + 1)
            gap = xa - xb
            gap_max = max(gap_max, abs(gap))
            t += 1.0
        t = t0
        while t + 10 <= t1:
            wa = sum(n for at, n in da if t <= at < t + 10)
            wb = sum(n for at, n in db if t <= at < t + 10)
            windows.append(jain([wa, wb]))
            t += 10.0
        ta = sum(n for at, n in da if t0 <= at < t1)
        tb = sum(n for at, n in db if t0 <= at < t1)
        worst = min((w for w in windows if w is not None), default=None)
        lines.append(f"| {mode} | {ta:,} | {tb:,} | {ta / max(tb, 1):.2f} | "
                     f"{jain([ta, tb]) or 0:.3f} | {worst or 0:.3f} | {gap_max:,.0f} | {gap:,.0f} |")
    lines.append("")

open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
