#!/usr/bin/env bash
# Model FLOPs utilisation across repeated runs: the default recipe (fashion_mnist_cnn, shortened
# with --set) RUNS times in a row, each run's mfu (the median over its logging intervals after the
# first) and its spread against the median of the runs. The peak FLOP/s is probed by the first
# run into a fresh cache (PEAK_CACHE to use another, e.g. ~/.cache/trainyard) and reused by the
# others, so the runs divide by the same figure and the spread is the throughput's own.
# Exits 1 when a run fails, has no finite positive mfu, or does not take its peak from the cache
# after the first; and, unless --smoke, when a run's mfu is more than 10% from the median.
#   tools/bench/mfu_bench.sh            RUNS=5 runs of STEPS=60 steps
#   tools/bench/mfu_bench.sh --smoke    2 runs of 12 steps, no spread asserted
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
smoke=0
[ "${1:-}" = "--smoke" ] && smoke=1
runs="${RUNS:-5}"
steps="${STEPS:-60}"
if [ "$smoke" = 1 ]; then
  runs="${RUNS:-2}"
  steps="${STEPS:-12}"
fi
log_every=$(( steps / 6 > 2 ? steps / 6 : 2 ))
# SKIP_BUILD=1: the caller (the test suite) has built everything.
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cache="${PEAK_CACHE:-$work/cache}"
for run in $(seq 1 "$runs"); do
  (cd "$here" && TRAINYARD_CACHE="$cache" "$build/bin/trainyard" run recipes/fashion_mnist_cnn.toml \
    --set run.max_steps="$steps" --set run.log_every="$log_every" --set run.eval=false \
    --set checkpoint.at_end=false --set sinks.console.progress=lines \
    --set run.output_dir="$work/run$run" >/dev/null 2>"$work/run$run.err") ||
    { echo "mfu benchmark: run $run failed:" >&2; cat "$work/run$run.err" >&2; exit 1; }
done

"$here/.venv/bin/python" - "$work" "$runs" "$smoke" "${PEAK_CACHE:+given}" <<'PY'
import json, math, statistics, sys, tomllib
work, runs, smoke, given_cache = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "given"
rows, problems = [], []
for run in range(1, runs + 1):
    records = [json.loads(line) for line in open(f"{work}/run{run}/metrics.jsonl")]
    train = [r for r in records if r["phase"] == "train"][1:]  # the first interval warms up
    mfus = [r["mfu"] for r in train if "mfu" in r]
    info = tomllib.load(open(f"{work}/run{run}/run_info.toml", "rb"))["peak_flops"]
    mfu = statistics.median(mfus) if mfus else float("nan")
    if not (math.isfinite(mfu) and mfu > 0):
        problems.append(f"run {run}: no finite positive mfu")
    expected = "cached" if run > 1 or given_cache else "measured"
    if info["source"] != expected:
        problems.append(f"run {run}: peak source {info['source']}, expected {expected}")
    rows.append((run, mfu, info["tflops"], info["source"]))
median = statistics.median(row[1] for row in rows)
print(f"mfu benchmark: fashion_mnist_cnn, {runs} runs")
print(f"{'run':>3} {'mfu':>8} {'vs median':>10} {'peak TFLOP/s':>13} {'source':>9}")
for run, mfu, tflops, source in rows:
    deviation = mfu / median - 1
    print(f"{run:3d} {mfu:8.4f} {deviation:+10.1%} {tflops:13.4f} {source:>9}")
    if not smoke and abs(deviation) > 0.10:
        problems.append(f"run {run}: mfu {mfu:.4f} is {deviation:+.1%} from the median {median:.4f}")
if len({row[2] for row in rows}) != 1:
    problems.append("the runs divided by different peaks: " + ", ".join(str(row[2]) for row in rows))
spread = max(abs(row[1] / median - 1) for row in rows)
print(f"spread: {spread:.1%} of the median {median:.4f} (acceptance on an idle machine: 10%)")
for problem in problems:
    print("mfu benchmark: " + problem, file=sys.stderr)
sys.exit(1 if problems else 0)
PY
