#!/usr/bin/env bash
# What the collective flight recorder ([comm] flight_recorder, on by default) costs a training
# step: the gpt_text recipe under fsdp (full sharding: an all-gather per unit forward and
# backward, a reduce-scatter per unit) on 2 ranks, one thread each, with the recorder off
# (flight_recorder = 0) and at its default, interleaved over REPEATS (default 5) rounds. Reports
# the collectives each step records (from the run's comm_*_calls metrics) and the median step
# time with the recorder over without (target: at most 1.01). STEPS (default 60) per run, logged
# every LOG_EVERY (10); the first logging interval is left out. SMOKE=1 (the test suite's few-step
# run) prints the table without judging the target. SKIP_BUILD=1: the caller has built.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
steps="${STEPS:-60}"
repeats="${REPEATS:-5}"
log_every="${LOG_EVERY:-10}"
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard trainyard_all_plugins >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(--set run.threads=1 --set run.max_steps="$steps" --set run.log_every="$log_every"
        --set run.eval=false --set loader.batch_size=8 --set dataset.cache="$work/cache"
        --set strategy.plugin=fsdp)
run() {
  local name="$1"
  shift
  (cd "$here" && "$build/bin/trainyard" launch -n 2 recipes/gpt_text.toml "${common[@]}" \
    --set run.output_dir="$work/$name" "$@" >/dev/null 2>"$work/$name.err") ||
    { cat "$work/$name.err" >&2; exit 1; }
}
for round in $(seq "$repeats"); do
  run "off$round" --set comm.flight_recorder=0
  run "on$round"
done

"$here/.venv/bin/python" - "$work" "$repeats" "${SMOKE:-0}" <<'PY'
import json, statistics, sys
work, repeats, smoke = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def train_records(name, rank):
    records = [json.loads(l) for l in open(f"{work}/{name}/metrics.rank{rank}.jsonl")]
    return [r for r in records if r["phase"] == "train"]

def step_ms(name):
    # The slower rank's median interval, in milliseconds per step.
    return max(statistics.median(r["step_time_ms"] for r in train_records(name, rank)[1:])
               for rank in range(2))

def collectives_per_step(name):
    last = train_records(name, 0)[-1]
    calls = sum(v for k, v in last.items() if k.startswith("comm_") and k.endswith("_calls"))
    return calls

off = [step_ms(f"off{i}") for i in range(1, repeats + 1)]
on = [step_ms(f"on{i}") for i in range(1, repeats + 1)]
ratios = [b / a for a, b in zip(off, on)]
print(f"gpt_text under fsdp, 2 ranks x 1 thread, median step time after the first interval "
      f"({repeats} interleaved rounds)")
print(f"{'run':34} {'step ms':>8}")
print(f"{'flight recorder off':34} {statistics.median(off):8.2f}")
print(f"{'flight recorder on (default)':34} {statistics.median(on):8.2f}")
print(f"collectives recorded per step: {collectives_per_step('on1'):.0f}")
print(f"recorder on / off: {statistics.median(ratios):.3f} (target <= 1.01); each round: "
      + " ".join(f"{r:.3f}" for r in ratios))
sys.exit(0 if smoke or statistics.median(ratios) <= 1.01 else 1)
PY
