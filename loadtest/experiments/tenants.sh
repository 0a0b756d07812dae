#!/usr/bin/env bash
# Issue 34's fleet measurements: two gateway replicas share one Redis quota in front of one
# simulated vLLM (llama-3.1-8b-h100 profile, --long-prefill-token-threshold 512), with two
# tenants (school A and school B, one API key each). The seed mix
# (loadtest/scenarios/seed-mix-open.toml), open loop.
#
# Part "budget": school A has `tokens_per_minute = BUDGET`, B none.
#   1. b-alone: B at B_RATE requests/s through both replicas in turn, alone;
#   2. a-alone: A at 10x its budget through both replicas; the simulator's prompt + generation
#      token counters, read every second, give what the engine served A in every 60 s window;
#   3. both: A at 10x its budget and B at B_RATE together: B's TTFT against phase 1.
# Part "fairness": no budgets; A sends 10x B's load, in two settings: "a-one" (A through
#   replica 1 only, B through both: the issue's) and "b-one" (A through both, B through replica 2
#   only: replica 1 sees A alone), each in FIFO order (`[auth]` off: no tenants, each replica's
#   lines first come first served), with `auth.fleet_fairness = false` (turns per replica) and
#   with it on, for each seed of FAIR_SEEDS. Two measures:
#   - the fleet's own counters in Redis (every tenant's prompt + output tokens over its share,
#     charged at admission, settled at the end; kept whether the lines order by them or not;
#     none in FIFO, which has no tenants), sampled every 0.5 s with
#     who waits where (fleet_sampler.py): the gap between A's and B's counters at every sample
#     where both wait, against the documented bound;
#   - the clients' own records (prompt + output tokens of completed requests, credited at
#     completion): Jain's index of the two tenants' service over the backlogged period and in
#     10 s windows.
#
# Writes OUT/summary.md (and each run's tutor-load results). About 12 minutes per part with the
# defaults (the fairness part: about 2.5 minutes per setting, mode and seed).
#   loadtest/experiments/tenants.sh [OUT]   (default target/tenants)
# Env: PARTS (default budget,fairness), BUDGET (tokens per minute, default 60000), B_RATE
#      (default 4), PHASE_S (default 150), FAIR_B_RATE (B's rate in the fairness part, default
#      3.2, about 0.8 of the engine at that speed), FAIR_SPEED (the simulator's speed there,
#      default 0.25: about 4 requests/s), FAIR_SETTINGS (default a-one,b-one), FAIR_SEEDS
#      (default 1), FAIR_MODES (default "fifo false true"), FAIR_PHASE_S (default PHASE_S), SPEED (in the budget part, default 1).
#      Needs redis-server (scripts/test installs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-target/tenants}
PARTS=${PARTS:-budget,fairness}
BUDGET=${BUDGET:-60000}
B_RATE=${B_RATE:-4}
PHASE_S=${PHASE_S:-150}
FAIR_B_RATE=${FAIR_B_RATE:-3.2}
FAIR_SPEED=${FAIR_SPEED:-0.25}
SPEED=${SPEED:-1}
FAIR_SETTINGS=${FAIR_SETTINGS:-a-one,b-one}
FAIR_SEEDS=${FAIR_SEEDS:-1}
FAIR_MODES=${FAIR_MODES:-fifo false true}
FAIR_PHASE_S=${FAIR_PHASE_S:-$PHASE_S}
rm -rf "$OUT" && mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

cargo build --release -q -p tutor-gateway -p vllm-sim -p tutor-load
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
stop_fleet() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}
trap stop_fleet EXIT
wait_ok() { for _ in $(seq 1 $(($2 * 10))); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done; return 1; }

KEY_A=load-key-school-a
KEY_B=load-key-school-b
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

# start_fleet NAME SPEED EXTRA_TOML: a fresh Redis, simulator and two replicas.
start_fleet() {
  local name=$1 speed=$2 extra=$3
  REDIS_PORT=$(free_port); SIM_PORT=$(free_port); PORTS=("$(free_port)" "$(free_port)")
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    >"$OUT/$name-redis.log" 2>&1 &
  PIDS+=($!)
  "$BIN/vllm-sim" --port "$SIM_PORT" --profile llama-3.1-8b-h100 --speed "$speed" \
    --long-prefill-token-threshold 512 --enable-prompt-tokens-details >"$OUT/$name-sim.log" 2>&1 &
  PIDS+=($!)
  python3 - "$OUT/$name-config.toml" "$REDIS_PORT" "$SIM_PORT" "$(sha $KEY_A)" "$(sha $KEY_B)" "$extra" <<'EOF'
import re, sys
out, redis_port, sim_port, sha_a, sha_b, extra = sys.argv[1:]
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
for line in filter(None, extra.split(";")):
    section, kv = line.split(":", 1)
    key, value = kv.split("=", 1)
    if section.startswith("auth.tenants"):
        text += f"\n[{section}]\n{key} = {value}\n"
    else:
        set_key(section, key, value)
open(out, "w").write(text)
EOF
  "$BIN/tutor-gateway" check-config "$OUT/$name-config.toml" >/dev/null
  wait_ok "http://127.0.0.1:$SIM_PORT/health" 30
  for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  for i in 0 1; do
    "$BIN/tutor-gateway" serve --config "$OUT/$name-config.toml" --listen "127.0.0.1:${PORTS[$i]}" \
      >"$OUT/$name-replica$i.log" 2>&1 &
    PIDS+=($!)
    wait_ok "http://127.0.0.1:${PORTS[$i]}/readyz" 60
  done
  R1="http://127.0.0.1:${PORTS[0]}"; R2="http://127.0.0.1:${PORTS[1]}"
}

scenario() { # rate -> file
  sed "s/^rate = .*/rate = $1/" loadtest/scenarios/seed-mix-open.toml >"$OUT/mix-$1.toml"
  echo "$OUT/mix-$1.toml"
}
load() { # name key rate targets...   (env: LOAD_SEED, LOAD_S)
  local name=$1 key=$2 rate=$3; shift 3
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  date +%s.%N >"$OUT/$name.started"
  "$BIN/tutor-load" run --scenario "$(scenario "$rate")" --duration "${LOAD_S:-$PHASE_S}s" \
    --drain 60s --progress 0 --api-key "$key" ${LOAD_SEED:+--seed "$LOAD_SEED"} \
    --out "$OUT/$name" "${targets[@]}" >"$OUT/$name.stdout" 2>&1
}
tokens() { curl -fs "http://127.0.0.1:$SIM_PORT/metrics" \
  | awk '/^vllm:(prompt|generation)_tokens_total/ { n += $2 } END { printf "%d\n", n }'; }

# A's rate at 10x its budget, in the mix's mean request (prompt + output).
mean_tokens=$(python3 -c '
import tomllib
s = tomllib.load(open("loadtest/scenarios/seed-mix-open.toml", "rb"))
print(sum(c["share"] * (c["input_tokens"] + c["output_tokens"]) for c in s["class"]))')

if [[ ",$PARTS," == *",budget,"* ]]; then
  A_RATE=$(python3 -c "print(f'{10 * $BUDGET / 60 / $mean_tokens:.3f}')")
  start_fleet budget "$SPEED" "auth.tenants.school-a:tokens_per_minute=$BUDGET"
  echo "budget 1/3: B alone at $B_RATE/s" >&2
  load b-alone "$KEY_B" "$B_RATE" "$R1" "$R2"
  echo "budget 2/3: A alone at $A_RATE/s (10x its budget)" >&2
  : >"$OUT/a-alone-tokens.tsv"
  ( while :; do echo "$(date +%s.%N) $(tokens)" >>"$OUT/a-alone-tokens.tsv"; sleep 1; done ) &
  SAMPLER=$!
  load a-alone "$KEY_A" "$A_RATE" "$R1" "$R2"
  kill "$SAMPLER"
  echo "budget 3/3: A and B together" >&2
  load both-a "$KEY_A" "$A_RATE" "$R1" "$R2" &
  A_PID=$!
  load both-b "$KEY_B" "$B_RATE" "$R1" "$R2"
  wait "$A_PID"
  stop_fleet
fi

if [[ ",$PARTS," == *",fairness,"* ]]; then
  FAIR_A_RATE=$(python3 -c "print(10 * $FAIR_B_RATE)")
  for setting in ${FAIR_SETTINGS//,/ }; do
    for seed in $FAIR_SEEDS; do
      for mode in $FAIR_MODES; do
        run="fair-$setting-$mode-s$seed"
        if [[ $mode == fifo ]]; then extra="auth:enabled=false"; else extra="auth:fleet_fairness=$mode"; fi
        start_fleet "$run" "$FAIR_SPEED" "$extra"
        if [[ $setting == a-one ]]; then A_AT=("$R1"); B_AT=("$R1" "$R2"); else A_AT=("$R1" "$R2"); B_AT=("$R2"); fi
        echo "fairness $setting seed $seed (fleet_fairness = $mode): A at $FAIR_A_RATE/s via ${#A_AT[@]} replica(s), B at $FAIR_B_RATE/s via ${#B_AT[@]}" >&2
        python3 loadtest/experiments/fleet_sampler.py "$REDIS_PORT" 'tg:v2:{quota}' \
          "$OUT/$run-fleet.jsonl" 0.5 &
        PIDS+=($!)
        # B's seed differs from A's: their sizes and arrivals are not the same draws.
        LOAD_SEED=$seed LOAD_S=$FAIR_PHASE_S load "$run-a" "$KEY_A" "$FAIR_A_RATE" "${A_AT[@]}" &
        A_PID=$!
        LOAD_SEED=$((seed + 100)) LOAD_S=$FAIR_PHASE_S load "$run-b" "$KEY_B" "$FAIR_B_RATE" "${B_AT[@]}"
        wait "$A_PID"
        for r in "$R1" "$R2"; do
          curl -fs "$r/metrics" | grep '^tutor_gateway_tenant_fleet_yields_total' || true
        done >"$OUT/$run-yields.txt"
        stop_fleet
      done
    done
  done
fi

python3 loadtest/experiments/tenants_report.py "$OUT" "$PARTS" "$BUDGET" "$B_RATE" "$PHASE_S" \
  "$SPEED" "$FAIR_B_RATE" "$FAIR_SPEED" "$FAIR_SETTINGS" "$FAIR_SEEDS" "$FAIR_PHASE_S" \
  "$FAIR_MODES"
