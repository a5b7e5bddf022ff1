#!/usr/bin/env bash
# Data-parallel benchmark of the fashion_mnist_cnn model on this machine, one thread per rank:
#   scaling      global samples/s of 2 ranks (ddp) / samples/s of 1 rank (single)  (target >= 1.8)
#   vs python    trainyard ddp step time / PyTorch's Python DDP step time, both 2 ranks, gloo,
#                batch 64 per rank, AdamW                                          (target <= 1)
#   overlap      comm_wait: time waiting on communication (the all-reduces after backward, and the
#                buffer broadcast, which travels during backward, before the next forward), with
#                the all-reduces launched from autograd hooks (overlap) and all after backward
#                (no overlap)
#   compression  one ddp run with bf16 gradient compression (strategy.compression): half the
#                bytes on the wire, averaged gradients rounded to bf16 (not a parity setting)
#   machine      what the machine itself gives two processes: two single runs side by side, with
#                no communication at all. Their samples/s over one single run is the most any
#                2-rank run can scale here (virtual CPUs that share a physical core give less
#                than 2x); ddp's samples/s over theirs is what data parallelism keeps of it
#                (target >= 0.95).
# Each row also shows the step's phases (rank 0's medians, ms per step).
# Timings on a shared machine drift by more than the effect measured, so the single run, the two
# side by side, the ddp run and Python's DDP run back to back REPEATS times (default 3): each
# ratio pairs runs that ran next to each other, and the table shows medians over the repeats.
# Loader workers are the default (-1): one for the single process (a spare core), none for each
# of 2 ranks on 2 cores (and none for the two side by side). STEPS (default 300) optimizer steps
# per run, logged every LOG_EVERY (default 25) steps; the first logging interval is left out.
# SKIP_BUILD=1: the caller (the test suite) has built everything.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
steps="${STEPS:-300}"
repeats="${REPEATS:-3}"
log_every="${LOG_EVERY:-25}"
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The cnn recipe without its checkpoint section: the benchmark times training, not saving.
cat >"$work/cnn.toml" <<TOML
name = "ddp_bench"
[run]
seed = 0
device = "cpu"
threads = 1
max_steps = $steps
epochs = 10
log_every = $log_every
eval = false
[loader]
batch_size = 64
workers = -1
[dataset]
plugin = "fashion_mnist"
[model]
plugin = "cnn"
channels = [32, 64]
hidden = 128
[optimizer]
plugin = "adamw"
lr = 1e-3
weight_decay = 1e-4
[sinks.jsonl]
TOML

trainyard="$build/bin/trainyard"
run() { (cd "$work" && "$trainyard" "$@" >/dev/null); }
python_ddp() {
  local port
  port="$("$here/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  (cd "$work" && OMP_NUM_THREADS=1 timeout 600 "$here/.venv/bin/torchrun" --nproc-per-node 2 \
    --master-addr 127.0.0.1 --master-port "$port" "$here/tools/bench/ddp_bench.py" "$steps" 2>/dev/null |
    awk '/python_ddp_step_ms/ {print $2}')
}
for repeat in $(seq "$repeats"); do
  run run cnn.toml --set run.output_dir="$work/single$repeat"
  run run cnn.toml --set loader.workers=0 --set run.output_dir="$work/side$repeat/a" &
  run run cnn.toml --set loader.workers=0 --set run.output_dir="$work/side$repeat/b"
  wait
  run launch -n 2 cnn.toml --set strategy.plugin=ddp --set run.output_dir="$work/ddp$repeat"
  python_ddp >"$work/python$repeat.ms"
done
run launch -n 2 cnn.toml --set strategy.plugin=ddp --set strategy.overlap=false \
  --set run.output_dir="$work/ddp_no_overlap"
run launch -n 2 cnn.toml --set strategy.plugin=ddp --set strategy.compression=bf16 \
  --set run.output_dir="$work/ddp_bf16"

"$here/.venv/bin/python" - "$work" "$repeats" <<'PY'
import json, statistics, sys
work, repeats = sys.argv[1], int(sys.argv[2])
runs = range(1, repeats + 1)

def train(path):
    records = [json.loads(line) for line in open(path)]
    return [r for r in records if r["phase"] == "train"][1:]  # leave out the warm-up interval

def median(records, key):
    return statistics.median(r[key] for r in records)

phases = ["data_wait_ms", "forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms"]

def figures(paths):
    """samples/s of all processes, the slowest one's step time, the first one's phases."""
    records = [train(p) for p in paths]
    return (sum(median(r, "samples_per_s") for r in records),
            max(median(r, "step_time_ms") for r in records),
            [median(records[0], p) for p in phases])

single = [figures([f"{work}/single{i}/metrics.jsonl"]) for i in runs]
side = [figures([f"{work}/side{i}/{p}/metrics.jsonl" for p in "ab"]) for i in runs]
ddp = [figures([f"{work}/ddp{i}/metrics.rank{r}.jsonl" for r in range(2)]) for i in runs]
python_ms = [float(open(f"{work}/python{i}.ms").read()) for i in runs]
no_overlap = figures([f"{work}/ddp_no_overlap/metrics.rank{r}.jsonl" for r in range(2)])
bf16 = figures([f"{work}/ddp_bf16/metrics.rank{r}.jsonl" for r in range(2)])

print(f"{'run (median of ' + str(repeats) + ')':30} {'samples/s':>10} {'step ms':>8} " +
      " ".join(f"{p[:-3]:>10}" for p in phases))
def row(name, results):
    cells = [statistics.median(r[2][k] for r in results) for k in range(len(phases))]
    print(f"{name:30} {statistics.median(r[0] for r in results):10.0f} "
          f"{statistics.median(r[1] for r in results):8.2f} " + " ".join(f"{c:10.2f}" for c in cells))
row("single, 1 rank x 1 thread", single)
row("2 singles side by side", side)
row("ddp, 2 ranks x 1 thread", ddp)
row("ddp, overlap = false (1 run)", [no_overlap])
row("ddp, bf16 compression (1 run)", [bf16])
python_median = statistics.median(python_ms)
print(f"{'python DDP (torchrun, gloo)':30} {2 * 64 * 1000 / python_median:10.0f} {python_median:8.2f}")

def ratio(name, values, target):
    print(f"{name:34} {statistics.median(values):5.2f}   {target:16} each repeat: " +
          " ".join(f"{v:.2f}" for v in values))
ratio("scaling (2 ranks / 1 rank)", [d[0] / s[0] for s, d in zip(single, ddp)], "(target >= 1.8)")
ratio("step time vs python DDP", [d[1] / p for d, p in zip(ddp, python_ms)], "(target <= 1)")
ratio("scaling, bf16 compression", [bf16[0] / statistics.median(s[0] for s in single)],
      "(1 run / median single)")
ratio("machine: 2 side by side / 1", [b[0] / s[0] for s, b in zip(single, side)], "(at most 2)")
ratio("ddp / 2 side by side", [d[0] / b[0] for b, d in zip(side, ddp)], "(target >= 0.95)")
PY
