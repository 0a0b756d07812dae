#!/usr/bin/env bash
# The open-loop experiment (issue 30, item 3): what lanes cost reviews when load does not
# adapt to the gateway. The seed's mix (70% small 300/120, 25% medium 2,000/300, 5% large
# 8,000/500 tokens, sizes uniform +-50%: loadtest/scenarios/seed-mix-open.toml) arrives as a
# Poisson stream at 0.5, 0.7, 0.9 and 1.1 x FIFO's capacity, which the tool measures first (a
# saturating closed loop of the mix through FIFO). For each load and seed (1, 2, 3): `floor`
# (the same question arrivals alone), `fifo`, `lanes`, each on a fresh simulator
# (`llama-3.1-8b-h100`) behind the real gateway in-process, engine `seed` (96 seats, 12,288
# batched tokens) with --long-prefill-token-threshold 512. Warm-up 60 s, window 120 s, drain
# at most 120 s, all simulated. Writes docs/results/open-loop/summary.{json,md}.
#
# About 36 runs of ~3-4 simulated minutes plus the capacity measurement: 60 min measured at
# SPEED=2 on a 2-core machine, ~2 h at SPEED=1 (the figures are in simulated seconds either way; check
# `engine_late_ms_p99` in summary.json stays at a few ms, or the machine did not keep up).
#
#   loadtest/experiments/open-loop.sh
#   SPEED=2 loadtest/experiments/open-loop.sh
#   SEATS=96,1024 loadtest/experiments/open-loop.sh     # FIFO (and lanes) at two seat counts
#   CAPACITY=19.5 loadtest/experiments/open-loop.sh     # skip the capacity measurement
set -euo pipefail
cd "$(dirname "$0")/../.."
SPEED="${SPEED:-1}"
OUT="${OUT:-docs/results/open-loop}"
extra=()
if [[ -n "${SEATS:-}" ]]; then extra+=(--max-num-seqs "$SEATS"); fi
if [[ -n "${CAPACITY:-}" ]]; then extra+=(--capacity "$CAPACITY"); fi
cargo build --release -p tutor-load
exec "${CARGO_TARGET_DIR:-target}/release/tutor-load" experiment --arrivals poisson \
  --scenario loadtest/scenarios/seed-mix-open.toml \
  --config config/config.toml \
  --profile llama-3.1-8b-h100 --speed "$SPEED" \
  --fifo-max-concurrency 0 \
  --engine seed --long-prefill-token-threshold 512 "${extra[@]}" \
  --presets floor,fifo,lanes \
  --load 0.5,0.7,0.9,1.1 --seeds 1,2,3 \
  --warmup-s 60 --window-s 120 --drain 120s \
  --progress 0 --out "$OUT"
