#!/usr/bin/env bash
# Why FIFO's question tail came out worse in the second opinion than in the project's runs:
# the same stack as run.sh (simulator at --speed 1 with the Qwen tokenizer, the gateway of
# conf/PRESET.toml), with tutor-load in place of guidellm. Run from the working folder of
# README.md's "To run it", plus conf/questions.toml (this folder's questions.toml).
#
#   diagnose.sh one SEED PRESET    one tutor-load process sends the whole mix
#                                  (loadtest/scenarios/seed-mix-open.toml, as the project's
#                                  experiment does) at 0.9 x 16.30 = 14.67 per second
#   diagnose.sh two SEED PRESET    two tutor-load processes: the questions (conf/questions.toml,
#                                  10.27 per second, seed SEED + 100) and the background
#                                  (conf/background.toml, 4.40 per second, seed SEED: the
#                                  second opinion's reviews, arrival for arrival)
#
# Writes diag/<mode>-<seed>-<preset>/: request-log.jsonl (the gateway's), steps-end.json (the
# simulator's last 4,096 steps: running and waiting requests per step), and each tutor-load
# process's results (load/, or questions/ and background/).
set -euo pipefail
cd "$(dirname "$0")"
MODE=${1:?one|two}; SEED=${2:?seed}; PRESET=${3:?floor|fifo|lanes}
MIX=${MIX:-seed-mix-open.toml}   # the repo's loadtest/scenarios/seed-mix-open.toml, copied here
TOK=$PWD/tok/tokenizer.json
OUT=diag/$MODE-$SEED-$PRESET
rm -rf "$OUT"; mkdir -p "$OUT"
case $PRESET in floor|lanes) CONF=conf/lanes.toml ;; fifo) CONF=conf/fifo.toml ;;
  *) echo "preset: floor, fifo or lanes" >&2; exit 1 ;; esac
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
timeout 600 bin/vllm-sim --port 47310 --profile llama-3.1-8b-h100 --speed 1 \
  --mean-output-tokens 1000000 --seed "$SEED" --tokenizer "$TOK" \
  --max-num-seqs 96 --max-num-batched-tokens 12288 --long-prefill-token-threshold 512 \
  --max-model-len 16384 >"$OUT/sim.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf http://127.0.0.1:47310/health >/dev/null && break; sleep 0.1; done
timeout 600 bin/tutor-gateway serve --config "$CONF" >"$OUT/request-log.jsonl" 2>"$OUT/gateway.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf http://127.0.0.1:47311/health >/dev/null && break; sleep 0.1; done
load() { # scenario rate seed out
  sed "s/^rate = .*/rate = $2/" "$1" >"$OUT/$4.toml"
  timeout 500 bin/tutor-load run --scenario "$OUT/$4.toml" --target http://127.0.0.1:47311 \
    --api answer --tokenizer "$TOK" --warmup 60s --duration 120s --drain 60s --seed "$3" \
    --progress 0 --out "$OUT/$4" >"$OUT/$4.log" 2>&1
}
case $MODE in
  one) load "$MIX" 14.67 "$SEED" load ;;
  two) load conf/background.toml 4.4001 "$SEED" background &
       BG=$!; pids+=($BG)
       load conf/questions.toml 10.2669 "$((SEED + 100))" questions
       wait "$BG" ;;
  *) echo "mode: one or two" >&2; exit 1 ;;
esac
curl -sf http://127.0.0.1:47310/debug/steps >"$OUT/steps-end.json" || true
