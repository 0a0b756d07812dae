"""The ten seeds of the open-loop headline cell (load 0.9, engine seed-lpt512) side by side:
seeds 1-3 from ../load-0.9/summary.json, 4-10 from this folder's runs. Per seed, the questions'
TTFT p95/p99 under floor, FIFO and lanes, lanes' ratios to FIFO, to the floor and to the engine
bound of its own steps, the reviews' end to end and the tokens per second against FIFO's; then
the median (min-max) of each column. Run: python3 ten_seeds.py
"""
import json
import statistics

FILES = ["../load-0.9/summary.json", "seeds-4-7-fifo.json", "seeds-4-7-floor-lanes.json",
         "seeds-8-10.json"]


def main():
    runs = {}
    for f in FILES:
        load = json.load(open(f))["engines"]["seed-lpt512"]["loads"][0]
        for preset, v in load["presets"].items():
            for r in v["per_seed"]:
                runs[(preset, r["seed"])] = r
    seeds = sorted({s for (_, s) in runs})
    small = lambda p, s, q: runs[(p, s)]["classes"]["small"][f"ttft_{q}_s"]
    columns = {
        "medium / large offered": lambda s: "{} / {}".format(
            runs[("fifo", s)]["classes"]["medium"]["offered"],
            runs[("fifo", s)]["classes"]["large"]["offered"]),
        "floor p95 s": lambda s: small("floor", s, "p95"),
        "FIFO p95 s": lambda s: small("fifo", s, "p95"),
        "lanes p95 s": lambda s: small("lanes", s, "p95"),
        "FIFO p99 s": lambda s: small("fifo", s, "p99"),
        "lanes p99 s": lambda s: small("lanes", s, "p99"),
        "lanes/FIFO p95": lambda s: small("lanes", s, "p95") / small("fifo", s, "p95"),
        "lanes/FIFO p99": lambda s: small("lanes", s, "p99") / small("fifo", s, "p99"),
        "lanes x floor p95": lambda s: small("lanes", s, "p95") / small("floor", s, "p95"),
        "lanes x floor p99": lambda s: small("lanes", s, "p99") / small("floor", s, "p99"),
        "lanes x engine bound p99": lambda s: small("lanes", s, "p99")
        / runs[("lanes", s)]["engine_bound"]["p99_s"],
        "reviews e2e p95 lanes/FIFO": lambda s: runs[("lanes", s)]["classes"]["large"]["e2e_p95_s"]
        / runs[("fifo", s)]["classes"]["large"]["e2e_p95_s"],
        "tok/s lanes/FIFO": lambda s: runs[("lanes", s)]["tokens_per_s"]
        / runs[("fifo", s)]["tokens_per_s"],
    }
    print("| seed | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    values = {c: [] for c in columns}
    for s in seeds:
        cells = []
        for c, f in columns.items():
            v = f(s)
            if isinstance(v, float):
                values[c].append(v)
                cells.append(f"{v:.3f}")
            else:
                cells.append(v)
        print(f"| {s} | " + " | ".join(cells) + " |")
    cells = []
    for c in columns:
        v = values[c]
        cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else "")
    print("| median (min-max) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
