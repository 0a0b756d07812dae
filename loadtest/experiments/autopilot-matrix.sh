#!/usr/bin/env bash
# Issue 33's Done-when matrix: the autopilot with the shipped configuration (config/config.toml,
# autopilot on, nothing hand-tuned: small 500 ms / medium 2 s at p99, pieces picked by the
# autopilot from the engine's steps) against FIFO and the floor, at four engine settings: the
# seed's (96 seats, 12,288 batched tokens) and vLLM's H100 defaults (1,024 seats, 8,192), each
# without and with --long-prefill-token-threshold 512. The seed's mix
# (loadtest/scenarios/seed-mix-open.toml) as a Poisson stream at 0.9 x FIFO's capacity (measured
# per setting), seeds 1, 2, 3, simulator profile llama-3.1-8b-h100 (estimated step costs).
# Warm-up 60 s, window 120 s, drain at most 120 s, simulated. Writes docs/results/autopilot/matrix/.
#
# 36 runs plus four capacity measurements: about 60 min at SPEED=3 on a 2-core machine (check
# the engine steps' `late_ms_p99` in summary.json stays at a few ms, or the machine did not
# keep up).
#
#   SPEED=3 loadtest/experiments/autopilot-matrix.sh
#   # 1.2 x capacity, the seed's engine without the threshold:
#   ENGINES=seed THRESHOLDS=0 LOAD=1.2 OUT=docs/results/autopilot/overload SPEED=3 \
#     loadtest/experiments/autopilot-matrix.sh
#   # early refusals: the same mix, each request carrying x-tutor-deadline-ms, at 1.2 x capacity:
#   ENGINES=seed THRESHOLDS=0 LOAD=1.2 PRESETS=autopilot \
#     SCENARIO=loadtest/scenarios/seed-mix-open-deadlines.toml \
#     OUT=docs/results/autopilot/refusals SPEED=3 loadtest/experiments/autopilot-matrix.sh
#   # reviews doubling 120 s into the window (load 0.7 before the step), a 240 s window:
#   ENGINES=seed THRESHOLDS=0 LOAD=0.7 PRESETS=fifo,autopilot WINDOW_S=240 \
#     EXTRA="--step-at-s 180 --step-class large --step-factor 2" \
#     OUT=docs/results/autopilot/step SPEED=3 loadtest/experiments/autopilot-matrix.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SPEED="${SPEED:-2}"
OUT="${OUT:-docs/results/autopilot/matrix}"
cargo build --release -p tutor-load
exec "${CARGO_TARGET_DIR:-target}/release/tutor-load" experiment --arrivals poisson \
  --scenario "${SCENARIO:-loadtest/scenarios/seed-mix-open.toml}" \
  --config "${CONFIG:-config/config.toml}" \
  --profile llama-3.1-8b-h100 --speed "$SPEED" \
  --fifo-max-concurrency 0 \
  --engine "${ENGINES:-seed,h100}" --long-prefill-token-threshold "${THRESHOLDS:-0,512}" \
  --presets "${PRESETS:-floor,fifo,autopilot}" \
  --load "${LOAD:-0.9}" --seeds "${SEEDS:-1,2,3}" \
  --warmup-s 60 --window-s "${WINDOW_S:-120}" --drain 120s ${EXTRA:-} \
  --progress 0 --out "$OUT"
