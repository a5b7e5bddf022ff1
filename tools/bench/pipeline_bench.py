"""The pipeline benchmark's report (tools/bench/pipeline_bench.sh runs the training first).

  pipeline_bench.py OUT TRAINYARD GLOBAL_BATCH

OUT holds single/ (one process), compare/ (trainyard compare's variants on 2 processes: ddp
and one pipeline run per schedule, each in run-1.. run-K when compare repeated them; its
table.txt and report.html) and compare.log (what compare printed). Prints the table (samples/s
as the median over a variant's runs and their spread, ratios to ddp and single, each pp rank's
measured idle share, the median over the runs, next to the formula), the floors the schedules
are held to, met or missed, and each schedule's measured step as text (its first run's, the one
compare draws); renders compare's report and its pipeline schedules alone to PNGs with headless
Chromium, and exits 1 naming what is missing or wrong: a run without metrics, a ratio that is
not finite and positive, a pipeline run without its timeline, or a picture that was not made. A
missed floor is reported, not an error: it measures the machine as much as the schedule.
"""

import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

SCHEDULES = ["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zero_bubble_v"]
VIRTUAL_STAGES = {"interleaved_1f1b": 2, "zero_bubble_v": 2}
MICRO_BATCHES = 8
PP = 2
COMPUTE = {"Forward": "F", "Backward": "B", "BackwardInput": "I", "BackwardWeight": "W"}
CHROMIUM = "/usr/bin/chromium"

problems = []


def problem(text):
    problems.append(text)
    print(f"pipeline_bench: {text}", file=sys.stderr)


def metrics_files(run_dir, processes):
    if processes == 1:
        return [os.path.join(run_dir, "metrics.jsonl")]
    return [os.path.join(run_dir, f"metrics.rank{rank}.jsonl") for rank in range(processes)]


def samples_per_s(run_dir, processes, global_batch):
    """Global samples/s: the global batch over the slowest rank's median step time in the
    logging intervals after the first (the warm-up, and the recorded step)."""
    step_ms = []
    for path in metrics_files(run_dir, processes):
        if not os.path.exists(path):
            problem(f"{path}: no metrics (the run's log says why)")
            return None
        with open(path) as f:
            train = [r for r in map(json.loads, f) if r.get("phase") == "train"][1:]
        if not train:
            problem(f"{path}: no train interval after the first (raise STEPS)")
            return None
        step_ms.append(statistics.median(r["step_time_ms"] for r in train))
    if not max(step_ms) > 0:
        problem(f"{run_dir}: median step time {max(step_ms)} ms")
        return None
    return global_batch * 1000 / max(step_ms)


def runs_of(folder):
    """A compare variant's run folders: run-1.. run-K when compare repeated it, else itself."""
    runs = glob.glob(os.path.join(folder, "run-*"))
    if not runs:
        return [folder]
    return sorted(runs, key=lambda path: int(path.rsplit("-", 1)[1]))


def read_timeline(run_dir):
    """Per pp rank, the actions of data-parallel rank 0's pipeline, as read_measured_timeline
    keeps them; None when the run wrote no timeline."""
    files = sorted(glob.glob(os.path.join(run_dir, "pipeline_timeline.rank*.json")))
    if not files:
        return None
    ranks = {}
    for path in files:
        with open(path) as f:
            timeline = json.load(f)
        if timeline["dp_rank"] == 0:
            ranks[timeline["pp_rank"]] = timeline
    return [ranks[r] for r in sorted(ranks)]


def idle_shares(timeline):
    """measured_idle_shares (sdk/src/parallel/pipeline_timeline.cpp): per rank, 1 - its compute time /
    the makespan of the compute actions over every rank."""
    compute = [[a for a in rank["actions"] if a["kind"] in COMPUTE] for rank in timeline]
    starts = [a["start_us"] for actions in compute for a in actions]
    ends = [a["end_us"] for actions in compute for a in actions]
    if not starts:
        return [0.0] * len(timeline)
    makespan = max(ends) - min(starts)
    return [1 - sum(a["end_us"] - a["start_us"] for a in actions) / makespan for actions in compute]


def backward_ms_per_micro_batch(timeline):
    """A micro-batch's whole backward through every stage, in ms: the recorded step's B (or I and
    W) durations over all ranks, divided by the micro-batches."""
    total_us = sum(a["end_us"] - a["start_us"] for rank in timeline for a in rank["actions"]
                   if a["kind"] in ("Backward", "BackwardInput", "BackwardWeight"))
    return total_us / 1000 / timeline[0]["micro_batches"]


def schedule_command(trainyard, schedule):
    """`trainyard schedule` for this schedule on the bench's shape (unit costs unless added)."""
    return [trainyard, "schedule", schedule, "--stages", str(PP), "--micro-batches",
            str(MICRO_BATCHES), "--virtual-stages", str(VIRTUAL_STAGES.get(schedule, 1))]


def schedule_formula(trainyard, schedule):
    """The formula's name and value `trainyard schedule` prints for this shape (unit costs)."""
    command = schedule_command(trainyard, schedule)
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = re.search(r"^mean idle share .*, formula (\S+) (=|at most) ([0-9.]+)%$", output, re.M)
    if not match:
        problem(f"no formula in the output of {' '.join(command)}:\n{output}")
        return None
    return match.group(1), match.group(2), float(match.group(3)) / 100


def message_seconds(trainyard, out):
    """What `trainyard plan` takes a message between the two pipeline ranks to cost: a message's
    latency and the largest message's bytes at its rate (the link measured once per host and
    cached); None when the plan gives no link."""
    command = [trainyard, "plan", os.path.join(out, "recipes", "1f1b.toml"), "--nproc", str(PP),
               "--json", "--set", "run.threads=1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        problem(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        return None
    plan = json.loads(done.stdout)
    link = plan.get("link")
    if not link:
        problem(f"{' '.join(command)}: the plan names no link")
        return None
    largest = max(rank["message_bytes"] for rank in plan["pipeline_ranks"])
    return link["message_latency_seconds"] + largest * link["message_seconds_per_byte"]


def simulated_with_link(trainyard, schedule, timeline, transfer_s):
    """Each rank's idle share in `trainyard schedule`'s simulation at the timeline's mean measured
    F, B, I and W (a full backward's halves half each), with each message between the ranks taking
    `transfer_s`: what the schedule leaves idle on this link with these costs, in 0.1 ms units."""
    durations = {}
    for rank in timeline:
        for action in rank["actions"]:
            if action["kind"] in COMPUTE:
                durations.setdefault(COMPUTE[action["kind"]], []).append(
                    action["end_us"] - action["start_us"])
    units = {kind: max(1, round(statistics.mean(us) / 100)) for kind, us in durations.items()}
    if "B" in units:
        units.setdefault("I", max(1, units["B"] // 2))
        units.setdefault("W", max(1, units["B"] - units["I"]))
    command = schedule_command(trainyard, schedule) + [
               "--forward-cost", str(units.get("F", 1)),
               "--input-gradient-cost", str(units.get("I", 1)),
               "--weight-gradient-cost", str(units.get("W", 1)),
               "--transfer-cost", str(round(transfer_s * 1e4))]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    shares = [float(m.group(1)) / 100
              for m in re.finditer(r"^rank \d+ \|.*\| idle \d+/\d+ = ([0-9.]+)%", output, re.M)]
    if len(shares) != PP:
        problem(f"no idle share per rank in the output of {' '.join(command)}:\n{output}")
        return None
    return shares


def compare_idle_lines(compare_log):
    """What compare printed per pipeline rank, by schedule (the variant's recipe stem): the
    measured idle share, and the formula at the step's measured mean costs, e.g.
    "3. 1f1b.toml: pipeline rank 0 idle 12.3% measured (1f1b, step 5), formula (p-1)/(m+p-1) = 11.1%"."""
    found = {}
    pattern = re.compile(r"^\d+\. (\S+)\.toml: pipeline rank (\d+) idle ([0-9.]+)% measured .*, "
                         r"formula \S+ (=|at most) ([0-9.]+)%$")
    if not os.path.exists(compare_log):
        return found
    with open(compare_log) as f:
        for match in filter(None, (pattern.match(line.rstrip("\n")) for line in f)):
            found.setdefault(match.group(1), {})[int(match.group(2))] = (
                float(match.group(3)) / 100, match.group(4), float(match.group(5)) / 100)
    return found


def label(action, virtual_stages):
    text = COMPUTE[action["kind"]] + str(action["micro_batch"])
    return f"{action['stage']}{text}" if virtual_stages > 1 else text


def timeline_text(timeline):
    """One row per pp rank: its compute actions in order with their milliseconds, and the time
    before each that the rank spent not computing (waiting, sending, receiving) as "(.. 2.3)"
    where it is at least half a millisecond."""
    rows = []
    for rank, t in enumerate(timeline):
        cells, clock = [], 0.0
        for a in t["actions"]:
            if a["kind"] not in COMPUTE:
                continue
            gap = (a["start_us"] - clock) / 1000
            if gap >= 0.5:
                cells.append(f"(.. {gap:.1f})")
            milliseconds = (a["end_us"] - a["start_us"]) / 1000
            cells.append(f"{label(a, t['virtual_stages'])} {milliseconds:.1f}")
            clock = a["end_us"]
        rows.append(f"  rank {rank} | " + "  ".join(cells))
    return rows


def chromium(args, profile):
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}"] + args
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def page_height(html, width, profile):
    """The page's height in pixels at this width: a copy that writes it into its title, loaded
    once (--dump-dom prints the page after its script ran). 4000 when that fails."""
    measure = html + ".height.html"
    script = "<script>document.title = String(document.documentElement.scrollHeight)</script>"
    with open(html) as source, open(measure, "w") as f:
        f.write(source.read().replace("</body>", script + "</body>"))
    result = chromium([f"--window-size={width},900", "--dump-dom",
                       f"file://{os.path.abspath(measure)}"], profile)
    os.remove(measure)
    match = re.search(r"<title>(\d+)</title>", result.stdout)
    return int(match.group(1)) if match else 4000


def screenshot(html, png, profile, width=1200):
    if os.path.exists(png):
        os.remove(png)  # an earlier run's must not pass for this one's
    height = page_height(html, width, profile)
    result = chromium([f"--screenshot={png}", f"--window-size={width},{height}",
                       f"file://{os.path.abspath(html)}"], profile)
    if result.returncode != 0 or not os.path.exists(png) or os.path.getsize(png) == 0:
        problem(f"chromium made no {png}:\n{result.stderr[-2000:]}")
        return
    with open(png, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            problem(f"{png} is not a PNG")


def pictures(out, compare_dir):
    """compare's report.html as report.png, and its pipeline schedules alone as schedules.png."""
    report = os.path.join(compare_dir, "report.html")
    if not os.path.exists(report):
        problem(f"{report}: trainyard compare wrote no report")
        return
    with open(report) as f:
        html = f.read()
    measured = html.count('data-timeline="measured"')
    if measured != len(SCHEDULES):
        problem(f"{report}: {measured} measured timelines drawn, expected {len(SCHEDULES)}")
    start, end = html.find("<h2>Pipeline schedules</h2>"), html.find("<h2>Variants</h2>")
    if start < 0 or end < start:
        problem(f"{report}: no pipeline schedules section")
        return
    head = html[: html.find("<body>") + len("<body>")]
    schedules = os.path.join(out, "schedules.html")
    with open(schedules, "w") as f:
        f.write(head + "\n" + html[start:end] + "</body>\n</html>\n")
    if os.environ.get("PIPELINE_BENCH_PICTURES", "1") == "0":
        return  # the report's checks without Chromium (its refusal tests break other pieces)
    profile = os.path.join(out, ".chromium-profile")
    screenshot(schedules, os.path.join(out, "schedules.png"), profile)
    screenshot(report, os.path.join(out, "report.png"), profile)
    shutil.rmtree(profile, ignore_errors=True)


def print_floors(rates, backward, idle, formulas, linked):
    """The floors the schedules are held to, each with its measured value, met or missed; then the
    idle shares against the simulation with the link (1.25 x it + 2 points), the measure a
    schedule can be held to where each message's latency is on its critical path."""
    lines = []

    def floor(text, value, bound, met):
        lines.append(f"  {text:50} {value:7.3f}  {bound:>11}  {'met' if met else 'MISSED'}")

    for name, base, bound in (("zero_bubble", "1f1b", 1.03), ("1f1b", "ddp", 0.85),
                              ("interleaved_1f1b", "1f1b", 1.0)):
        if name in rates and base in rates:
            ratio = rates[name] / rates[base]
            floor(f"{name} samples/s over {base}'s", ratio, f">= {bound:.2f}", ratio >= bound)
    if "zero_bubble" in backward and "1f1b" in backward:
        ratio = backward["zero_bubble"] / backward["1f1b"]
        floor("zero_bubble I + W over 1f1b's B, per micro-batch", ratio, "<= 1.10", ratio <= 1.1)
    for schedule, shares in idle.items():
        if formulas.get(schedule) is None:
            continue
        bound = 1.25 * formulas[schedule][2] + 0.02
        for rank, share in enumerate(shares):
            floor(f"{schedule} rank {rank} idle share", share, f"<= {bound:.3f}", share <= bound)
    if lines:
        print("\nfloors (idle: 1.25 x the formula + 2 points):")
        print("\n".join(lines))
    beside = []
    for schedule, shares in idle.items():
        for rank, (share, simulated) in enumerate(zip(shares, linked.get(schedule) or [])):
            bound = 1.25 * simulated + 0.02
            beside.append(f"  {schedule + f' rank {rank} idle share':50} {share:7.3f}  "
                          f"{f'<= {bound:.3f}':>11}  {'within' if share <= bound else 'above'}")
    if beside:
        print("\nidle against the simulation with the link (1.25 x it + 2 points):")
        print("\n".join(beside))


def percent(share, relation="="):
    return ("<=" if relation == "at most" else "") + f"{100 * share:.1f}%"


def main():
    out, trainyard, global_batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    compare_dir = os.path.join(out, "compare")
    folders = {}
    for folder in glob.glob(os.path.join(compare_dir, "*-*")):
        if os.path.isdir(folder):
            folders[os.path.basename(folder).split("-", 1)[1]] = folder
    table = os.path.join(compare_dir, "table.txt")
    if not os.path.exists(table):
        problem(f"{table}: trainyard compare wrote no table (see {out}/compare.log)")
    for line in open(table) if os.path.exists(table) else []:
        if " FAILED " in line:
            problem(f"{table}: {line.strip()}")

    rows = [("single", f"1 process x batch {global_batch}", os.path.join(out, "single")),
            ("ddp", f"2 ranks x batch {global_batch // 2}", folders.get("ddp"))]
    for schedule in SCHEDULES:
        v = VIRTUAL_STAGES.get(schedule, 1)
        rows.append((schedule, f"pp 2, {MICRO_BATCHES} micro-batches" + (f", v {v}" if v > 1 else ""),
                     folders.get(schedule)))
    rates, spreads = {}, {}
    for name, _, folder in rows:
        if folder is None:
            problem(f"{compare_dir}: no variant folder for {name} (see {out}/compare.log)")
            continue
        processes = 1 if name == "single" else 2
        runs = [samples_per_s(run, processes, global_batch) for run in runs_of(folder)]
        if None not in runs:
            rates[name] = statistics.median(runs)
            spreads[name] = (max(runs) - min(runs)) / rates[name]

    printed = compare_idle_lines(os.path.join(out, "compare.log"))
    transfer_s = message_seconds(trainyard, out)
    timelines, all_timelines, medians, formulas, cells, linked = {}, {}, {}, {}, {}, {}
    for schedule in SCHEDULES:
        folder = folders.get(schedule)
        runs = [read_timeline(run) for run in runs_of(folder)] if folder else [None]
        if any(timeline is None or len(timeline) != PP for timeline in runs):
            problem(f"{folder or schedule}: no measured timeline of {PP} pp ranks")
            continue
        timelines[schedule], all_timelines[schedule] = runs[0], runs
        # compare reads the first run's files through read_measured_timeline: both must agree.
        ranks = printed.get(schedule, {})
        for rank, share in enumerate(idle_shares(runs[0])):
            if rank not in ranks or abs(ranks[rank][0] - share) > 0.0006:
                problem(f"{schedule}: rank {rank}'s idle share is {percent(share)} here, but compare "
                        f"printed {percent(ranks[rank][0]) if rank in ranks else 'none'}")
        shares = [statistics.median(column) for column in zip(*map(idle_shares, runs))]
        medians[schedule] = shares
        formula = schedule_formula(trainyard, schedule)
        formulas[schedule] = formula
        if transfer_s is not None:
            linked[schedule] = simulated_with_link(trainyard, schedule, runs[0], transfer_s)
        with_link = linked.get(schedule)
        cells[schedule] = [percent(s) for s in shares] + [
            percent(formula[2], formula[1]) if formula else "?",
            percent(ranks[0][2], ranks[0][1]) if 0 in ranks else "?",
            "/".join(f"{100 * s:.1f}" for s in with_link) if with_link else "?",
            formula[0] if formula else ""]

    print(f"pipeline benchmark: gpt_text (4 layers, d_model 128, seq 128), global batch {global_batch}, "
          "1 thread per process, gloo")
    repeats = max((len(runs_of(folder)) for _, _, folder in rows if folder), default=1)
    print("samples/s: global batch / the slowest rank's median step time over the logging intervals "
          f"after the first, the median over {repeats} interleaved run(s) of each compare variant "
          "(single: one run); spread: (highest - lowest) / median; vs ddp, vs single: samples/s "
          "over theirs (above 1: faster)")
    print("idle r0, r1: each pp rank's share of the recorded step's compute makespan spent not "
          "computing, the median over the runs; formula: as `trainyard schedule` prints it (unit "
          "costs); at costs: the same formula at the first run's mean measured F, B, I, W (compare's); "
          "with link: each rank's idle % simulated at those costs with each message between the ranks "
          + (f"taking {1e3 * transfer_s:.2f} ms (a message's latency and bytes, as `trainyard plan` "
             "measures them)" if transfer_s is not None else "(no link measured)"))
    print(f"{'run':17} {'shape':30} {'samples/s':>9} {'spread':>6} {'vs ddp':>7} {'vs single':>9}   "
          f"{'idle r0':>7} {'idle r1':>7} {'formula':>8} {'at costs':>8} {'with link':>10}  formula")
    for name, shape, _ in rows:
        line = f"{name:17} {shape:30} "
        if name not in rates:
            print(line + "FAILED")
            continue
        ratios = [rates[name] / rates[base] if base in rates else math.nan for base in ("ddp", "single")]
        for base, ratio in zip(("ddp", "single"), ratios):
            if not (math.isfinite(ratio) and ratio > 0):
                problem(f"{name}: the ratio to {base} is {ratio}")
        line += f"{rates[name]:9.1f} {percent(spreads[name]):>6} {ratios[0]:7.2f} {ratios[1]:9.2f}"
        if name in cells:
            c = cells[name]
            line += f"   {c[0]:>7} {c[1]:>7} {c[2]:>8} {c[3]:>8} {c[4]:>10}  {c[5]}"
        print(line)

    backward = {schedule: statistics.median(map(backward_ms_per_micro_batch, runs))
                for schedule, runs in all_timelines.items()}
    if "1f1b" in backward:
        print("\nbackward of one micro-batch through the whole model (ms, the recorded step's B, or "
              "I + W, over every rank, per micro-batch, the median over the runs) and over 1f1b's:")
        for schedule, ms in backward.items():
            print(f"  {schedule:17} {ms:6.2f}  {ms / backward['1f1b']:5.2f}x")

    print_floors(rates, backward, medians, formulas, linked)

    for schedule, timeline in timelines.items():
        print(f"\n{schedule}, measured step {timeline[0]['step']}: ms per compute action (F/B/I/W and "
              "micro-batch; 2F3: stage 2's), (.. x): x ms not computing before it")
        for row in timeline_text(timeline):
            print(row)

    pictures(out, compare_dir)
    print(f"\nreport: {os.path.join(compare_dir, 'report.html')}")
    print(f"pictures: {os.path.join(out, 'schedules.png')} (the pipeline schedules), "
          f"{os.path.join(out, 'report.png')} (the whole report)")
    if problems:
        print(f"pipeline_bench: {len(problems)} problem(s), see above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
