#!/usr/bin/env bash
# Gradient compression under ddp on 2 ranks (one thread each), the fashion_mnist_mlp recipe with
# its defaults, side by side in one run:
#   at an emulated link of BANDWIDTH_MB_S (default 100) MB/s per rank ([comm]
#   emulated_bandwidth_mb_s: every collective takes at least the time its bytes need at that
#   speed): uncompressed ddp, PowerSGD rank 4 and top-k at ratio 0.01; PowerSGD's step time
#   against uncompressed ddp's (target: at least 2x faster);
#   at the machine's own loopback speed: uncompressed ddp and PowerSGD, whose difference is the
#   compression's own cost where the network is not the limit, each against Python PyTorch's
#   DDP on the same model (torchrun, gloo, AdamW, batch 64 per rank), uncompressed and with
#   PyTorch's powerSGD_hook (tools/bench/compression_python.py).
# PowerSGD and top-k start after 10 plain steps (compression.start_step; PowerSGD's default, as
# PyTorch's, is 1000). Every run trains STEPS (default 200) steps logged every LOG_EVERY (25);
# the first logging interval (which holds the plain steps) is left out; each row is the median
# over REPEATS (default 3) rounds that run every variant back to back.
# START_STEP overrides the 10 plain steps; SMOKE=1 (the test suite's few-step run) prints the
# table without judging the target. SKIP_BUILD=1: the caller has built everything.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
steps="${STEPS:-200}"
repeats="${REPEATS:-3}"
log_every="${LOG_EVERY:-25}"
bandwidth="${BANDWIDTH_MB_S:-100}"
start="${START_STEP:-10}"
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

trainyard="$build/bin/trainyard"
common=(--set strategy.plugin=ddp --set run.max_steps="$steps" --set run.log_every="$log_every"
  --set run.eval=false --set run.epochs=10 --set sinks.jsonl.enabled=true)
powersgd=(--set compression.plugin=powersgd --set compression.rank=4 --set compression.start_step="$start")
topk=(--set compression.plugin=topk --set compression.ratio=0.01 --set compression.start_step="$start")
slow=(--set comm.emulated_bandwidth_mb_s="$bandwidth")
variant() {
  local name="$1" round="$2"
  shift 2
  (cd "$here" && "$trainyard" launch -n 2 recipes/fashion_mnist_mlp.toml "${common[@]}" "$@" \
    --set run.output_dir="$work/$name$round" >/dev/null 2>"$work/$name$round.err") ||
    { cat "$work/$name$round.err" >&2; exit 1; }
}
python_ddp() {
  local port
  port="$("$here/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  (cd "$work" && OMP_NUM_THREADS=1 timeout 600 "$here/.venv/bin/torchrun" --nproc-per-node 2 \
    --master-addr 127.0.0.1 --master-port "$port" "$here/tools/bench/compression_python.py" \
    "$steps" "$1" "$start" 2>/dev/null | awk '/python_step_ms/ {print $2}')
}
for round in $(seq "$repeats"); do
  variant slow_ddp "$round" "${slow[@]}"
  variant slow_powersgd "$round" "${slow[@]}" "${powersgd[@]}"
  variant slow_topk "$round" "${slow[@]}" "${topk[@]}"
  variant fast_ddp "$round"
  variant fast_powersgd "$round" "${powersgd[@]}"
  python_ddp none >"$work/python_ddp$round.ms"
  python_ddp powersgd >"$work/python_powersgd$round.ms"
done

"$here/.venv/bin/python" - "$work" "$repeats" "$bandwidth" "${SMOKE:-0}" <<'PY'
import json, statistics, sys
work, repeats, bandwidth, smoke = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"

def figures(name, round_):
    records = [json.loads(l) for l in open(f"{work}/{name}{round_}/metrics.rank0.jsonl")]
    train = [r for r in records if r["phase"] == "train"][1:]
    sent = next(k for k in train[0] if k.startswith("comm_dp") and k.endswith("_bytes"))
    return {"ms": statistics.median(r["step_time_ms"] for r in train),
            "samples": statistics.median(r["samples_per_s"] for r in train),
            "comm": statistics.median(r["comm_wait_ms"] for r in train),
            "sent": statistics.median(r[sent] for r in train),
            "buckets": statistics.median(r["gradient_bytes"] for r in train)}

names = ["slow_ddp", "slow_powersgd", "slow_topk", "fast_ddp", "fast_powersgd"]
runs = {n: [figures(n, i) for i in range(1, repeats + 1)] for n in names}
med = lambda n, k: statistics.median(r[k] for r in runs[n])
labels = {"slow_ddp": f"ddp, {bandwidth} MB/s", "slow_powersgd": f"powersgd r4, {bandwidth} MB/s",
          "slow_topk": f"topk 0.01, {bandwidth} MB/s", "fast_ddp": "ddp, loopback",
          "fast_powersgd": "powersgd r4, loopback"}
print(f"fashion_mnist_mlp, ddp on 2 ranks, medians of {repeats} rounds (rank 0)")
print(f"{'run':26} {'step ms':>8} {'samples/s':>10} {'comm ms':>8} {'bytes/step':>11} {'of buckets':>10}")
for n in names:
    print(f"{labels[n]:26} {med(n, 'ms'):8.2f} {med(n, 'samples'):10.0f} {med(n, 'comm'):8.2f} "
          f"{med(n, 'sent'):11.0f} {med(n, 'sent') / med(n, 'buckets'):10.4f}")
speedups = [d["ms"] / p["ms"] for d, p in zip(runs["slow_ddp"], runs["slow_powersgd"])]
print(f"powersgd speed-up over ddp at {bandwidth} MB/s: {statistics.median(speedups):.2f}x "
      f"(target >= 2); each round: " + " ".join(f"{s:.2f}" for s in speedups))
overheads = [p["ms"] / d["ms"] for d, p in zip(runs["fast_ddp"], runs["fast_powersgd"])]
print(f"powersgd step time / ddp's at loopback speed: {statistics.median(overheads):.2f} "
      "(its own cost where the network is not the limit); each round: " +
      " ".join(f"{s:.2f}" for s in overheads))
for ours, theirs, label in (("fast_ddp", "python_ddp", "ddp"),
                            ("fast_powersgd", "python_powersgd", "powersgd")):
    python_ms = [float(open(f"{work}/{theirs}{i}.ms").read()) for i in range(1, repeats + 1)]
    ratios = [o["ms"] / p for o, p in zip(runs[ours], python_ms)]
    print(f"{label} at loopback speed, trainyard / Python PyTorch step time: "
          f"{statistics.median(ratios):.2f} ({med(ours, 'ms'):.2f} ms against "
          f"{statistics.median(python_ms):.2f} ms); each round: " +
          " ".join(f"{r:.2f}" for r in ratios))
sys.exit(0 if smoke or statistics.median(speedups) >= 2 else 1)
PY
