#!/usr/bin/env bash
# What an op-level profile ([run] profile_steps) costs the steps it does not record: the
# fashion_mnist_cnn recipe with its defaults (one process), without a profile and with steps
# 5..7 profiled, interleaved over REPEATS (default 3) rounds. The steps after the first logging
# interval (which holds the profiled ones) are compared: their median step time with the
# profile over without (target: at most 1.02, the noise between two identical runs here), and
# the profile's own steps are listed with the trace file's top ops.
# STEPS (default 200) per run, logged every LOG_EVERY (25). SMOKE=1 (the test suite's few-step
# run) prints the table without judging the target. SKIP_BUILD=1: the caller has built.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
steps="${STEPS:-200}"
repeats="${REPEATS:-3}"
log_every="${LOG_EVERY:-25}"
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard trainyard_all_plugins >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

run() {
  local name="$1"
  shift
  (cd "$here" && "$build/bin/trainyard" run recipes/fashion_mnist_cnn.toml \
    --set run.max_steps="$steps" --set run.log_every="$log_every" --set run.eval=false \
    --set sinks.jsonl.enabled=true --set checkpoint.at_end=false \
    --set run.output_dir="$work/$name" "$@" >"$work/$name.out" 2>&1) ||
    { cat "$work/$name.out" >&2; exit 1; }
}
for round in $(seq "$repeats"); do
  run "off$round"
  run "on$round" --set "run.profile_steps=[5, 7]"
done

"$here/.venv/bin/python" - "$work" "$repeats" "${SMOKE:-0}" <<'PY'
import json, statistics, sys
work, repeats, smoke = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def step_ms(name):
    records = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
    return statistics.median([r["step_time_ms"] for r in records if r["phase"] == "train"][1:])

off = [step_ms(f"off{i}") for i in range(1, repeats + 1)]
on = [step_ms(f"on{i}") for i in range(1, repeats + 1)]
ratios = [b / a for a, b in zip(off, on)]
print(f"fashion_mnist_cnn, 1 process, median step time after the first interval ({repeats} rounds)")
print(f"{'run':34} {'step ms':>8}")
print(f"{'no profile':34} {statistics.median(off):8.2f}")
print(f"{'steps 5..7 profiled':34} {statistics.median(on):8.2f}")
print(f"profiled / not, outside the profiled steps: {statistics.median(ratios):.3f} "
      "(target <= 1.02); each round: " + " ".join(f"{r:.3f}" for r in ratios))
trace = json.load(open(f"{work}/on1/profile.rank0.json"))
ops = {}
for event in trace["traceEvents"]:
    if event.get("ph") == "X" and event.get("cat") == "cpu_op":
        ops[event["name"]] = ops.get(event["name"], 0) + event.get("dur", 0)
top = sorted(ops.items(), key=lambda item: -item[1])[:5]
print("the profile's top ops by total time: " + ", ".join(f"{n} {t / 1000:.1f} ms" for n, t in top))
sys.exit(0 if smoke or statistics.median(ratios) <= 1.02 else 1)
PY
