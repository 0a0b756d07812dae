#!/usr/bin/env bash
# The autopilot's window fix side by side: two release builds of tutor-load from the same
# commit, /tmp/tl_fix as committed and /tmp/tl_nofix with `TtftWindow::quantile_of`
# (src/telemetry/ttft_window.rs) put back to popping the samples older than the span it reads
# (the code before commit b51e25f), and /tmp/tl_judged, the final code (the knobs judged on
# the first tokens since any of them moved, the ring left whole). Arms alternate seed by seed,
# so both meet the same machine.
#
#   cargo build --release -p tutor-load && cp target/release/tutor-load /tmp/tl_fix
#   # revert quantile_of as above, build again, copy to /tmp/tl_nofix, restore the file
#   OUTDIR=/tmp/ab docs/results/autopilot/matrix/window-fix/ab.sh
#   CONFIG=docs/results/autopilot/config.toml OUTDIR=/tmp/ab100 docs/results/autopilot/matrix/window-fix/ab.sh
#   ARMS="nofix judged" CONFIG=docs/results/autopilot/config.toml OUTDIR=/tmp/abj \
#     docs/results/autopilot/matrix/window-fix/ab.sh
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
for seed in 1 2 3; do
  for arm in ${ARMS:-nofix fix}; do
    "/tmp/tl_$arm" experiment --arrivals poisson \
      --scenario loadtest/scenarios/seed-mix-open.toml --config "${CONFIG:-config/config.toml}" \
      --profile llama-3.1-8b-h100 --speed 3 --fifo-max-concurrency 0 \
      --engine seed --long-prefill-token-threshold 0 --presets autopilot \
      --load 0.9 --seeds "$seed" --capacity 16.12 \
      --warmup-s 60 --window-s 120 --drain 120s --progress 0 \
      --out "${OUTDIR:-/tmp/ab}/$arm/seed$seed"
  done
done
