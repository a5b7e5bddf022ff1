#!/usr/bin/env python3
"""tools/include_graph --check on made-up trees: a clean one passes, and an installed header that
includes the runtime, or a source-relative header, is refused with the edge named, and so is an
interface header (api/) that includes a header of a wing above it."""
import pathlib
import subprocess
import sys
import tempfile

tool = sys.argv[1]


def tree(files):
    root = pathlib.Path(tempfile.mkdtemp())
    for name, text in files.items():
        path = root / "sdk" / "include" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def check(root):
    return subprocess.run([sys.executable, tool, "--check", "--root", str(root)],
                          capture_output=True, text=True)


clean = tree({"trainyard/api/a.hpp": '#pragma once\n#include <vector>\n#include "trainyard/api/b.hpp"\n',
              "trainyard/api/b.hpp": "#pragma once\n",
              "trainyard/parallel/c.hpp": '#pragma once\n#include "trainyard/api/a.hpp"\n'})
result = check(clean)
assert result.returncode == 0, result.stderr

upward = tree({"trainyard/api/a.hpp": '#pragma once\n#include "trainyard/parallel/c.hpp"\n',
               "trainyard/parallel/c.hpp": "#pragma once\n"})
result = check(upward)
assert result.returncode == 1, "an interface header including parallel/ was accepted"
assert "interface header trainyard/api/a.hpp includes trainyard/parallel/c.hpp" in result.stderr, \
    result.stderr

for bad_include in ('"trainyard/runtime/engine.hpp"', '"components.hpp"', "<trainyard/missing.hpp>"):
    bad = tree({"trainyard/parallel/a.hpp": f"#pragma once\n#include {bad_include}\n",
                "trainyard/runtime/engine.hpp": "#pragma once\n"})
    result = check(bad)
    target = bad_include.strip('"<>')
    assert result.returncode == 1, f"{bad_include} was accepted"
    assert f"trainyard/parallel/a.hpp includes internal header {target}" in result.stderr, \
        result.stderr
print("include_graph_test: ok")
