#!/usr/bin/python3
"""Runs tests/reference's scripts for one test program, each as if started on its own
(`PYTHON SCRIPT ARGS…`), without paying torch's, diffusers' and transformers' imports each time
(3 to 4 s of a 4 s run of sd_pipeline.py): the reference tests call it through
tests/testing/python_fork_server.h.

    PYTHON tests/reference/fork_server.py

Reads one request a line from stdin, a JSON object:
  script  the script's path
  args    its arguments, one string as /bin/sh would split it (shlex, POSIX rules)
  cwd     the directory it runs in
  env     its whole environment
  output  a file that receives what it prints, stdout and stderr interleaved
and answers each with one line on stdout, {"exit": STATUS}: the script's exit status (128 + the
signal's number when a signal ended it), once it has ended; or {"refused": WHY} where it cannot
run the script as a new interpreter would (nothing has run). Its first line, {"ready": true},
says it has started. Ends at the end of stdin. Only these lines reach stdout: anything else this
process prints (a package's banner on import) goes to its stderr.

Before the first run of a script, this process imports the third-party modules the script
names (every import statement in it, at any depth; not the scripts beside it, which each run
imports afresh). Each run is then a fork of this process: a child that starts with those
modules loaded and nothing else of any earlier run, and runs the script as __main__ with
sys.argv, sys.path[0], the directory and the environment a new interpreter would have. Nothing
the imports do starts a thread (checked below), so the fork is safe.
"""
import ast
import importlib
import json
import os
import runpy
import shlex
import sys
import threading
import traceback

def third_party_imports(script):
    """(module, [names]) for each import statement of `script` whose module is not one of the
    scripts beside it."""
    with open(script, encoding="utf-8") as f:
        tree = ast.parse(f.read(), script)
    local = {os.path.splitext(n)[0] for n in os.listdir(os.path.dirname(os.path.abspath(script)))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return [(m, names) for m, names in found if m.split(".")[0] not in local]


def warm(script):
    """Imports what `script` imports, as far as it imports here (a failure is the run's to
    report, as the child imports again)."""
    for module, names in third_party_imports(script):
        try:
            loaded = importlib.import_module(module)
            for name in names:  # diffusers and transformers load their classes on access
                if name != "*":
                    getattr(loaded, name, None)
        except Exception:  # noqa: BLE001
            pass


def run_child(request, replies):
    """The forked child: runs the script and never returns."""
    code = 1
    try:
        replies.close()
        fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["script"]
        sys.argv = [script] + shlex.split(request["args"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException as e:  # noqa: BLE001  (what an uncaught exception prints, and 1)
            frames = e.__traceback__
            while frames is not None and frames.tb_frame.f_code.co_filename != script:
                frames = frames.tb_next  # this file's and runpy's, above the script's
            traceback.print_exception(type(e), e, frames or e.__traceback__)
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def main():
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(message):
        print(json.dumps(message), file=replies, flush=True)

    reply({"ready": True})
    warmed = set()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request["script"] not in warmed:
            warm(request["script"])
            warmed.add(request["script"])
        if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
            reply({"refused": "an import started a thread: a fork would not be safe"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_child(request, replies)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            code = 128 + os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
        reply({"exit": code})
    return 0


if __name__ == "__main__":
    sys.exit(main())
