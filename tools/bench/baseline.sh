#!/usr/bin/env bash
# The benchmarks' fast core against its committed baseline: fashion_mnist_mlp with adamw and sgd,
# 150 steps, 3 runs each interleaved (trainyard compare --repeat 3), checked with
# `compare --against tools/bench/baselines/core.json`. It exits 1 when a variant's losses are not
# the baseline's (within the compute dtype's tolerance) or its step time is significantly slower
# by more than NOISE (default 0.5: a run on a shared machine, beside other tests, varies by tens
# of percent between commands, so only a gross slowdown is judged here; a quiet machine can take
# NOISE=0.05).
#   tools/bench/baseline.sh          check against the baseline
#   tools/bench/baseline.sh --save   measure and write the baseline (after a change meant to
#                                    change the numbers or the speed; commit it with the change)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
baseline="$here/tools/bench/baselines/core.json"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
check=(--against "$baseline" --noise-threshold "${NOISE:-0.5}")
[ "${1:-}" = "--save" ] && check=(--save-baseline "$baseline")
cd "$here"
exec "$build/bin/trainyard" compare recipes/fashion_mnist_mlp.toml \
  --vary optimizer.plugin=adamw,sgd --steps 150 --repeat 3 \
  --set run.threads=1 --set loader.workers=0 --set run.eval=false \
  --output "$work/compare" "${check[@]}"
