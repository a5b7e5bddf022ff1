"""The peers benchmark: each bundled recipe in trainyard with its defaults against the same model,
optimizer, schedule and batches in Python PyTorch eager (tools/bench/peers_python.py), and a
sweep of trainyard's loader.workers x run.threads against the default.

Runs alternate (trainyard, Python, trainyard, ...) so a shared machine's drift reaches both
sides alike; each run's step time is the median of its logging intervals after the first (start,
the automatic loader's measuring steps), and a side's time is the median over its runs.

    peers_bench.py <trainyard binary> <source dir>

Environment: PEERS_RECIPES (default all three), PEERS_REPEATS (runs per side, default 7),
PEERS_SWEEP_REPEATS (runs per sweep configuration, default 5; 0: no sweep), PEERS_IMPLEMENTATION
(the optimizers' update path on both sides: auto, single, foreach or fused), PEERS_STEPS_SCALE
(multiplies each recipe's steps, default 1), PEERS_SMOKE=1 (3 intervals of 2 steps a run, one
repeat, the default and two corners of the sweep once on the first recipe, no floors checked:
proves the benchmark runs).

Exits 1 when a ratio Python / trainyard is under its recipe's floor or the default is more than
3% slower than the sweep's best configuration (not in smoke runs).
"""

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

# recipe: (steps, log_every, floor of Python / trainyard)
RECIPES = {
    "fashion_mnist_mlp": (600, 100, 1.5),
    "fashion_mnist_cnn": (150, 25, 1.05),
    "gpt_text": (60, 10, 1.1),
}
# The default may be this much slower than the sweep's best configuration.
SWEEP_TOLERANCE = 0.03


def median_after_first(intervals, what):
    if len(intervals) < 2:
        raise SystemExit(f"peers: {what} reported {len(intervals)} intervals, need at least 2")
    return statistics.median(intervals[1:])


class Bench:
    def __init__(self, trainyard, source):
        self.trainyard = trainyard
        self.source = source
        self.python = os.path.join(source, ".venv", "bin", "python")
        self.smoke = os.environ.get("PEERS_SMOKE") == "1"
        self.scale = float(os.environ.get("PEERS_STEPS_SCALE", "1"))
        self.work = tempfile.mkdtemp(prefix="peers_")
        self.runs = 0

    def steps(self, recipe):
        steps, log_every, _ = RECIPES[recipe]
        if self.smoke:
            return 6, 2
        return max(2 * log_every, int(steps * self.scale) // log_every * log_every), log_every

    def trainyard_run(self, recipe, sets=()):
        steps, log_every = self.steps(recipe)
        self.runs += 1
        out = os.path.join(self.work, f"run{self.runs}")
        args = [self.trainyard, "run", f"recipes/{recipe}.toml", "--set", f"run.max_steps={steps}",
                "--set", f"run.log_every={log_every}", "--set", "run.eval=false",
                "--set", f"run.output_dir={out}", "--set", "sinks.console.enabled=false"]
        if recipe.startswith("fashion_mnist"):
            args += ["--set", "checkpoint.at_end=false", "--set", "checkpoint.every_steps=0"]
        implementation = os.environ.get("PEERS_IMPLEMENTATION")
        if implementation:
            args += ["--set", f"optimizer.implementation={implementation}"]
        for item in sets:
            args += ["--set", item]
        done = subprocess.run(args, cwd=self.source, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"peers: trainyard {recipe} failed:\n{done.stderr}")
        intervals, summary = [], {}
        with open(os.path.join(out, "metrics.jsonl")) as lines:
            for line in lines:
                record = json.loads(line)
                if record.get("phase") == "train":
                    intervals.append(record["step_time_ms"])
                elif record.get("phase") == "summary":
                    summary = record
        return median_after_first(intervals, f"trainyard {recipe}"), summary

    def python_run(self, recipe):
        steps, log_every = self.steps(recipe)
        script = os.path.join(self.source, "tools", "bench", "peers_python.py")
        done = subprocess.run([self.python, script, recipe, str(steps), str(log_every)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"peers: Python {recipe} failed:\n{done.stderr}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        return median_after_first(report["step_ms"], f"Python {recipe}"), report["threads"]

    def peers(self, recipes, repeats):
        rows, ok = [], True
        for recipe in recipes:
            ours, theirs, threads, chosen = [], [], None, ""
            for _ in range(repeats):
                step, summary = self.trainyard_run(recipe)
                ours.append(step)
                chosen = (f"{int(summary.get('loader_workers', -1))}w/"
                          f"{int(summary.get('compute_threads', -1))}t")
                step, threads = self.python_run(recipe)
                theirs.append(step)
            ty, py = statistics.median(ours), statistics.median(theirs)
            floor = RECIPES[recipe][2]
            ratio = py / ty
            passed = self.smoke or ratio >= floor
            ok = ok and passed
            rows.append((recipe, ty, py, ratio, floor, chosen, threads, passed))
        print(f"peers: median step time over {repeats} interleaved runs a side "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        print(f"{'recipe':18} {'trainyard ms':>12} {'python ms':>10} {'py/ty':>6} {'floor':>6} "
              f"{'default':>8} {'py threads':>10}")
        for recipe, ty, py, ratio, floor, chosen, threads, passed in rows:
            print(f"{recipe:18} {ty:12.3f} {py:10.3f} {ratio:6.3f} {floor:6.2f} {chosen:>8} "
                  f"{threads:10d}{'' if passed else '  BELOW FLOOR'}")
        return ok

    def sweep(self, recipes, repeats):
        cores = os.cpu_count() or 1
        threads = sorted({1, max(1, cores // 2), cores})
        workers = sorted({0, 1, min(2, cores)})
        grid = [(w, t) for w in workers for t in threads]
        if self.smoke:
            # The corners of the grid: enough to prove that every kind of run works.
            workers, threads = [workers[0], workers[-1]], [threads[0], threads[-1]]
            grid = [(workers[0], threads[0]), (workers[-1], threads[-1])]
        ok = True
        for recipe in recipes:
            configurations = [None] + grid
            times = {c: [] for c in configurations}
            for _ in range(repeats):
                order = list(configurations)
                random.shuffle(order)
                for configuration in order:
                    sets = () if configuration is None else (
                        f"loader.workers={configuration[0]}", f"run.threads={configuration[1]}")
                    times[configuration].append(self.trainyard_run(recipe, sets)[0])
            medians = {c: statistics.median(v) for c, v in times.items()}
            best = min(grid, key=lambda c: medians[c])
            default = medians[None]
            passed = self.smoke or default <= medians[best] * (1 + SWEEP_TOLERANCE)
            ok = ok and passed
            print(f"sweep {recipe}: median step ms over {repeats} runs each (rows loader.workers, "
                  f"columns run.threads)")
            print("workers " + "".join(f"{t:>9}" for t in threads))
            for w in workers:
                print(f"{w:7} " + "".join(f"{medians[(w, t)]:9.3f}" if (w, t) in medians
                                          else f"{'-':>9}" for t in threads))
            print(f"default {default:.3f} ms, best {medians[best]:.3f} ms (workers {best[0]}, "
                  f"threads {best[1]}): default / best {default / medians[best]:.3f}"
                  f"{'' if passed else '  MORE THAN 3% SLOWER'}")
        return ok


def main():
    trainyard, source = sys.argv[1], sys.argv[2]
    bench = Bench(trainyard, source)
    recipes = os.environ.get("PEERS_RECIPES", " ".join(RECIPES)).split()
    for recipe in recipes:
        if recipe not in RECIPES:
            raise SystemExit(f"peers: unknown recipe '{recipe}' ({', '.join(RECIPES)})")
    repeats = 1 if bench.smoke else int(os.environ.get("PEERS_REPEATS", "7"))
    sweep_repeats = 1 if bench.smoke else int(os.environ.get("PEERS_SWEEP_REPEATS", "5"))
    ok = bench.peers(recipes, repeats)
    if sweep_repeats > 0:
        # A smoke run sweeps the first recipe only: the sweep's runs differ in settings, not code.
        ok = bench.sweep(recipes[:1] if bench.smoke else recipes, sweep_repeats) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
