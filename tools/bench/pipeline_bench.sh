#!/usr/bin/env bash
# Pipeline parallelism on the gpt_text recipe (4 layers, d_model 128, seq 128) with 2 stages on
# this machine, one thread per process, a global batch of 16, in one run:
#   single    one process, batch 16, once: a reference          (trainyard run)
#   compare   on 2 processes, every variant REPEATS times, interleaved (trainyard compare
#             --nproc 2 --repeat, whose report draws the pipelines' simulated and measured
#             schedules and gives each variant's verdict against 1f1b, the first):
#     1f1b, gpipe, interleaved_1f1b (2 stages per rank), zero_bubble, zero_bubble_v (2 stages
#             per rank): parallel.pp = 2, batch 16 in 8 micro-batches;
#     ddp     2 ranks, batch 8 each.
# Each pipeline run records its timeline (strategy.record_step) at the last step of the first
# logging interval, which the throughput leaves out with the warm-up. The table (see
# tools/bench/pipeline_bench.py): samples/s as the median over the repeats and their spread,
# each variant's samples/s over ddp's and over single's (above 1: faster), and for each pipeline
# run each pp rank's measured idle share (median over the repeats) next to the formula
# `trainyard schedule` prints for its shape; then the floors the schedules are held to, each
# met or missed; then each schedule's measured step as text; then where the PNGs of compare's
# report are.
#
#   tools/bench/pipeline_bench.sh [--smoke]
# STEPS (default 40; --smoke: 6) steps a run, logged every max(2, STEPS/8) steps; REPEATS
# (default 3; --smoke: 1) runs of every compare variant; RECORD_STEP (default: that interval)
# the step whose timeline is recorded. OUT (default runs/bench/pipeline) receives single/,
# compare/ (its report.html and a folder per variant, with run-1.. run-K under it when
# REPEATS > 1), each one's log, schedules.png and report.png, replacing an earlier run's.
# SKIP_BUILD=1 uses the binaries as built (the test suite's smoke run). Exits 1 when a run fails
# or the table or pictures are incomplete, 77 when the corpus or Chromium is missing
# (tools/setup installs both).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${TRAINYARD_BUILD_DIR:-build}"
case "$build_dir" in
  /*) build="$build_dir" ;;
  *) build="$here/$build_dir" ;;
esac
steps="${STEPS:-40}"
repeats="${REPEATS:-3}"
if [ "${1:-}" = "--smoke" ]; then
  steps="${STEPS:-6}"
  repeats="${REPEATS:-1}"
elif [ $# -gt 0 ]; then
  echo "usage: tools/bench/pipeline_bench.sh [--smoke]" >&2
  exit 2
fi
log_every=$((steps / 8 > 2 ? steps / 8 : 2))
record_step="${RECORD_STEP:-$log_every}"
global_batch=16
out="${OUT:-$here/runs/bench/pipeline}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

for needed in /usr/share/games/fortunes /usr/bin/chromium; do
  if [ ! -e "$needed" ]; then
    echo "pipeline_bench: $needed is missing: run tools/setup" >&2
    exit 77
  fi
done
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
trainyard="$build/bin/trainyard"

rm -rf "$out"/{single,ddp,compare,recipes} "$out"/{single,ddp,compare}.log \
  "$out"/{schedules,report}.png "$out/schedules.html"
mkdir -p "$out/recipes"
# The compare variants: the shipped recipe cut in 2 stages, the whole batch on both.
for schedule in gpipe 1f1b interleaved_1f1b zero_bubble zero_bubble_v; do
  virtual_stages=1
  case "$schedule" in interleaved_1f1b | zero_bubble_v) virtual_stages=2 ;; esac
  cat >"$out/recipes/$schedule.toml" <<TOML
extends = "$here/recipes/gpt_text.toml"
[parallel]
pp = 2
[strategy]
plugin = "pipeline"
schedule = "$schedule"
micro_batches = 8
virtual_stages = $virtual_stages
record_step = $record_step
TOML
done
# Data parallelism on the same 2 processes: half the global batch on each.
cat >"$out/recipes/ddp.toml" <<TOML
extends = "$here/recipes/gpt_text.toml"
[loader]
batch_size = $((global_batch / 2))
[strategy]
plugin = "ddp"
TOML

common=(--set run.threads=1 --set run.max_steps="$steps" --set run.log_every="$log_every"
        --set run.eval=false)
echo "pipeline_bench: $steps steps a run, logged every $log_every, timelines of step" \
  "$record_step, $repeats run(s) of every compare variant, into $out" >&2
run() {
  local name="$1"
  shift
  (cd "$here" && "$trainyard" "$@" "${common[@]}" --set run.output_dir="$out/$name" \
    >"$out/$name.log" 2>&1) || { tail -20 "$out/$name.log" >&2; exit 1; }
}
run single run recipes/gpt_text.toml --set loader.batch_size="$global_batch"
# compare exits 1 only when every variant failed; its table says which failed and why. 1f1b
# comes first: compare's verdicts are against it.
(cd "$here" && "$trainyard" compare \
  "$out"/recipes/{1f1b,ddp,gpipe,interleaved_1f1b,zero_bubble,zero_bubble_v}.toml \
  --nproc 2 --steps "$steps" --repeat "$repeats" "${common[@]}" --output "$out/compare" \
  >"$out/compare.log" 2>&1) || { tail -20 "$out/compare.log" >&2; exit 1; }

"$here/.venv/bin/python" "$here/tools/bench/pipeline_bench.py" "$out" "$trainyard" "$global_batch"
