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



def gtest_xml(suite, cases):
    """GoogleTest's XML for one suite's process: (test, skip message or None) per case."""
    body = "".join(
        f'<testcase name="{name}" status="run" result="{"skipped" if message else "completed"}" '
        f'classname="{suite}">' + (f'<skipped message="{message}"/>' if message else "") +
        "</testcase>" for name, message in cases)
    return (f'<?xml version="1.0"?><testsuites><testsuite name="{suite}" tests="{len(cases)}">'
            f"{body}</testsuite></testsuites>")


def run_with_suites(suites, ctest_names):
    """tools/skipped_tests on a ctest file naming ctest_names, with GoogleTest XML per suite."""
    with tempfile.TemporaryDirectory() as folder:
        for index, (suite, cases) in enumerate(suites):
            os.makedirs(os.path.join(folder, "gtest", f"binary{index}"))
            with open(os.path.join(folder, "gtest", f"binary{index}", "s.xml"), "w") as file:
                file.write(gtest_xml(suite, cases))
        ctest = os.path.join(folder, "ctest.xml")
        with open(ctest, "w") as file:
            file.write('<?xml version="1.0"?><testsuite>' + "".join(
                f'<testcase name="{name}" status="run"/>' for name in ctest_names) + "</testsuite>")
        return subprocess.run([sys.executable, SCRIPT, ctest, FILTER, "--gtest-results",
                               os.path.join(folder, "gtest")], capture_output=True, text=True,
                              check=False)


# Suites run as one process each: their cases are counted and their skips read from GoogleTest's
# XML, the file:line that starts a skip message left out; the scripts ctest runs count once each.
result = run_with_suites(
    [("PrecisionOnCuda", [("Bf16AndFp16StepsRunOnTheGpu",
                           "/src/p.cpp:9&#x0A;[gpu only] no CUDA device"), ("Fp32", None)]),
     ("Layers", [("Forward", None), ("Backward", None)])],
    ["PrecisionOnCuda", "Layers", "Docs.ShownCommandsRun"])
expect(result.returncode == 0, f"covered GPU-only suite skip failed: {result.stdout}{result.stderr}")
expect("5 tests: 4 GoogleTest cases of 2 suites in 2 processes, and 1 other ctest tests" in result.stdout,
       result.stdout)
expect("PrecisionOnCuda.Bf16AndFp16StepsRunOnTheGpu: [gpu only] no CUDA device" in result.stdout,
       result.stdout)
expect("1 tests skipped" in result.stdout, result.stdout)

# A suite split into shards: each shard's process writes its own file; the shards' ctest tests
# ("Suite:shardK") count as that suite, not as other tests.
result = run_with_suites([("Grid", [("A", None), ("B", None)]), ("Grid", [("C", None)])],
                         ["Grid:shard0", "Grid:shard1"])
expect(result.returncode == 0, f"sharded suite failed: {result.stdout}{result.stderr}")
expect("3 tests: 3 GoogleTest cases of 1 suites in 2 processes, and 0 other ctest tests"
       in result.stdout, result.stdout)

# A GPU-only case inside a suite the filter does not select fails the run and is named.
result = run_with_suites([("Layers", [("HalfOnTheDevice", "x.cpp:1&#x0A;[gpu only] no CUDA"),
                                      ("Forward", None)])], ["Layers"])
expect(result.returncode == 1, f"uncovered GPU-only case passed: {result.stdout}")
expect("Layers.HalfOnTheDevice" in result.stderr, result.stderr)

# Nothing skipped says so; an unreadable file is an error, not a pass.
expect("no test skipped" in run(junit()).stdout, "empty run")
expect(run("not xml").returncode == 2, "unreadable results accepted")
print("skipped_tests: all checks passed")
