#!/usr/bin/env python3
"""The host and the runtime name no bundled plugin: a string literal equal to a plugin's
registered name may appear only in sdk/include/trainyard/runtime/default_plugins.hpp, where the
defaults a recipe or command gets are declared. Also checked on a made-up tree, so that the
scan is seen to find a name, and to find none in a comment."""
import os
import re
import sys
import tempfile

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULTS = os.path.join("sdk", "include", "trainyard", "runtime", "default_plugins.hpp")
# Uses left to do, each with why; the test fails when one is gone, so the list only shrinks.
REMAINING = {}
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def plugin_names(root):
    names = set()
    for folder, _, files in os.walk(os.path.join(root, "plugins")):
        for name in files:
            if name.endswith(".cpp"):
                with open(os.path.join(folder, name), encoding="utf-8") as file:
                    names |= set(re.findall(r'\.add<\w+>\(\s*"([^"]+)"', file.read()))
    return names


def runtime_sources(root):
    """host/, the runtime library's sources as sdk/CMakeLists.txt lists them, and its headers."""
    with open(os.path.join(root, "sdk", "CMakeLists.txt"), encoding="utf-8") as file:
        cmake = file.read()
    block = re.search(r"add_library\(trainyard_runtime STATIC(.*?)\)", cmake, re.S)
    files = [os.path.join("sdk", path) for path in block.group(1).split()] if block else []
    for folder in ("host", os.path.join("sdk", "include", "trainyard", "runtime")):
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if name.endswith((".cpp", ".hpp")):
                files.append(os.path.join(folder, name))
    return files


def uses(root):
    """(file, name, line number) of every plugin name in a string literal, comments aside."""
    names = plugin_names(root)
    found = []
    for relative in runtime_sources(root):
        if relative == DEFAULTS:
            continue
        with open(os.path.join(root, relative), encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                code = line.split("//")[0]
                for literal in LITERAL.findall(code):
                    if literal in names:
                        found.append((relative, literal, number))
    return found


def made_up_tree(folder):
    def write(relative, text):
        path = os.path.join(folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
    write("plugins/x/x.cpp", 'registry.add<Strategy>(\n  "relay", {}, "", f);\n')
    write("sdk/CMakeLists.txt", "add_library(trainyard_runtime STATIC\n  src/runtime/engine.cpp\n)\n")
    write("sdk/src/runtime/engine.cpp", 'if (name == "relay") {}\n')
    write("host/main.cpp", '// the "relay" plugin in a comment\nauto s = "relay-not";\n')
    write(DEFAULTS, 'inline constexpr const char* kStrategy = "relay";\n')


def main():
    failures = []
    with tempfile.TemporaryDirectory() as folder:
        made_up_tree(folder)
        got = uses(folder)
        if got != [("sdk/src/runtime/engine.cpp", "relay", 1)]:
            failures.append(f"on a made-up tree the scan found {got}, expected the one use in "
                            "sdk/src/runtime/engine.cpp")
    if len(plugin_names(SOURCE)) < 20:
        failures.append(f"only {sorted(plugin_names(SOURCE))} found as bundled plugin names")
    found = uses(SOURCE)
    for relative, name, number in found:
        if (relative, name) not in REMAINING:
            failures.append(f"{relative}:{number} names the plugin '{name}': declare it in "
                            f"{DEFAULTS} or ask the plugin through a capability")
    for (relative, name), why in REMAINING.items():
        if not any(f == relative and n == name for f, n, _ in found):
            failures.append(f"{relative} no longer names '{name}': drop it from REMAINING")
        else:
            print(f"plugin_names_test: left to do: {relative} names '{name}' ({why})")
    for failure in failures:
        print("FAILED:", failure, file=sys.stderr)
    print(f"plugin_names_test: {'failed' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
