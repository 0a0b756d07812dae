#!/usr/bin/env bash
# The defining experiment (M16, issue 13): simulator `llama-3.1-8b-h100` at speed 1, the real
# gateway in-process, 80 small (~400/120) + 20 large (~11,000/400) closed-loop clients, sizes
# uniform +-50%, starts spread over 5 s, seed 42; for each engine setting (`seed`: 96 seats /
# 12,288 batched tokens; `h100`: vLLM's defaults 1,024 / 8,192), five presets in turn: `floor`
# (the small clients alone), `fifo` (unlimited: every request goes straight to the engine),
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
  --engine seed,h100 --presets floor,fifo,strict,lanes,lanes-priority \
  --duration "$DURATION" --drain 60s --seed 42 \
  --out "$OUT"
