#!/usr/bin/env python3
"""tools/long_functions --check passes on the source tree (no file over 600 lines and no function
over 100 outside tests, unless the file says why), and on a made-up tree it finds what it should:
a long free function, a long member function defined in a class, a long file, and a reason that
names no long function; it does not count braces in comments, strings, raw strings or
preprocessor lines, nor a long namespace or class as one function."""
import os
import subprocess
import sys
import tempfile

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(SOURCE, "tools", "long_functions")


def body(lines):
    return "".join(f"  int v{i} = {i};\n" for i in range(lines))


def made_up_tree(folder):
    def write(relative, text):
        path = os.path.join(folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
    # 101 lines from brace to brace: over the limit; 100: not.
    write("host/long.cpp", "namespace a {\nvoid too_long() {\n" + body(99) + "}\n"
          "int fits(int x) {\n" + body(98) + "}\n}  // namespace a\n")
    write("sdk/src/member.cpp", "class C {\n public:\n  void member(int x) const {\n" + body(99)
          + "  }\n};\n")
    write("plugins/x/excused.cpp", "// long-function: excused: a table the compiler checks\n"
          "void excused() {\n" + body(99) + "}\n// long-function: gone: no longer long\n")
    # Braces the scan must not count: comments, strings, raw strings, preprocessor lines.
    write("tools/tricky.cpp", "#if defined(X) {\n#endif\nvoid tricky() {\n"
          "  const char* s = \"}}}\";\n  // }\n  /* } */\n  auto r = R\"x({)x\";\n"
          + body(40) + "}\n")
    write("tools/big.cpp", "// many short functions\n" + "".join(
        f"int f{i}() {{ return {i}; }}\n" for i in range(601)))
    write("tests/ignored.cpp", "void in_tests() {\n" + body(200) + "}\n")


def main():
    failures = []
    with tempfile.TemporaryDirectory() as folder:
        made_up_tree(folder)
        run = subprocess.run([sys.executable, TOOL, "--check", folder], capture_output=True,
                             text=True)
        out = run.stdout + run.stderr
        expected = ["host/long.cpp:2: too_long: 101 lines", "sdk/src/member.cpp:3: member: 101",
                    "plugins/x/excused.cpp:2: excused: 101 lines (a table the compiler checks)",
                    "'// long-function: gone' names no function", "tools/big.cpp: 602 lines"]
        for line in expected:
            if line not in out:
                failures.append(f"made-up tree: expected '{line}' in:\n{out}")
        for absent in ("fits", "tricky", "in_tests", "namespace", "excused is"):
            if absent in out.replace("excused: 101 lines", ""):
                failures.append(f"made-up tree: '{absent}' should not be reported:\n{out}")
        if run.returncode != 1:
            failures.append(f"made-up tree: exit {run.returncode}, expected 1")
    run = subprocess.run([sys.executable, TOOL, "--check"], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append("the source tree is over the limits:\n" + run.stdout + run.stderr)
    for failure in failures:
        print("FAILED:", failure, file=sys.stderr)
    print(f"long_functions_test: {'failed' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
