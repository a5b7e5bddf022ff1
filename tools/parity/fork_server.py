"""Runs a script's main() many times, each call in a fresh fork of one process that imported it.

  fork_server.py SCRIPT

Importing torch costs seconds; a test that replays dozens of short runs would spend most of its
time there. This process imports SCRIPT once (as a module, so its `if __name__ == "__main__"`
block does not run) and then serves requests, one JSON line each on stdin:

  {"args": [...], "out": PATH, "err": PATH}

For each it forks; the child sets sys.argv to [SCRIPT] + args, sends its stdout and stderr to
the two files and exits with main()'s status, so every call starts from the interpreter state
right after the import, as a new process would, and no call sees what an earlier one changed
(seeds, thread counts, torch's global flags). The reply is one JSON line on stdout:
{"exit": STATUS}, STATUS being -SIGNAL when the child was killed. End of stdin ends the server.
"""

import importlib.util
import json
import os
import sys
import traceback


def load(script):
    spec = importlib.util.spec_from_file_location("served_script", script)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    spec.loader.exec_module(module)
    return module


def child(module, script, request):
    """In the fork: runs main() with the request's arguments and streams; never returns."""
    status = 1
    try:
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(os.devnull)
        sys.argv = [script] + list(request["args"])
        try:
            result = module.main()
            status = 0 if result is None else int(result)
        except SystemExit as stop:
            if stop.code is None:
                status = 0
            elif isinstance(stop.code, int):
                status = stop.code
            else:
                print(stop.code, file=sys.stderr)
                status = 1
    except BaseException:  # whatever main() raised: its traceback, and exit 1
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: fork_server.py SCRIPT")
    script = os.path.abspath(sys.argv[1])
    module = load(script)
    replies = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        replies.flush()
        pid = os.fork()
        if pid == 0:
            child(module, script, request)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        replies.write(json.dumps({"exit": code}) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
