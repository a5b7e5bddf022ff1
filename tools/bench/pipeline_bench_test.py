"""The pipeline benchmark's report refuses an incomplete run: from the output of a good one
(OUT of `pipeline_bench.sh --smoke`), each case breaks one piece of a copy and expects
pipeline_bench.py to exit 1 naming it; the untouched copy passes. Prints one line per case.

  pipeline_bench_test.py OUT TRAINYARD
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))


def remove(pattern):
    def breaks(copy):
        files = glob.glob(os.path.join(copy, pattern))
        assert files, f"nothing matches {pattern} in {copy}"
        for path in files:
            os.remove(path)
    return breaks


def rewrite(pattern, old, new, count=1):
    def breaks(copy):
        [path] = glob.glob(os.path.join(copy, pattern))
        text = open(path).read()
        changed = re.sub(old, new, text, count=count, flags=re.M)
        assert changed != text, f"{old} not in {path}"
        open(path, "w").write(changed)
    return breaks


# (what is broken, how, what the report must say); the first keeps the copy whole.
CASES = [
    ("nothing", None, [r"pictures: .*schedules\.png",
                       r"each message between the ranks taking [0-9.]+ ms",
                       r"idle against the simulation with the link"]),
    ("the recipe the link is planned with", remove("recipes/1f1b.toml"),
     [r"plan \S+1f1b\.toml .*failed"]),
    ("a rank's metrics", remove("compare/*-ddp/metrics.rank1.jsonl"),
     [r"-ddp/metrics\.rank1\.jsonl: no metrics", r"ddp +2 ranks x batch 8 +FAILED"]),
    ("a step time of 0",
     rewrite("single/metrics.jsonl", r'"step_time_ms":[0-9.e+-]+', '"step_time_ms":0', count=0),
     [r"single: median step time 0(\.0)? ms", r"gpipe: the ratio to single is nan"]),
    ("a pipeline rank's timeline", remove("compare/*-1f1b/pipeline_timeline.rank1.json"),
     [r"-1f1b: no measured timeline of 2 pp ranks"]),
    ("a failed variant", rewrite("compare/table.txt", r"^(\d+ +\S+) +ok ", r"\1  FAILED "),
     [r"table\.txt: \d+ +\S+ +FAILED"]),
    ("compare's idle share",
     rewrite("compare.log", r"(gpipe\.toml: pipeline rank 0 idle )[0-9.]+%", r"\g<1>99.9%"),
     [r"gpipe: rank 0's idle share is [0-9.]+% here, but compare printed 99\.9%"]),
    ("the report", remove("compare/report.html"), [r"report\.html: trainyard compare wrote no report"]),
]


def main():
    out, trainyard = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as scratch:
        for number, (what, breaks, expected) in enumerate(CASES):
            copy = os.path.join(scratch, str(number))
            shutil.copytree(out, copy, ignore=shutil.ignore_patterns("*.png", ".chromium-profile"))
            if breaks:
                breaks(copy)
            command = [sys.executable, os.path.join(here, "pipeline_bench.py"), copy, trainyard, "16"]
            # Pictures only for the intact copy: a broken one is refused before they matter.
            environment = dict(os.environ, PIPELINE_BENCH_PICTURES="1" if breaks is None else "0")
            result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                                    env=environment)
            output = result.stdout + result.stderr
            want = 0 if breaks is None else 1
            ok = result.returncode == want and all(re.search(e, output) for e in expected)
            if breaks is None and ok:
                pngs = [os.path.join(copy, name) for name in ("schedules.png", "report.png")]
                ok = all(os.path.getsize(png) > 0 for png in pngs)
            print(f"{'ok' if ok else 'FAILED'}: {'broken: ' + what if breaks else 'intact'}: exit "
                  f"{result.returncode} (expected {want})")
            if not ok:
                failures += 1
                print(f"  expected {expected} in:\n{output}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
