#!/usr/bin/env python3
"""Plan against measurement: `trainyard plan --json` beside the same layout run for a few steps
with run.track_memory, per rank, as ratios (planned / measured).

    tools/plan/check_plan.py RECIPE NPROC [--set k=v ...] [--steps N]

Prints one line per rank and exits 1 when a figure is off by more than --tolerance (default
0.10)."""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "bin", "trainyard")
PHASES = ["data_wait", "h2d", "forward", "backward", "comm_wait", "optimizer"]


def planned(recipe, nproc, settings):
    command = [BINARY, "plan", recipe, "--nproc", str(nproc), "--json"]
    for setting in settings:
        command += ["--set", setting]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def measured(recipe, nproc, settings, steps, output):
    run = [recipe, "--set", "run.track_memory=true", "--set", f"run.max_steps={steps}",
           "--set", "run.eval=false", "--set", f"run.output_dir={output}",
           "--set", 'sinks.jsonl.path=""', "--set", "run.log_every=1"]
    for setting in settings:
        run += ["--set", setting]
    command = [BINARY] + (["launch", "--nproc-per-node", str(nproc)] if nproc > 1 else ["run"]) + run
    subprocess.run(command, check=True, capture_output=True, text=True)
    ranks = []
    for path in sorted(glob.glob(os.path.join(output, "metrics*.jsonl"))):
        with open(path) as lines:
            records = [json.loads(line) for line in lines]
        summary = [r for r in records if r["phase"] == "summary"][-1]
        times = sorted(r["step_time_ms"] for r in records if r["phase"] == "train")[2:] or [0]
        summary["step_ms"] = times[len(times) // 2]
        ranks.append(summary)
    return ranks


def figures(record):
    values = record.get("values", record)
    return {
        "held_parameters": values["held_parameter_bytes"],
        "gradients": values["held_gradient_bytes"],
        "optimizer_state": values["held_optimizer_bytes"],
        "forward_held": values["memory_activation_bytes"],
        "step_start": values["memory_step_start_bytes"],
        "peak": values["memory_step_peak_bytes"],
        "peak_phase": PHASES[int(values["memory_step_peak_phase"])],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    parser.add_argument("nproc", type=int)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    plan = planned(args.recipe, args.nproc, args.set)
    with tempfile.TemporaryDirectory() as output:
        ranks = measured(args.recipe, args.nproc, args.set, args.steps, output)
    worst = 0.0
    print(plan["layout"])
    stages = plan.get("pipeline_ranks")
    for rank, record in enumerate(ranks):
        got = figures(record)
        # Pipeline stages are the mesh's outermost axis: pp rank = rank // (ranks per stage).
        expected = stages[rank // (len(ranks) // len(stages))] if stages else plan
        cells = []
        for key in ["held_parameters", "gradients", "optimizer_state", "forward_held", "step_start", "peak"]:
            ratio = expected[key] / got[key] if got[key] else (1.0 if expected[key] == 0 else float("inf"))
            worst = max(worst, abs(ratio - 1.0))
            cells.append(f"{key} {expected[key] / 2**20:.2f}/{got[key] / 2**20:.2f} MiB ({ratio:.3f})")
        cells.append(f"peak phase {expected['peak_phase']}/{got['peak_phase']}")
        cells.append(f"step {expected['step_seconds'] * 1e3:.1f}/{record['step_ms']:.1f} ms "
                     f"({expected['step_seconds'] * 1e3 / max(record['step_ms'], 1e-9):.2f})")
        print(f"rank {rank}: " + ", ".join(cells))
    print(f"worst deviation {worst:.3f}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
