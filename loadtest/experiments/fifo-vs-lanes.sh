#!/usr/bin/env bash
# The defining experiment (M16): simulator `llama-3.1-8b-h100` at speed 1, the real gateway
# in-process, 80 small (300/120) + 20 large (8,000/500) closed-loop clients, seed 42;
# four presets in turn: `fifo` (unlimited: every request goes straight to the engine),
# `strict` (the seed's 32/20/4 as caps), `lanes` (work-conserving lanes from config/config.toml)
# and `lanes-priority` (lanes + the lane as vLLM priority, simulator --scheduling-policy
# priority). Writes docs/results/fifo-vs-lanes/.
#
#   loadtest/experiments/fifo-vs-lanes.sh            # DURATION=15m by default (M6)
#   DURATION=120s loadtest/experiments/fifo-vs-lanes.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${DURATION:-15m}"
OUT="${OUT:-docs/results/fifo-vs-lanes}"
cargo build --release -p tutor-load
exec target/release/tutor-load experiment \
  --scenario loadtest/scenarios/defining-experiment.toml \
  --config config/config.toml \
  --profile llama-3.1-8b-h100 --speed 1 \
  --fifo-max-concurrency 0 \
  --duration "$DURATION" --drain 60s --seed 42 \
  --out "$OUT"
