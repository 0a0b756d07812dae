#!/usr/bin/env bash
# The pre-emption cool-down's trade (jobs.preempt_cooldown_ms, issue 35): the day-like load of
# preempt.sh, run C (`lanes-preempt`) only, once per cool-down, on the same seeds and question
# arrivals. Each run's config is config/config.toml with only jobs.preempt_cooldown_ms changed
# (written to OUT/config-<ms>.toml); the figures to read are each run's questions' TTFT p99
# against jobs done (OUT/<ms>/jobs.md), beside preempt.sh's A and B at the same capacity.
#
# Defaults: cool-downs 0, 2000, 5000 and 10000 ms, seeds 1 and 2, speed 1, the capacity
# preempt.sh measured (57.63 questions/s; CAPACITY= to change it): about 7 minutes a cool-down.
#
#   loadtest/experiments/preempt-cooldown.sh
#   COOLDOWNS=0,5000 SEEDS=1,2,3 loadtest/experiments/preempt-cooldown.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
COOLDOWNS="${COOLDOWNS:-0,2000,5000,10000}"
SEEDS="${SEEDS:-1,2}"
SPEED="${SPEED:-1}"
CAPACITY="${CAPACITY:-57.63}"
DURATION_S="${DURATION_S:-180}"
OUT="${OUT:-docs/results/preempt/cooldown}"
cargo build --release -p tutor-load
bin="${CARGO_TARGET_DIR:-target}/release/tutor-load"
mkdir -p "$OUT"
IFS=, read -r -a cooldowns <<< "$COOLDOWNS"
for ms in "${cooldowns[@]}"; do
  if ! [[ "$ms" =~ ^[0-9]+$ ]]; then
    echo "COOLDOWNS: whole milliseconds, got $ms" >&2
    exit 2
  fi
  config="$OUT/config-$ms.toml"
  sed "s/^preempt_cooldown_ms = .*/preempt_cooldown_ms = $ms/" config/config.toml > "$config"
  grep -q "^preempt_cooldown_ms = $ms$" "$config"
  echo "preempt-cooldown: $ms ms, seeds $SEEDS -> $OUT/$ms" >&2
  "$bin" experiment --arrivals poisson \
    --scenario loadtest/scenarios/preempt-day.toml \
    --config "$config" \
    --profile llama-3.1-8b-h100 --speed "$SPEED" \
    --fifo-max-concurrency 0 \
    --engine seed --long-prefill-token-threshold 512 \
    --presets lanes-preempt \
    --load 1 --seeds "$SEEDS" --capacity "$CAPACITY" \
    --warmup-s 10 --window-s "$DURATION_S" --drain 30s \
    --progress 0 --out "$OUT/$ms" > /dev/null
  rm "$config"
  # The figures only (preempt.sh keeps each job's record and the metrics of its runs).
  rm -rf "$OUT/$ms/jobs" "$OUT/$ms/metrics"
done
for ms in "${cooldowns[@]}"; do
  echo "## jobs.preempt_cooldown_ms = $ms"
  grep '^| mean |' "$OUT/$ms/jobs.md" | head -1
done
