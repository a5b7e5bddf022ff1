#!/usr/bin/env python3
"""Prints, one a line, those of the given sources whose includes never reach a LibTorch header
(torch/, ATen/, c10/, caffe2/), following our own headers: they compile faster without the shared
LibTorch precompiled header (cmake/TrainyardTargets.cmake) than with it.

    torch_free_sources.py --include-dir DIR... -- SOURCE...

A quoted include is looked for beside the file that includes it, then in each --include-dir; one
found nowhere counts as reaching LibTorch, so a source is only ever left out when that is sure.
"""
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
TORCH = ("torch/", "ATen/", "c10/", "caffe2/")


def reaches_torch(path, include_dirs, memo):
    if path in memo:
        return memo[path]
    memo[path] = False  # a cycle adds nothing
    result = False
    for delimiter, name in INCLUDE.findall(path.read_text(errors="replace")):
        if name.startswith(TORCH):
            result = True
        elif delimiter == '"':
            candidates = [path.parent / name] + [Path(d) / name for d in include_dirs]
            found = next((c.resolve() for c in candidates if c.is_file()), None)
            result = found is None or reaches_torch(found, include_dirs, memo)
        if result:
            break
    memo[path] = result
    return result


def main(argv):
    split = argv.index("--")
    options, sources = argv[:split], argv[split + 1:]
    include_dirs = [options[i + 1] for i, o in enumerate(options) if o == "--include-dir"]
    memo = {}
    for source in sources:
        if not reaches_torch(Path(source).resolve(), include_dirs, memo):
            print(source)


if __name__ == "__main__":
    main(sys.argv[1:])
