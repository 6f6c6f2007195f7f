"""A fork server for kill -9 tests whose child is costly to start.

A LangGraph child spends 1.5-3 s importing before it does any work; a chaos test
that restarts it hundreds of times would spend its time in imports. This process
imports the child's module once, then forks a fresh child per request: the child
runs ``module.main(argv)`` and the test SIGKILLs it by its pid.

Nothing is open here when a child is forked: no store, no lock, no thread (it is
checked before each fork). Each child opens the store itself, after the fork, as
a freshly started process would.

Usage: forkserver.py MODULE (MODULE is importable from this file's directory).

Protocol, one line each way (stdin commands, stdout answers; the children share
stdout and write their own lines there with single ``os.write`` calls):

- ``FORK {"argv": [...], "stderr": PATH}`` (JSON) -> ``PID <pid>``; the child runs
  ``main(argv)`` with its stderr in the file PATH. The server then waits for the child and writes
  ``EXIT <pid> <code>`` (a negative code is the signal that ended it) before it
  reads the next command: the test knows the child is gone, and its lines all
  came before this one.
- end of stdin: the server exits.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback


def _lines(fd: int):
    buf = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()


def run_child(main, argv: list[str], err_path: str) -> None:
    """In the forked child: never returns (SIGKILL, or _exit if main fails or ends).
    (lg_worker_child.py's spawner forks its workers through it too.)"""
    code = 1
    try:
        fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(0)         # the server's commands are not the child's
        main(argv)
        code = 0
    except SystemExit as e:     # main's own exit (a worker whose parent has gone): no traceback
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _open_stores() -> list[str]:
    """Files of a store this process holds open (a child must not inherit one)."""
    out = []
    fds = os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []  # Linux
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue            # the listing's own fd, closed by now
        if ".durkv" in target:
            out.append(target)
    return out


def serve(module_name: str) -> None:
    main = importlib.import_module(module_name).main
    os.write(1, b"SERVER READY\n")
    for line in _lines(0):
        cmd, _, arg = line.partition(" ")
        assert cmd == "FORK", line
        req = json.loads(arg)
        # a fork copies only the calling thread: a helper thread's lock could be held
        assert threading.active_count() == 1, threading.enumerate()
        assert not _open_stores(), _open_stores()
        pid = os.fork()
        if pid == 0:
            run_child(main, req["argv"], req["stderr"])
        os.write(1, f"PID {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        os.write(1, f"EXIT {pid} {code}\n".encode())


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    serve(sys.argv[1])
