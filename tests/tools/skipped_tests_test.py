#!/usr/bin/env python3
"""tools/skipped_tests against JUnit files shaped like ctest's: the skip reasons are listed, and a
GPU-only skip outside tools/gpu/cuda_tests.filter fails the run (as a filter naming no real test
would). Also the real filter selects the GPU-only tests the suites hold today."""
import os
import subprocess
import sys
import tempfile

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(SOURCE, "tools", "skipped_tests")
FILTER = os.path.join(SOURCE, "tools", "gpu", "cuda_tests.filter")


def junit(*cases):
    body = "".join(
        f'<testcase name="{name}" classname="{name}" status="notrun">'
        f'<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>'
        f"<system-out>/src/x.cpp:3: Skipped\n{reason}\n\n[  SKIPPED ] {name}\n</system-out>"
        f"</testcase>" for name, reason in cases)
    return f'<?xml version="1.0"?><testsuite tests="{len(cases)}">{body}' \
           '<testcase name="Ran.Ok" status="run"><system-out></system-out></testcase></testsuite>'


def run(xml_text):
    with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as file:
        file.write(xml_text)
    try:
        return subprocess.run([sys.executable, SCRIPT, file.name, FILTER], capture_output=True,
                              text=True, check=False)
    finally:
        os.unlink(file.name)


def expect(condition, message):
    if not condition:
        print("FAILED:", message)
        sys.exit(1)


# The GPU-only tests of the suites (their names as ctest reports them) are all selected.
gpu_only = ["ParameterInit.ACudaTensorGetsTheCpuValues",
            "ActivationCheckpointing.GradientsIdenticalWithDropoutOnCuda",
            "PrecisionOnCuda.Bf16AndFp16StepsRunOnTheGpu",
            "DeviceConformance.MemoryAndEvents/cuda  # GetParam() = &quot;cuda&quot;",
            "CommConformance.AllReduceSumMaxAndMin/nccl"]
result = run(junit(*[(name, "[gpu only] no CUDA device") for name in gpu_only],
                   ("Chromium.Renders", "the environment lacks what this test needs\nno chromium")))
expect(result.returncode == 0, f"covered GPU-only skips failed: {result.stdout}{result.stderr}")
expect("6 tests skipped" in result.stdout, result.stdout)
expect("Chromium.Renders: the environment lacks what this test needs no chromium" in result.stdout,
       result.stdout)
expect("Ran.Ok" not in result.stdout, "a test that ran is listed as skipped")

# A GPU-only test the filter does not select fails the run and is named.
result = run(junit(("Layers.HalfPrecisionOnTheDevice", "[gpu only] no CUDA device")))
expect(result.returncode == 1, f"uncovered GPU-only skip passed: {result.stdout}")
expect("Layers.HalfPrecisionOnTheDevice" in result.stderr, result.stderr)

# Nothing skipped says so; an unreadable file is an error, not a pass.
expect("no test skipped" in run(junit()).stdout, "empty run")
expect(run("not xml").returncode == 2, "unreadable results accepted")
print("skipped_tests: all checks passed")
