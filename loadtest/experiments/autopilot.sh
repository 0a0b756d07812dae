#!/usr/bin/env bash
# The autopilot experiment (issue 33, first slice): does pacing the large lane and the prefill
# budget to a TTFT objective meet it where the static shipped values do not, and what does it
# cost reviews and throughput? The seed's mix (loadtest/scenarios/seed-mix-open.toml) as a
# Poisson stream at 0.9 x FIFO's capacity, engine `seed` (96 seats, 12,288 batched tokens)
# WITHOUT --long-prefill-token-threshold (the setting where the shipped 10 large seats miss),
# seeds 1, 2, 3; presets floor, fifo, lanes (the shipped static values) and autopilot (the
# same, paced to the small lane's objective of 100 ms at p99: docs/results/autopilot/config.toml).
# Warm-up 60 s, window 120 s, drain at most 120 s, simulated. Writes docs/results/autopilot/.
#
# 12 runs plus the capacity measurement: about 30 min at SPEED=2 on a 2-core machine (check
# `engine_late_ms_p99` in summary.json stays at a few ms, or the machine did not keep up).
#
#   SPEED=2 loadtest/experiments/autopilot.sh
#   CAPACITY=16.3 SPEED=2 loadtest/experiments/autopilot.sh   # skip the capacity measurement
set -euo pipefail
# The same command as pieces.sh (the same engine, mix, load, seeds and window), fewer presets.
export PRESETS="${PRESETS:-floor,fifo,lanes,autopilot}"
export OUT="${OUT:-docs/results/autopilot}"
exec "$(dirname "$0")/pieces.sh"
