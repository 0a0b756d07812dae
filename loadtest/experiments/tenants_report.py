"""The summary of loadtest/experiments/tenants.sh: OUT/summary.md."""
import hashlib
import json
import sys

(out, parts, budget, b_rate, phase_s, speed, fair_b_rate, fair_speed, fair_settings,
 fair_seeds, fair_phase_s, *rest) = sys.argv[1:]
fair_modes = rest[0].split() if rest else ["false", "true"]
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


def field(tenant):
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


def counters(run, start, end):
    """From the Redis samples between start and end (epoch s): the largest gap between A's and
    B's counters where both waited, the share of samples where both waited, and the counters'
    growth over those samples."""
    fa, fb = field("school-a"), field("school-b")
    both, total = [], 0
    for line in open(f"{out}/{run}-fleet.jsonl"):
        s = json.loads(line)
        if not start <= s["t"] < end:
            continue
        total += 1
        now_ms = s["t"] * 1000
        waiting = {e.rsplit("|", 1)[1] for e, until in s["waiting"].items() if until >= now_ms}
        if fa in waiting and fb in waiting:
            both.append((s["service"].get(fa, 0.0), s["service"].get(fb, 0.0)))
    if not both:
        return None
    gaps = sorted(abs(a - b) for a, b in both)
    grown = (both[-1][0] - both[0][0], both[-1][1] - both[0][1])
    return gaps, len(both) / max(total, 1), grown


def largest(*names):
    return max((rec.get("prompt_tokens") or 0) + rec["output_tokens"]
               for n in names for rec in res(n)["records"] if rec.get("status") == "ok")


if "fairness" in parts:
    settings = {"a-one": "A through replica 1 only, B through both (the issue's)",
                "b-one": "A through both, B through replica 2 only (replica 1 sees A alone)"}
    lines += ["## Fairness across the fleet", "",
              f"School A sends 10x school B's load; B sends {fair_b_rate} requests/s (about 0.8 "
              f"of the engine); simulator speed {fair_speed}; {fair_phase_s} s of load per run, "
              "counted from 30 s after the start to the end of the sending; seeds "
              f"{fair_seeds} (B's sizes and arrivals drawn with the seed + 100).", "",
              "- **Counters**: the fleet's own counters in Redis (prompt + output tokens over "
              "the share, charged the reservation at admission and settled to the engine's count "
              "at the end; kept with `fleet_fairness` off too), sampled every 0.5 s with who "
              "waits where. *Largest gap* is the largest |A - B| at a sample where both waited; "
              "the bound is twice the largest request (prompt + output) plus the admissions "
              "of one 250 ms heartbeat elsewhere.",
              "- **Clients**: prompt + output tokens of each tenant's completed requests, from "
              "the load generators' own records, credited at completion; Jain's index over the "
              "period and its worst 10 s window.", ""]
    for setting in fair_settings.split(","):
        lines += [f"### {setting}: {settings.get(setting, setting)}", "",
                  "| `fleet_fairness` | seed | A / B (clients) | Jain (period) | Jain (worst 10 s) "
                  "| both waiting | counters' growth A / B | gap p50, tokens | largest gap, tokens "
                  "| largest gap / (2 x largest request) | samples within 2 x largest request "
                  "| heads that yielded |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for mode in fair_modes:
            for seed in fair_seeds.split():
                run = f"fair-{setting}-{mode}-s{seed}"
                sa, da = service_series(f"{run}-a")
                sb, db = service_series(f"{run}-b")
                t0 = max(sa, sb) + 30.0
                t1 = min(sa, sb) + float(fair_phase_s)
                windows = []
                t = t0
                while t + 10 <= t1:
                    wa = sum(n for at, n in da if t <= at < t + 10)
                    wb = sum(n for at, n in db if t <= at < t + 10)
                    windows.append(jain([wa, wb]))
                    t += 10.0
                ta = sum(n for at, n in da if t0 <= at < t1)
                tb = sum(n for at, n in db if t0 <= at < t1)
                worst = min((w for w in windows if w is not None), default=None)
                big = largest(f"{run}-a", f"{run}-b")
                c = counters(run, t0, t1)
                if c:
                    gaps, frac, (ga, gb) = c
                    within = sum(g <= 2 * big for g in gaps) / len(gaps)
                    counted = (f"{frac:.0%} | {ga / max(gb, 1):.2f} | "
                               f"{gaps[len(gaps) // 2]:,.0f} | {gaps[-1]:,.0f} | "
                               f"{gaps[-1] / (2 * big):.2f} | {within:.0%} |")
                else:
                    counted = "0% | - | - | - | - | - |"
                try:
                    yields = sum(float(l.split()[-1]) for l in open(f"{out}/{run}-yields.txt")
                                 if l.strip())
                except OSError:
                    yields = 0
                label = "FIFO (no tenants)" if mode == "fifo" else mode
                lines.append(f"| {label} | {seed} | {ta / max(tb, 1):.2f} | "
                             f"{jain([ta, tb]) or 0:.3f} | {worst or 0:.3f} | {counted} "
                             f"{yields:,.0f} |")
        lines.append("")

open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
