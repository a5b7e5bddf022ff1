#!/usr/bin/env bash
# Tensor parallelism on the gpt_text recipe (4 layers, d_model 128, seq 128, 4 heads), one thread
# per process: throughput of tp 2 (ddp strategy, [parallel] tp = 2, with and without sequence
# parallelism) against one process and against ddp on 2 ranks, all on a global batch of 16; and
# the bytes the tp group communicated per step (the engine's comm_tp_bytes, counted by the
# mesh's counting backends) against the formula for the split gpt, exiting 1 when they differ.
# Then what sharding costs on top of tp: fsdp dp_shard 2 x tp 2 against ddp dp 2 x tp 2 (the same
# 4 processes, the same global batch), throughput and the bytes each rank holds between steps.
# STEPS (default 30) optimizer steps per run; the first logging interval is left out.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${TRAINYARD_BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$here/$build"
steps="${STEPS:-30}"
# SKIP_BUILD=1: the caller (the test suite) has built everything.
[ "${SKIP_BUILD:-0}" = 1 ] || "$here/tools/build" --target trainyard_all_plugins >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
trainyard="$build/bin/trainyard"
common=(--set run.threads=1 --set run.max_steps="$steps" --set run.log_every=5 --set run.eval=false
        --set dataset.cache="$work/cache")
run() {
  local name="$1" ranks="$2"
  shift 2
  local how=(run)
  [ "$ranks" -gt 1 ] && how=(launch -n "$ranks")
  (cd "$here" && "$trainyard" "${how[@]}" recipes/gpt_text.toml "${common[@]}" \
    --set run.output_dir="$work/$name" "$@" >/dev/null 2>"$work/$name.err") ||
    { cat "$work/$name.err" >&2; exit 1; }
}
run single 1 --set loader.batch_size=16
run ddp 2 --set strategy.plugin=ddp --set loader.batch_size=8
run tp2 2 --set strategy.plugin=ddp --set parallel.tp=2 --set loader.batch_size=16
run tp2_sp 2 --set strategy.plugin=ddp --set parallel.tp=2 --set loader.batch_size=16 \
  --set model.sequence_parallel=true
run ddp2_tp2 4 --set strategy.plugin=ddp --set parallel.tp=2 --set loader.batch_size=8
run fsdp2_tp2 4 --set strategy.plugin=fsdp --set parallel.tp=2 --set parallel.dp_shard=2 \
  --set loader.batch_size=8

"$here/.venv/bin/python" - "$work" <<'PY'
import json, os, statistics, sys
work = sys.argv[1]
B, T, d, L, V, tp = 16, 128, 128, 4, 256, 2

def records(name, rank):
    single = f"{work}/{name}/metrics.jsonl"
    path = single if os.path.exists(single) else f"{work}/{name}/metrics.rank{rank}.jsonl"
    return [r for r in map(json.loads, open(path)) if r["phase"] == "train"][1:]

PER_RANK_BATCH = {"single": 16, "ddp": 8, "tp2": 16, "tp2_sp": 16, "ddp2_tp2": 8, "fsdp2_tp2": 8}

def samples_per_s(name, ranks):
    # A rank's step time is its own batch over its samples/s; the run's throughput is the global
    # batch over the slowest rank's median step time.
    times = [statistics.median(PER_RANK_BATCH[name] / r["samples_per_s"]
                               for r in records(name, rank)) for rank in range(ranks)]
    return 16 / max(times)

def tp_bytes(name):
    return statistics.median(r.get("comm_tp_bytes", 0.0) for r in records(name, 0))

N = B * T
# Per step and rank, fp32, bytes handed to the all-reduces (the counter's rule). Without sequence
# parallelism: forward, the embedding's all-reduce and two row-parallel all-reduces per layer;
# backward, two copy-to-region all-reduces per layer and one at the head's input; N * d * 4 bytes
# each. The vocab-parallel cross-entropy adds the row maxima and (target logit, sum of exp)
# rows, 3 N floats; clipping's sum of squares one float.
dense = N * d * 4 * (1 + 2 * L + 2 * L + 1)
formula = dense + 3 * N * 4 + 4
# With sequence parallelism a layer's forward has 2 all-gathers (of the N/tp x d slice) and 2
# reduce-scatters (of N x d), its backward 4 all-gathers (inputs gathered again for the weight
# gradients) and 2 reduce-scatters; the embedding all-reduces forward and all-gathers backward,
# the head all-gathers forward and reduce-scatters backward; the norms' and row-parallel biases'
# gradients (partial on a sequence slice) are all-reduced: 4 d floats per layer, 2 d at the end.
slice_bytes = N // tp * d * 4
full_bytes = N * d * 4
formula_sp = (L * (6 * slice_bytes + 4 * full_bytes) + (full_bytes + slice_bytes)
              + (slice_bytes + full_bytes) + 3 * N * 4 + (L * 6 * d + 2 * d) * 4 + 4)
single = samples_per_s("single", 1)
ddp = samples_per_s("ddp", 2)
print(f"tensor-parallel benchmark: gpt_text (L {L}, d {d}, seq {T}, 4 heads, vocab {V}), global batch 16, 1 thread per process, gloo")
print(f"{'run':10} {'samples/s':>10} {'vs single':>10} {'vs ddp':>8} {'tp bytes/step':>14} {'formula':>12}")
mismatches = []
for name, ranks in (("single", 1), ("ddp", 2), ("tp2", 2), ("tp2_sp", 2)):
    rate = samples_per_s(name, ranks)
    measured = f"{tp_bytes(name):14.0f}" if name.startswith("tp") else f"{'':14}"
    expected = {"tp2": f"{formula:12d}", "tp2_sp": f"{formula_sp:12d}"}.get(name, f"{'':12}")
    print(f"{name:10} {rate:10.1f} {rate / single:10.2f} {rate / ddp:8.2f} {measured} {expected}")
    if name in ("tp2", "tp2_sp"):
        want = formula if name == "tp2" else formula_sp
        if tp_bytes(name) != want:
            mismatches.append(f"{name}: {tp_bytes(name):.0f} bytes per step, formula {want}")
def held_bytes(name):
    summary = [r for r in map(json.loads, open(f"{work}/{name}/metrics.rank0.jsonl"))
               if r["phase"] == "summary"][-1]
    return sum(summary[k] for k in ("held_parameter_bytes", "held_gradient_bytes",
                                    "held_optimizer_bytes"))

replicated, sharded = samples_per_s("ddp2_tp2", 4), samples_per_s("fsdp2_tp2", 4)
print(f"\nfsdp x tp against ddp x tp, 4 processes (dp 2 x tp 2), global batch 16:")
print(f"{'run':10} {'samples/s':>10} {'vs ddp2_tp2':>12} {'held bytes/rank':>16} {'vs ddp2_tp2':>12}")
for name, rate in (("ddp2_tp2", replicated), ("fsdp2_tp2", sharded)):
    print(f"{name:10} {rate:10.1f} {rate / replicated:12.2f} {held_bytes(name):16.0f} "
          f"{held_bytes(name) / held_bytes('ddp2_tp2'):12.3f}")
if mismatches:
    sys.exit("tp_bench: the tp group's bytes differ from the formula: " + "; ".join(mismatches))
PY
