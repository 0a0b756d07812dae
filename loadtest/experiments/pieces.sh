#!/usr/bin/env bash
# Prefilling long prompts in pieces (issue 33, item 4): without --long-prefill-token-threshold a
# review's prompt fills whole engine steps and every question in them waits; does cutting it in
# the gateway (admission.prefill_piece_tokens = 1024) bring question TTFT down to what the
# engine's own threshold gives, and what does it cost reviews and throughput? The seed's mix
# (loadtest/scenarios/seed-mix-open.toml) as a Poisson stream at 0.9 x FIFO's capacity, engine
# `seed` (96 seats, 12,288 batched tokens) without the threshold, seeds 1, 2, 3; presets floor,
# fifo, lanes, autopilot, lanes-pieces, autopilot-pieces (the autopilot's config and objective:
# docs/results/autopilot/config.toml, small 100 ms at p99). Warm-up 60 s, window 120 s, drain at
# most 120 s, simulated. Writes docs/results/autopilot/pieces/.
#
# 18 runs: about 35 min at SPEED=2 on a 2-core machine (check `late_ms_p99` of the engine steps
# in summary.json stays at a few ms, or the machine did not keep up).
#
#   CAPACITY=16.12 SPEED=2 loadtest/experiments/pieces.sh
#   # pieces of 512 tokens (the config file's admission.prefill_piece_tokens), fewer presets:
#   CONFIG=docs/results/autopilot/pieces-512/config.toml PRESETS=floor,lanes-pieces,autopilot-pieces \
#     OUT=docs/results/autopilot/pieces-512 CAPACITY=16.12 SPEED=2 loadtest/experiments/pieces.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SPEED="${SPEED:-1}"
OUT="${OUT:-docs/results/autopilot/pieces}"
extra=()
if [[ -n "${CAPACITY:-}" ]]; then extra+=(--capacity "$CAPACITY"); fi
cargo build --release -p tutor-load
exec "${CARGO_TARGET_DIR:-target}/release/tutor-load" experiment --arrivals poisson \
  --scenario loadtest/scenarios/seed-mix-open.toml \
  --config "${CONFIG:-docs/results/autopilot/config.toml}" \
  --profile llama-3.1-8b-h100 --speed "$SPEED" \
  --fifo-max-concurrency 0 \
  --engine seed --long-prefill-token-threshold 0 "${extra[@]}" \
  --presets "${PRESETS:-floor,fifo,lanes,autopilot,lanes-pieces,autopilot-pieces}" \
  --load 0.9 --seeds 1,2,3 \
  --warmup-s 60 --window-s 120 --drain 120s \
  --progress 0 --out "$OUT"
