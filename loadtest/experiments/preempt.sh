#!/usr/bin/env bash
# Pre-emptible background jobs (issue 35): do jobs that borrow any lane's idle seats, and give
# them back when a question needs one, finish more reviews without slowing the questions?
#
# A day-like open loop of questions (loadtest/scenarios/preempt-day.toml: ~300/120 tokens,
# uniform +-50%, Poisson at 10%..90% of the measured capacity in waves of 60 s) and a backlog of
# 200 review jobs (~8,000/500 tokens, uniform +-50%, all submitted at the start, POST /jobs, then
# polled). For each seed, three runs on a fresh simulator (`llama-3.1-8b-h100`, engine `seed`:
# 96 seats, 12,288 batched tokens, --long-prefill-token-threshold 512) behind the real gateway
# in-process, the same question arrivals in each:
#   A `floor`          the questions alone (no jobs)
#   B `lanes`          the questions + the backlog, jobs.preempt = false (today: jobs on idle
#                      large-lane seats only)
#   C `lanes-preempt`  the questions + the backlog, jobs.preempt = true
# and, when PRESETS names it, `lanes-preempt-redis`: C with the quota (and so the pre-emption
# rules) in a redis-server of the run's own, one gateway.
# The capacity (questions/s at load 1.0) is measured first: a saturating closed loop of
# questions through FIFO (30 s warm-up, 60 s window, simulated). Each run: warm-up 10 s (not in
# the TTFT figures), window DURATION, then at most 30 s for the window's questions to end; the
# gateway's /metrics are scraped at each run's end (OUT/metrics/*.prom), each job's record is in
# OUT/jobs/*.json. Writes OUT/jobs.md (the issue's figures per seed and mean, with the ratios
# and targets), OUT/summary.{json,md}.
#
# Defaults: 2 seeds x 3 runs of (10 + 180 + ~5) s + the capacity (90 s) at SPEED=1: about 22
# minutes on a 2-core machine (run it on a quiet one; check `engine_late_ms_p99` in
# summary.json stays at a few ms, or the machine did not keep up with SPEED).
#
#   loadtest/experiments/preempt.sh
#   SEEDS=1,2,3 DURATION=300s loadtest/experiments/preempt.sh
#   CAPACITY=31.5 loadtest/experiments/preempt.sh   # skip the capacity measurement
#   QUICK=1 loadtest/experiments/preempt.sh         # smoke test: SPEED=10, DURATION=20s, ~2 min
#   PRESETS=floor,lanes,lanes-preempt,lanes-preempt-redis loadtest/experiments/preempt.sh
#   SCENARIO=loadtest/scenarios/preempt-evening.toml loadtest/experiments/preempt.sh  # a quiet
#                                   # evening: questions at 5-35%, 800 jobs (preempt-night.toml: 2%)
#   CONFIG=my-config.toml PRESETS=lanes-preempt loadtest/experiments/preempt.sh  # another config
#   KV_OFFLOADING_SIZE=64 loadtest/experiments/preempt.sh   # the engine with vLLM's
#                                   # --kv-offloading-size 64 (GiB of CPU memory for KV blocks)
set -euo pipefail
cd "$(dirname "$0")/../.."
QUICK="${QUICK:-0}"
if [[ "$QUICK" == 1 ]]; then
  SPEED="${SPEED:-10}"
  DURATION="${DURATION:-20s}"
  OUT="${OUT:-target/preempt-quick}"
  capacity_run=(--capacity-warmup-s 5 --capacity-window-s 10)
else
  SPEED="${SPEED:-1}"
  DURATION="${DURATION:-180s}"
  OUT="${OUT:-docs/results/preempt}"
  capacity_run=(--capacity-warmup-s 30 --capacity-window-s 60)
fi
SEEDS="${SEEDS:-1,2}"
SCENARIO="${SCENARIO:-loadtest/scenarios/preempt-day.toml}"
CONFIG="${CONFIG:-config/config.toml}"
PRESETS="${PRESETS:-floor,lanes,lanes-preempt}"
WARMUP_S="${WARMUP_S:-10}"
DRAIN="${DRAIN:-30s}"
case "$DURATION" in
  *m) window_s=$(( ${DURATION%m} * 60 )) ;;
  *s) window_s="${DURATION%s}" ;;
  *) window_s="$DURATION" ;;
esac
if ! [[ "$window_s" =~ ^[0-9]+$ ]] || (( window_s <= 0 )); then
  echo "DURATION must be whole seconds (180s) or minutes (3m), got $DURATION" >&2
  exit 2
fi
extra=()
if [[ -n "${CAPACITY:-}" ]]; then extra+=(--capacity "$CAPACITY"); fi
if [[ -n "${KV_OFFLOADING_SIZE:-}" ]]; then extra+=(--kv-offloading-size "$KV_OFFLOADING_SIZE"); fi
cargo build --release -p tutor-load
bin="${CARGO_TARGET_DIR:-target}/release/tutor-load"
echo "preempt: seeds $SEEDS, window ${window_s} s after ${WARMUP_S} s of warm-up, speed $SPEED -> $OUT" >&2
"$bin" experiment --arrivals poisson \
  --scenario "$SCENARIO" \
  --config "$CONFIG" \
  --profile llama-3.1-8b-h100 --speed "$SPEED" \
  --fifo-max-concurrency 0 \
  --engine seed --long-prefill-token-threshold 512 \
  --presets "$PRESETS" \
  --load 1 --seeds "$SEEDS" \
  --warmup-s "$WARMUP_S" --window-s "$window_s" --drain "$DRAIN" \
  "${capacity_run[@]}" "${extra[@]}" \
  --progress 0 --out "$OUT" > /dev/null   # its stdout is OUT/summary.md
cat "$OUT/jobs.md"
