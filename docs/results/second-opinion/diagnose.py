"""Reads diagnose.sh's folders (diag/*/): per lane, the gateway's requests (all of the run,
warm-up included), their mean prompt and output tokens and time to first token at p50/p95/p99
(the gateway's own, from its arrival); and from the simulator's last 4,096 steps, how often all
96 seats were taken and how often requests waited for one.

    python3 diagnose.py diag/one-1-fifo diag/two-1-fifo ...
"""
import json
import sys


def nearest_rank(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    rank = max(1, min(len(values), int(-(-q * len(values) // 1))))
    return values[rank - 1]


def main(folders):
    print("| run | lane | requests | prompt tokens | output tokens | TTFT p50 s | p95 s | p99 s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    seats = []
    for folder in folders:
        lines = [json.loads(l) for l in open(f"{folder}/request-log.jsonl") if l.startswith("{")]
        by_lane = {}
        for r in lines:
            by_lane.setdefault(r["lane"], []).append(r)
        for lane in ("small", "medium", "large"):
            rs = by_lane.get(lane, [])
            if not rs:
                continue
            ttft = [(r["timings"]["time_to_first_token_ms"] or 0) / 1000 for r in rs]
            mean = lambda key: sum(r[key] or 0 for r in rs) / len(rs)
            print(f"| {folder} | {lane} | {len(rs)} | {mean('input_tokens'):.0f} | "
                  f"{mean('output_tokens'):.0f} | {nearest_rank(ttft, .50):.3f} | "
                  f"{nearest_rank(ttft, .95):.3f} | {nearest_rank(ttft, .99):.3f} |")
        steps = json.load(open(f"{folder}/steps-end.json"))
        full = sum(s["running"] >= 96 for s in steps) / len(steps)
        waiting = sum(s["waiting"] > 0 for s in steps) / len(steps)
        seats.append((folder, len(steps), full, waiting, max(s["waiting"] for s in steps)))
    print()
    print("| run | steps | all 96 seats taken | requests waiting for a seat | most waiting |")
    print("|---|---:|---:|---:|---:|")
    for folder, n, full, waiting, most in seats:
        print(f"| {folder} | {n} | {full:.1%} | {waiting:.1%} | {most} |")


if __name__ == "__main__":
    main(sys.argv[1:])
