#!/usr/bin/env bash
# Data-parallel benchmark of the fashion_mnist_cnn model on this machine, one thread per rank:
#   scaling      global samples/s of 2 ranks (ddp) / samples/s of 1 rank (single)  (target >= 1.8)
#   vs python    trainyard ddp step time / PyTorch's Python DDP step time, both 2 ranks, gloo,
#                batch 64 per rank, AdamW                                          (target <= 1)
#   overlap      comm_wait: time waiting on communication (the buffer broadcast before forward and
#                the all-reduces after backward), with the all-reduces launched from autograd
#                hooks (overlap) and all after backward (no overlap)
# Each row also shows the step's phases (rank 0's medians, ms per step).
# Loader workers are the default (-1): one for the single process (a spare core), none for each
# of 2 ranks on 2 cores. STEPS (default 300) optimizer steps per run; the first logging interval
# is left out.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$here/${TRAINYARD_BUILD_DIR:-build}"
steps="${STEPS:-300}"
"$here/tools/build" --target trainyard_all_plugins >/dev/null
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
log_every = 25
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
(cd "$work" && "$trainyard" run cnn.toml --set run.output_dir="$work/single" >/dev/null)
(cd "$work" && "$trainyard" launch -n 2 cnn.toml --set strategy.plugin=ddp \
  --set run.output_dir="$work/ddp" >/dev/null)
(cd "$work" && "$trainyard" launch -n 2 cnn.toml --set strategy.plugin=ddp \
  --set strategy.overlap=false --set run.output_dir="$work/ddp_no_overlap" >/dev/null)
port="$("$here/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python_ms="$(cd "$work" && OMP_NUM_THREADS=1 timeout 600 "$here/.venv/bin/torchrun" --nproc-per-node 2 \
  --master-addr 127.0.0.1 --master-port "$port" "$here/tools/bench/ddp_bench.py" "$steps" 2>/dev/null |
  awk '/python_ddp_step_ms/ {print $2}')"

"$here/.venv/bin/python" - "$work" "$python_ms" <<'PY'
import json, statistics, sys
work, python_ms = sys.argv[1], float(sys.argv[2])

def train(path):
    records = [json.loads(line) for line in open(path)]
    return [r for r in records if r["phase"] == "train"][1:]  # leave out the warm-up interval

def median(records, key):
    return statistics.median(r[key] for r in records)

single = train(f"{work}/single/metrics.jsonl")
ranks = [train(f"{work}/ddp/metrics.rank{r}.jsonl") for r in range(2)]
no_overlap = [train(f"{work}/ddp_no_overlap/metrics.rank{r}.jsonl") for r in range(2)]
phases = ["data_wait_ms", "forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms"]
print(f"{'run':28} {'samples/s':>10} {'step ms':>8} " + " ".join(f"{p[:-3]:>10}" for p in phases))
def row(name, runs):
    rate = sum(median(r, "samples_per_s") for r in runs)
    step = max(median(r, "step_time_ms") for r in runs)
    print(f"{name:28} {rate:10.0f} {step:8.2f} " + " ".join(f"{median(runs[0], p):10.2f}" for p in phases))
    return rate, step
single_rate, _ = row("single, 1 rank x 1 thread", [single])
ddp_rate, ddp_ms = row("ddp, 2 ranks x 1 thread", ranks)
row("ddp, overlap = false", no_overlap)
print(f"{'python DDP (torchrun, gloo)':28} {2 * 64 * 1000 / python_ms:10.0f} {python_ms:8.2f}")
print(f"scaling (2 ranks / 1 rank):   {ddp_rate / single_rate:.2f}x   (target >= 1.8)")
print(f"step time vs python DDP:      {ddp_ms / python_ms:.2f}    (target <= 1)")
PY
