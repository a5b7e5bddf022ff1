#!/usr/bin/env bash
# Step time of a recipe under each precision, side by side in one run, as ratios to fp32.
# Each precision trains STEPS steps (no evaluation, no checkpoint) ROUNDS times, interleaved so
# that drift on a shared machine spreads over all of them; the median step_time_ms of the
# jsonl train records is reported (the first record, which includes warm-up, is dropped). Records
# come every LOG_EVERY (default 20) steps.
#
#   tools/bench/precision_bench.sh [RECIPE] [PRECISION ...]
#   STEPS=300 ROUNDS=3 DEVICE=cuda tools/bench/precision_bench.sh recipes/fashion_mnist_cnn.toml
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
recipe="${1:-$here/recipes/fashion_mnist_cnn.toml}"
shift || true
precisions=("$@")
[ ${#precisions[@]} -gt 0 ] || precisions=(fp32 bf16 fp16)
steps="${STEPS:-200}"
rounds="${ROUNDS:-3}"
device="${DEVICE:-cpu}"
log_every="${LOG_EVERY:-20}"
[ -x "$build/bin/trainyard" ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for round in $(seq "$rounds"); do
  for precision in "${precisions[@]}"; do
    "$build/bin/trainyard" run "$recipe" --set "precision.plugin=$precision" \
      --set "run.max_steps=$steps" --set run.log_every="$log_every" --set run.eval=false \
      --set "run.device=$device" --set checkpoint.at_end=false \
      --set sinks.console.enabled=false --set "run.output_dir=$out/$precision-$round" >/dev/null
  done
done
"$here/.venv/bin/python" - "$out" "$recipe" "$device" "$steps" "${precisions[@]}" <<'PY'
import json, pathlib, statistics, sys
out, recipe, device, steps, precisions = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
median = {}
for precision in precisions:
    times = []
    for run in sorted(out.glob(f"{precision}-*")):
        records = [json.loads(line) for line in open(run / "metrics.jsonl")]
        train = [r for r in records if r.get("phase") == "train"]
        times += [r["step_time_ms"] for r in train[1:]]
    median[precision] = statistics.median(times)
base = median.get("fp32", next(iter(median.values())))
print(f"{pathlib.Path(recipe).name} on {device}, {steps} steps per run")
print(f"{'precision':10} {'step ms':>9} {'vs fp32':>8}")
for precision in precisions:
    print(f"{precision:10} {median[precision]:9.2f} {median[precision] / base:8.3f}")
PY
