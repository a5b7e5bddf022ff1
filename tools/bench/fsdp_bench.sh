#!/usr/bin/env bash
# Sharded data parallelism on the gpt_text recipe, 2 ranks on this machine, one thread per rank:
# step time of fsdp (sharding full and grad_op, and full without prefetching the next unit's
# all-gather) against ddp on the same global batch. The ratio
# is fsdp's median step time over ddp's (lower is better; sharding trades all-gathers for memory,
# so above 1 is expected). STEPS (default 60) optimizer steps per run, logged every LOG_EVERY
# (default 10) steps; the first logging interval is left out. SKIP_BUILD=1: the caller (the test
# suite) has built everything.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
steps="${STEPS:-60}"
log_every="${LOG_EVERY:-10}"
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
trainyard="$build/bin/trainyard"
common=(--set run.threads=1 --set run.max_steps="$steps" --set run.log_every="$log_every" --set run.eval=false
        --set loader.batch_size=8 --set dataset.cache="$work/cache")
run() {
  local name="$1"
  shift
  (cd "$here" && "$trainyard" launch -n 2 recipes/gpt_text.toml "${common[@]}" \
    --set run.output_dir="$work/$name" "$@" >/dev/null 2>"$work/$name.err") ||
    { cat "$work/$name.err" >&2; exit 1; }
}
run ddp --set strategy.plugin=ddp
run fsdp_full --set strategy.plugin=fsdp --set strategy.sharding=full
run fsdp_grad_op --set strategy.plugin=fsdp --set strategy.sharding=grad_op
run fsdp_full_no_prefetch --set strategy.plugin=fsdp --set strategy.sharding=full --set strategy.prefetch=false

"$here/.venv/bin/python" - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]

def step_ms(name):
    # Per rank: the median interval's milliseconds per step (samples per step / samples per s).
    times = []
    for rank in range(2):
        records = [json.loads(l) for l in open(f"{work}/{name}/metrics.rank{rank}.jsonl")]
        train = [r for r in records if r["phase"] == "train"][1:]
        times.append(statistics.median(8 / r["samples_per_s"] * 1000 for r in train))
    return max(times)

ddp = step_ms("ddp")
print("fsdp benchmark: gpt_text (4 layers, d_model 128, seq 128), 2 ranks x batch 8, gloo, 1 thread per rank")
print(f"{'strategy':22} {'step ms':>9} {'vs ddp':>8}")
print(f"{'ddp':22} {ddp:9.1f} {1.0:8.2f}")
for name in ("fsdp_full", "fsdp_grad_op", "fsdp_full_no_prefetch"):
    ms = step_ms(name)
    print(f"{name:22} {ms:9.1f} {ms / ddp:8.2f}")
PY
