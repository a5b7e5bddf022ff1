#!/usr/bin/env python3
"""tools/golden against a stand-in host that logs chosen losses: a curve of this platform must
match bit for bit, a curve of another platform only nearly, a run near none fails, update keeps
the other platforms' curves, and a file with a loss before any platform line is refused."""
import os
import stat
import subprocess
import sys
import tempfile
from importlib.machinery import SourceFileLoader

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
golden = SourceFileLoader("golden", os.path.join(SOURCE, "tools", "golden")).load_module()

# Writes metrics.jsonl under run.output_dir with the losses in $GOLDEN_TEST_LOSSES (one per line).
STAND_IN_HOST = """#!{python}
import json, os, sys
out = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("run.output_dir="))
with open(os.environ["GOLDEN_TEST_LOSSES"]) as source, open(os.path.join(out, "metrics.jsonl"), "w") as sink:
    for step, line in enumerate(source, 1):
        sink.write(json.dumps({{"phase": "train", "step": step, "loss": float.fromhex(line.strip())}}) + "\\n")
"""


def main():
    failures = []

    def expect(condition, what):
        if not condition:
            failures.append(what)

    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "tests", "golden"))
        os.makedirs(os.path.join(root, "recipes"))
        golden.ROOT = root
        host = os.path.join(root, "host")
        with open(host, "w", encoding="utf-8") as file:
            file.write(STAND_IN_HOST.format(python=sys.executable))
        os.chmod(host, os.stat(host).st_mode | stat.S_IEXEC)
        losses_file = os.path.join(root, "losses")
        os.environ["GOLDEN_TEST_LOSSES"] = losses_file

        def host_logs(losses):
            with open(losses_file, "w", encoding="utf-8") as file:
                file.writelines(loss.hex() + "\n" for loss in losses)

        here = golden.numeric_platform()
        expect(len(here.split()) >= 6 and " family " in here, f"platform name {here!r}")
        curve = [2.0 - 0.01 * step for step in range(golden.STEPS)]
        elsewhere = [loss * (1 + 3e-6) for loss in curve]

        # Recorded elsewhere only: near passes, far fails.
        golden.write_golden("r", {"other cpu": elsewhere})
        host_logs(curve)
        expect(golden.check(host, "r"), "a run near another platform's curve passes")
        host_logs([loss * (1 + 3e-5) for loss in elsewhere])
        expect(not golden.check(host, "r"), "a run 3e-5 from every curve fails")
        tail_off = list(curve)
        tail_off[-1] *= 1 + 2 * golden.TAIL_RTOL
        host_logs(tail_off)
        expect(not golden.check(host, "r"), "a run twice the tail tolerance off at its last step "
                                            "fails")

        # update adds this platform's curve and keeps the other one; now bitwise applies.
        host_logs(curve)
        golden.update(host, "r")
        curves = golden.read_golden("r")
        expect(list(curves) == ["other cpu", here], f"update keeps both curves: {list(curves)}")
        expect(curves[here] == curve and curves["other cpu"] == elsewhere, "curves as written")
        expect(golden.check(host, "r"), "the recorded run matches bit for bit")
        one_ulp = list(curve)
        one_ulp[40] = one_ulp[40] + one_ulp[40] * 2.0 ** -52
        host_logs(one_ulp)
        expect(not golden.check(host, "r"), "one loss an ulp off fails where the platform's curve "
                                            "is recorded")

        # A loss before any platform line is refused with a one-line reason.
        with open(golden.golden_file("bare"), "w", encoding="utf-8") as file:
            file.write(curve[0].hex() + "\n")
        result = subprocess.run(
            [sys.executable, "-c",
             "import sys; from importlib.machinery import SourceFileLoader as L; "
             f"g = L('golden', {os.path.join(SOURCE, 'tools', 'golden')!r}).load_module(); "
             f"g.ROOT = {root!r}; g.read_golden('bare')"], capture_output=True, text=True,
            check=False)
        expect(result.returncode != 0 and "before any '# platform' line" in result.stderr,
               f"a bare loss is refused: {result.returncode} {result.stderr!r}")

    # The repository's own files hold a curve of 100 losses per platform.
    golden.ROOT = SOURCE
    for recipe in golden.RECIPES:
        curves = golden.read_golden(recipe)
        expect(curves and all(len(c) == golden.STEPS for c in curves.values()),
               f"tests/golden/{recipe}.losses")

    for failure in failures:
        print("FAILED:", failure, file=sys.stderr)
    print(f"golden_test: {'failed' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
