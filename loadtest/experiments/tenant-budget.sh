#!/usr/bin/env bash
# Issue 34's token-budget check across replicas: two gateway replicas share one Redis quota (and
# with it one tenant-budget ledger) in front of one simulated vLLM. School A has
# `tokens_per_minute = BUDGET`; school B has no budget. Three phases, each a fresh open-loop run
# of the seed mix (loadtest/scenarios/seed-mix-open.toml) through both replicas in turn:
#
#   1. b-alone: B at B_RATE requests/s alone (its baseline);
#   2. a-alone: A at 10x its budget alone; the simulator's prompt + generation token counters,
#      read every second, give the tokens the engine served A in every 60 s window;
#   3. both: A at 10x its budget and B at B_RATE together: B's TTFT against phase 1.
#
# Writes OUT/summary.md (and each phase's tutor-load results). About 8 minutes.
#   loadtest/experiments/tenant-budget.sh [OUT]   (default target/tenant-budget)
# Env: BUDGET (tokens per minute, default 60000), B_RATE (default 4), PHASE_S (default 150),
#      SPEED (the simulator's, default 1). Needs redis-server (scripts/test installs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-target/tenant-budget}
BUDGET=${BUDGET:-60000}
B_RATE=${B_RATE:-4}
PHASE_S=${PHASE_S:-150}
SPEED=${SPEED:-1}
rm -rf "$OUT" && mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

cargo build --release -q -p tutor-gateway -p vllm-sim -p tutor-load
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(free_port)
SIM_PORT=$(free_port)
PORTS=("$(free_port)" "$(free_port)")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$OUT/redis.log" 2>&1 &
PIDS+=($!)
"$BIN/vllm-sim" --port "$SIM_PORT" --profile llama-3.1-8b-h100 --speed "$SPEED" \
  --long-prefill-token-threshold 512 --enable-prompt-tokens-details >"$OUT/sim.log" 2>&1 &
PIDS+=($!)

KEY_A=load-key-school-a
KEY_B=load-key-school-b
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
python3 - "$OUT/config.toml" "$REDIS_PORT" "$SIM_PORT" "$(sha $KEY_A)" "$(sha $KEY_B)" "$BUDGET" <<'EOF'
import re, sys
out, redis_port, sim_port, sha_a, sha_b, budget = sys.argv[1:]
text = open("config/config.toml").read()
def set_key(section, key, value):
    global text
    m = re.search(r"(?m)^\[" + re.escape(section) + r"\]\n", text)
    end = re.search(r"(?m)^\[", text[m.end():])
    body = text[m.end(): m.end() + end.start() if end else len(text)]
    new, n = re.subn(r"(?m)^" + key + r" = .*$", f"{key} = {value}", body, count=1)
    assert n == 1, (section, key)
    text = text[: m.end()] + new + text[m.end() + len(body):]
set_key("telemetry", "request_log", '"off"')
set_key("upstream", "base_url", f'"http://127.0.0.1:{sim_port}"')
set_key("quota", "backend", '"redis"')
set_key("quota", "redis_url", f'"redis://127.0.0.1:{redis_port}/0"')
set_key("auth", "enabled", "true")
set_key("auth", "keys", f'[{{sha256 = "{sha_a}", tenant = "school-a"}}, {{sha256 = "{sha_b}", tenant = "school-b"}}]')
text += f"\n[auth.tenants.school-a]\ntokens_per_minute = {budget}\n"
open(out, "w").write(text)
EOF
"$BIN/tutor-gateway" check-config "$OUT/config.toml" >/dev/null

wait_ok() { for _ in $(seq 1 $(($2 * 10))); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done; return 1; }
wait_ok "http://127.0.0.1:$SIM_PORT/health" 30
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
for i in 0 1; do
  "$BIN/tutor-gateway" serve --config "$OUT/config.toml" --listen "127.0.0.1:${PORTS[$i]}" \
    >"$OUT/replica$i.log" 2>&1 &
  PIDS+=($!)
  wait_ok "http://127.0.0.1:${PORTS[$i]}/readyz" 60
done
TARGETS=(--target "http://127.0.0.1:${PORTS[0]}" --target "http://127.0.0.1:${PORTS[1]}")

# A's offered rate: 10x its budget, in the seed mix's mean request (prompt + output).
A_RATE=$(python3 - "$BUDGET" <<'EOF'
import sys, tomllib
s = tomllib.load(open("loadtest/scenarios/seed-mix-open.toml", "rb"))
mean = sum(c["share"] * (c["input_tokens"] + c["output_tokens"]) for c in s["class"])
print(f"{10 * float(sys.argv[1]) / 60 / mean:.3f}")
EOF
)
scenario() { # rate -> file
  sed "s/^rate = .*/rate = $1/" loadtest/scenarios/seed-mix-open.toml >"$OUT/mix-$1.toml"
  echo "$OUT/mix-$1.toml"
}
load() { # name key rate
  "$BIN/tutor-load" run --scenario "$(scenario "$3")" --duration "${PHASE_S}s" --drain 60s \
    --progress 0 --api-key "$2" --out "$OUT/$1" "${TARGETS[@]}" >"$OUT/$1.stdout" 2>&1
}
tokens() { curl -fs "http://127.0.0.1:$SIM_PORT/metrics" \
  | awk '/^vllm:(prompt|generation)_tokens_total/ { n += $2 } END { printf "%d\n", n }'; }

echo "phase 1: B alone at $B_RATE/s" >&2
load b-alone "$KEY_B" "$B_RATE"
echo "phase 2: A alone at $A_RATE/s (10x its budget)" >&2
: >"$OUT/a-alone-tokens.tsv"
( while :; do echo "$(date +%s.%N) $(tokens)" >>"$OUT/a-alone-tokens.tsv"; sleep 1; done ) &
SAMPLER=$!
load a-alone "$KEY_A" "$A_RATE"
kill "$SAMPLER"
echo "phase 3: A and B together" >&2
load both-a "$KEY_A" "$A_RATE" &
A_PID=$!
load both-b "$KEY_B" "$B_RATE"
wait "$A_PID"

python3 - "$OUT" "$BUDGET" "$B_RATE" "$A_RATE" "$PHASE_S" "$SPEED" <<'EOF'
import json, sys
out, budget, b_rate, a_rate, phase_s, speed = sys.argv[1:]
budget = int(budget)
samples = [tuple(map(float, l.split())) for l in open(f"{out}/a-alone-tokens.tsv") if len(l.split()) == 2]
worst = 0
for i, (t0, n0) in enumerate(samples):
    for t1, n1 in samples[i + 1:]:
        if t1 - t0 > 60.0:
            break
        worst = max(worst, n1 - n0)
def res(name):
    return json.load(open(f"{out}/{name}/results.json"))
def cls(r, c, k):
    return (r["classes"].get(c) or {}).get(k)
def served(r):
    return sum(c["ok"] for c in r["classes"].values())
alone, both, a = res("b-alone"), res("both-b"), res("a-alone")
lines = [f"# Tenant budget across two replicas (one Redis)", "",
         f"`loadtest/experiments/tenant-budget.sh` (BUDGET={budget} tokens/min for school A, B_RATE={b_rate}/s, "
         f"A at {a_rate}/s = 10x its budget, {phase_s} s per phase, simulator speed {speed}, "
         "llama-3.1-8b-h100 profile, --long-prefill-token-threshold 512; both replicas in turn).", "",
         f"- **A's tokens in any 60 s, counted by the simulator** (A alone): max {worst:,.0f} "
         f"against the budget {budget:,} ({worst / budget:.3f}x).",
         f"- A alone: {a['requests']} sent, {served(a)} served, errors by code {json.dumps(a['errors_by_code'])}.",
         f"- With A: B sent {both['requests']}, served {served(both)}, errors {json.dumps(both['errors_by_code'])} "
         f"(alone: {alone['requests']} sent, {served(alone)} served).", "",
         "| B's small TTFT | alone | with A at 10x | ratio |", "|---|---:|---:|---:|"]
for k in ["ttft_p50_s", "ttft_p95_s", "ttft_p99_s"]:
    x, y = cls(alone, "small", k), cls(both, "small", k)
    if x and y:
        lines.append(f"| {k[5:8]} | {x:.3f} s | {y:.3f} s | {y / x:.2f}x |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
