#!/usr/bin/env bash
# Second opinion on the open-loop headline (docs/results/open-loop/sim-034, load 0.9): the
# questions' time to first token measured by an independent client, guidellm, while the
# project's own tutor-load sends the medium and large classes of seed-mix-open as open-loop
# (Poisson) background. One run = one (seed, preset):
#
#   run.sh SEED PRESET [TAG]      PRESET: floor | fifo | lanes
#
#   floor: guidellm's questions alone, gateway with the shipped config (policy "lanes")
#   fifo : the shipped config with [admission] policy = "fifo" (max_concurrency 0: unlimited),
#          questions + background
#   lanes: the shipped config (only listen / upstream / tokenizer changed), questions + background
#
# Each run starts a fresh simulator (engine of the headline: 96 seats, 12,288 batched tokens,
# long-prefill threshold 512, max model len 16,384, profile llama-3.1-8b-h100, --speed 1, every
# answer running to its max_tokens as in `tutor-load experiment`) and a fresh gateway on loopback
# ports 47310/47311. guidellm sends Poisson questions (300 +-50% prompt, 120 +-50% output tokens,
# normal draws clipped to the +-50% range: guidellm has no uniform draw) at 0.7 x LOAD x CAPACITY
# for RUN_S + 5 s (its warm-up WARMUP_S and the last 5 s are left out of its own aggregates);
# as soon as its first question has come back, tutor-load starts the background at
# 0.3 x LOAD x CAPACITY (25/30 medium, 5/30 large; scenario conf/background.toml) for
# WARMUP_S + (RUN_S - WARMUP_S) s, drain at most 60 s. Both clients, the simulator and the
# gateway count tokens with the same Qwen 2.5 tokenizer (tok/tokenizer.json).
#
# Writes runs/<seed>-<preset><TAG>/: guidellm.json (per-request records) and .log, background/
# (tutor-load results.json, summary.md), request-log.jsonl (gateway), sim-engine.json (the
# simulator's step lateness over the whole run), steps-*.json (its recent steps), loadavg.txt.
# analyze.py reads them.
set -euo pipefail
cd "$(dirname "$0")"
SEED=${1:?seed}
PRESET=${2:?floor|fifo|lanes}
TAG=${3:-}
LOAD=${LOAD:-0.9}              # fraction of FIFO's capacity (the headline's 0.9; the first attempt ran at 0.5, see README.md)
CAPACITY=${CAPACITY:-16.30}    # requests/s of the whole mix at load 1.0 (the headline's measured figure)
RUN_S=${RUN_S:-180}            # guidellm's measured span ends here (s after its first request)
WARMUP_S=${WARMUP_S:-60}       # left out at the start
SIM_PORT=${SIM_PORT:-47310}
GW_PORT=${GW_PORT:-47311}
NICE=${NICE:-5}
TOK=$PWD/tok/tokenizer.json
OUT=runs/$SEED-$PRESET$TAG
rm -rf "$OUT"; mkdir -p "$OUT"

Q_RATE=$(python3 -c "print(round(0.7 * $LOAD * $CAPACITY, 4))")
BG_RATE=$(python3 -c "print(round(0.3 * $LOAD * $CAPACITY, 4))")
case $PRESET in
  floor|lanes) CONF=conf/lanes.toml ;;
  fifo) CONF=conf/fifo.toml ;;
  *) echo "preset: floor, fifo or lanes" >&2; exit 1 ;;
esac
sed "s/^rate = .*/rate = $BG_RATE/" conf/background.toml >"$OUT/background.toml"
echo "seed=$SEED preset=$PRESET load=$LOAD capacity=$CAPACITY q_rate=$Q_RATE bg_rate=$BG_RATE" \
  "run_s=$RUN_S warmup_s=$WARMUP_S start=$(date -u +%FT%TZ)" | tee "$OUT/params.txt"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
LIMIT=$((RUN_S + 200))   # every process is bounded by timeout

timeout $LIMIT nice -n "$NICE" bin/vllm-sim --port "$SIM_PORT" --profile llama-3.1-8b-h100 --speed 1 \
  --mean-output-tokens 1000000 --seed "$SEED" --tokenizer "$TOK" \
  --max-num-seqs 96 --max-num-batched-tokens 12288 --long-prefill-token-threshold 512 \
  --max-model-len 16384 >"$OUT/sim.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SIM_PORT/health" >/dev/null && break; sleep 0.1; done
timeout $LIMIT nice -n "$NICE" bin/tutor-gateway serve --config "$CONF" \
  >"$OUT/request-log.jsonl" 2>"$OUT/gateway.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$GW_PORT/health" >/dev/null && break; sleep 0.1; done

# Machine load every 10 s (the other engineer's compiles share the 2 cores).
( while sleep 10; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; done ) >"$OUT/loadavg.txt" &
pids+=($!)

# guidellm: two worker processes (GUIDELLM__MAX_WORKER_PROCESSES=2, one per core; with one, its
# sending lagged seconds behind schedule at load 0.9), seed = SEED (Poisson gaps and synthetic prompts), so the
# three presets of one seed get the same questions at the same times.
GUIDELLM__MAX_WORKER_PROCESSES=${GUIDELLM_WORKERS:-2} HF_HUB_OFFLINE=1 timeout $LIMIT nice -n "$NICE" \
  venv/bin/guidellm run \
  --backend "kind=openai_http,target=http://127.0.0.1:$GW_PORT" \
  --profile "kind=poisson,rate=$Q_RATE,warmup=$WARMUP_S,cooldown=5" \
  --constraint "kind=max_duration,seconds=$((RUN_S + 5))" \
  --data "kind=synthetic_text,prompt_tokens=300,prompt_tokens_stdev=87,prompt_tokens_min=150,prompt_tokens_max=450,output_tokens=120,output_tokens_stdev=35,output_tokens_min=60,output_tokens_max=180" \
  --tokenizer "kind=hf_auto,model=$PWD/tok" \
  --seed "kind=static,value=$SEED" \
  --metrics "kind=generative,sample_size=0" \
  --output "kind=json,path=$PWD/$OUT/guidellm.json" \
  --disable-console >"$OUT/guidellm.log" 2>&1 &
GL=$!
pids+=($GL)

# The background starts when guidellm's first question has come back (the gateway logs a
# request when it ends), so its warm-up and window line up with guidellm's (within ~1-2 s).
if [ "$PRESET" != floor ]; then
  for _ in $(seq 1200); do [ -s "$OUT/request-log.jsonl" ] && break; sleep 0.1; done
  date +%s.%N >"$OUT/background-start.txt"
  timeout $LIMIT nice -n "$NICE" bin/tutor-load run --scenario "$OUT/background.toml" \
    --target "http://127.0.0.1:$GW_PORT" --api answer --tokenizer "$TOK" \
    --warmup "${WARMUP_S}s" --duration "$((RUN_S - WARMUP_S))s" --drain 60s --seed "$SEED" \
    --progress 30 --out "$OUT/background" >"$OUT/background.log" 2>&1 &
  BG=$!
  pids+=($BG)
fi

# The simulator's recent steps (4,096 kept) every 50 s, and its lateness over the whole run.
( i=0; while sleep 50; do i=$((i+1)); curl -sf "http://127.0.0.1:$SIM_PORT/debug/steps" >"$OUT/steps-$i.json" || true; done ) &
pids+=($!)

wait "$GL" || echo "guidellm exit $?" >>"$OUT/params.txt"
curl -sf "http://127.0.0.1:$SIM_PORT/debug/engine" >"$OUT/sim-engine.json" || true
curl -sf "http://127.0.0.1:$SIM_PORT/debug/steps" >"$OUT/steps-end.json" || true
if [ "$PRESET" != floor ]; then wait "$BG" || echo "tutor-load exit $?" >>"$OUT/params.txt"; fi
curl -sf "http://127.0.0.1:$GW_PORT/metrics" >"$OUT/gateway-metrics.txt" || true
curl -sf "http://127.0.0.1:$SIM_PORT/debug/engine" >"$OUT/sim-engine-end.json" || true
echo "end=$(date -u +%FT%TZ)" >>"$OUT/params.txt"
