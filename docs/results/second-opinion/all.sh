#!/usr/bin/env bash
# All nine runs, presets interleaved within each seed (floor, fifo, lanes), so machine noise
# hits each preset alike. Usage: all.sh [SEEDS...]  (default 1 2 3)
cd "$(dirname "$0")"
for seed in "${@:-1 2 3}"; do
  for preset in floor fifo lanes; do
    timeout 600 ./run.sh "$seed" "$preset" || echo "run $seed $preset failed: $?" >&2
  done
done
