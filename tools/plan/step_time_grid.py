#!/usr/bin/env python3
"""The planner's step time against the run's, over a grid of bundled recipes and layouts:
`trainyard plan --json` beside the median step of REPEATS runs of the same layout (each the
median of its steps after a warm-up of 2; no memory tracking, which slows a step), as the ratio
planned / measured.

    tools/plan/step_time_grid.py [--repeats 3] [--steps 12] [--seconds 1] [--only SUBSTRING]

A run takes at least --steps steps, and more for a fast layout, enough for about --seconds of
measured steps (at most 200): the median of ten 3 ms steps, whose communication is fast in some
steps and slow in others, moved by a third from run to run.

Prints a table and exits 1 when a ratio is outside 1 +- --tolerance (default 0.25). The runs
time the machine: run it with nothing else busy."""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "bin", "trainyard")

FSDP = ["strategy.plugin=fsdp", "parallel.dp_shard=2"]
PIPELINE = ["strategy.plugin=pipeline", "parallel.pp=2", "parallel.dp_shard=1",
            "strategy.micro_batches=8"]
TP = ["strategy.plugin=ddp", "parallel.tp=2", "parallel.dp_shard=1"]

# (name, recipe, processes, settings)
GRID = [
    ("mlp single", "fashion_mnist_mlp.toml", 1, []),
    ("mlp ddp 2", "fashion_mnist_mlp.toml", 2, ["strategy.plugin=ddp", "parallel.dp_shard=2"]),
    ("cnn single", "fashion_mnist_cnn.toml", 1, []),
    ("cnn ddp 2", "fashion_mnist_cnn.toml", 2, ["strategy.plugin=ddp", "parallel.dp_shard=2"]),
    ("cnn fsdp 2", "fashion_mnist_cnn.toml", 2, FSDP),
    ("gpt single", "gpt_text.toml", 1, []),
    ("gpt single, recompute all", "gpt_text.toml", 1, ['run.activation_checkpointing="all"']),
    ("gpt ddp 2", "gpt_text.toml", 2, ["strategy.plugin=ddp", "parallel.dp_shard=2"]),
    ("gpt zero1 2", "gpt_text.toml", 2,
     ["strategy.plugin=ddp", "parallel.dp_shard=2", "strategy.zero1=true"]),
    ("gpt fsdp full 2", "gpt_text.toml", 2, FSDP + ['strategy.sharding="full"']),
    ("gpt fsdp grad_op 2", "gpt_text.toml", 2, FSDP + ['strategy.sharding="grad_op"']),
    ("gpt fsdp none 2", "gpt_text.toml", 2, FSDP + ['strategy.sharding="none"']),
    ("gpt fsdp full 2, recompute all", "gpt_text.toml", 2,
     FSDP + ['run.activation_checkpointing="all"']),
    ("gpt hsdp 2 x 2", "gpt_text.toml", 4,
     ["strategy.plugin=fsdp", "parallel.dp_replicate=2", "parallel.dp_shard=2"]),
    ("gpt ddp 4", "gpt_text.toml", 4, ["strategy.plugin=ddp", "parallel.dp_shard=4"]),
    ("gpt pipeline 2, gpipe", "gpt_text.toml", 2, PIPELINE + ['strategy.schedule="gpipe"']),
    ("gpt pipeline 2, 1f1b", "gpt_text.toml", 2, PIPELINE + ['strategy.schedule="1f1b"']),
    ("gpt pipeline 2, interleaved", "gpt_text.toml", 2,
     PIPELINE + ['strategy.schedule="interleaved_1f1b"', "strategy.virtual_stages=2"]),
    ("gpt pipeline 2, zero_bubble", "gpt_text.toml", 2,
     PIPELINE + ['strategy.schedule="zero_bubble"']),
    ("gpt tp 2", "gpt_text.toml", 2, TP),
    ("gpt fsdp 2 x tp 2", "gpt_text.toml", 4, FSDP + ["parallel.tp=2"]),
    ("gpt pipeline 2 x tp 2", "gpt_text.toml", 4,
     PIPELINE[:2] + ["parallel.tp=2", "parallel.dp_shard=1", "strategy.micro_batches=8"]),
    ("llama single", "llama_text.toml", 1, []),
    ("llama fsdp 2", "llama_text.toml", 2, FSDP),
    ("llama tp 2", "llama_text.toml", 2, TP),
]


def planned_ms(recipe, nproc, settings):
    command = [BINARY, "plan", recipe, "--nproc", str(nproc), "--json"]
    for setting in settings:
        command += ["--set", setting]
    plan = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    ranks = plan.get("pipeline_ranks") or [plan]
    return max(rank["step_seconds"] for rank in ranks) * 1e3


def measured_ms(recipe, nproc, settings, steps, output):
    """The median step of rank 0 after a warm-up of 2 steps."""
    run = [recipe, "--set", f"run.max_steps={steps}", "--set", "run.eval=false",
           "--set", f"run.output_dir={output}", "--set", "run.log_every=1",
           "--set", "loader.workers=0"]
    for setting in settings:
        run += ["--set", setting]
    command = [BINARY] + (["launch", "--nproc-per-node", str(nproc)] if nproc > 1 else ["run"]) + run
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
    path = sorted(glob.glob(os.path.join(output, "metrics*.jsonl")))[0]
    with open(path) as lines:
        times = [r["step_time_ms"] for r in map(json.loads, lines) if r["phase"] == "train"][2:]
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--only", default="")
    parser.add_argument("--tolerance", type=float, default=0.25)
    args = parser.parse_args()
    outside = 0
    print(f"{'layout':34} {'planned ms':>10} {'measured ms':>11} {'ratio':>6}")
    for name, recipe, nproc, settings in GRID:
        if args.only not in name:
            continue
        path = os.path.join(ROOT, "recipes", recipe)
        plan = planned_ms(path, nproc, settings)
        steps = max(args.steps, min(200, math.ceil(args.seconds * 1e3 / plan) + 2))
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as output:
                runs.append(measured_ms(path, nproc, settings, steps, output))
        measured = statistics.median(runs)
        ratio = plan / measured
        within = abs(ratio - 1) <= args.tolerance
        outside += not within
        print(f"{name:34} {plan:10.1f} {measured:11.1f} {ratio:6.2f}{'' if within else '  outside'}",
              flush=True)
    print(f"{outside} layout(s) outside 1 +- {args.tolerance}")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
