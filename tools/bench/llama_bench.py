"""The llama benchmark: recipes/llama_text.toml in trainyard with its defaults against the same
training in Python PyTorch eager two ways (tools/bench/llama_python.py): transformers'
LlamaForCausalLM, and a plain PyTorch Llama written from the architecture. Same configuration,
batch, optimizer, schedule and clipping; the same LibTorch from the venv, at each side's default
thread count.

Runs alternate (trainyard, transformers, plain, trainyard, ...) so a shared machine's drift reaches
every side alike; a run's step time is the median of its logging intervals after the first
(start-up, the automatic loader's measuring steps), a side's the median over its runs, and
tokens/s = batch x sequence length / step time.

    llama_bench.py <trainyard binary> <source dir>

Environment: LLAMA_REPEATS (runs per side, default 5), LLAMA_STEPS (steps per run, default 60,
logged every 10), LLAMA_SMOKE=1 (one run a side of 6 steps, no floors checked: proves the
benchmark runs).

Exits 1 when trainyard's tokens/s is under 1.1x transformers' or under 1.0x the plain Llama's.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

TOKENS_PER_STEP = 16 * 128  # the recipe's batch_size x seq_len
# way: floor of trainyard tokens/s over the way's
FLOORS = {"transformers": 1.1, "plain": 1.0}


def median_after_first(intervals, what):
    if len(intervals) < 2:
        raise SystemExit(f"llama bench: {what} reported {len(intervals)} intervals, need 2")
    return statistics.median(intervals[1:])


def trainyard_run(binary, source, work, run, steps, log_every):
    out = os.path.join(work, f"run{run}")
    done = subprocess.run(
        [binary, "run", "recipes/llama_text.toml", "--set", f"run.max_steps={steps}",
         "--set", f"run.log_every={log_every}", "--set", "run.eval=false",
         "--set", f"run.output_dir={out}", "--set", "sinks.console.enabled=false"],
        cwd=source, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llama bench: trainyard failed:\n{done.stderr}")
    intervals = []
    with open(os.path.join(out, "metrics.jsonl")) as lines:
        for line in lines:
            record = json.loads(line)
            if record.get("phase") == "train":
                intervals.append(record["step_time_ms"])
    return median_after_first(intervals, "trainyard")


def python_run(source, way, steps, log_every):
    python = os.path.join(source, ".venv", "bin", "python")
    script = os.path.join(source, "tools", "bench", "llama_python.py")
    done = subprocess.run([python, script, way, str(steps), str(log_every)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llama bench: Python {way} failed:\n{done.stderr}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return median_after_first(report["step_ms"], f"Python {way}"), report["threads"]


def main():
    binary, source = sys.argv[1], sys.argv[2]
    smoke = os.environ.get("LLAMA_SMOKE") == "1"
    repeats = 1 if smoke else int(os.environ.get("LLAMA_REPEATS", "5"))
    steps, log_every = (6, 2) if smoke else (int(os.environ.get("LLAMA_STEPS", "60")), 10)
    work = tempfile.mkdtemp(prefix="llama_bench_")
    times = {"trainyard": [], "transformers": [], "plain": []}
    threads = {}
    for run in range(repeats):
        times["trainyard"].append(trainyard_run(binary, source, work, run, steps, log_every))
        for way in FLOORS:
            step, threads[way] = python_run(source, way, steps, log_every)
            times[way].append(step)
    medians = {way: statistics.median(values) for way, values in times.items()}
    ok = True
    print(f"llama: recipes/llama_text.toml, {TOKENS_PER_STEP} tokens a step, median over "
          f"{repeats} interleaved runs a side (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)")
    print(f"{'way':13} {'step ms':>9} {'tokens/s':>10} {'trainyard/x':>12} {'floor':>6} "
          f"{'threads':>8}")
    ours = TOKENS_PER_STEP / medians["trainyard"] * 1e3
    print(f"{'trainyard':13} {medians['trainyard']:9.2f} {ours:10.0f} {'':>12} {'':>6} {'':>8}")
    for way, floor in FLOORS.items():
        theirs = TOKENS_PER_STEP / medians[way] * 1e3
        ratio = ours / theirs
        passed = smoke or ratio >= floor
        ok = ok and passed
        print(f"{way:13} {medians[way]:9.2f} {theirs:10.0f} {ratio:12.3f} {floor:6.2f} "
              f"{threads[way]:8d}{'' if passed else '  BELOW FLOOR'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
