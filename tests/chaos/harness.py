"""What every kill -9 test does with its child: wait for a line, SIGKILL, collect output.

The child prints one line per acknowledged operation (flushed at once); the parent
reads them as they come, kills at a random moment, then reads what is left. A line
the kill cut short is dropped: only whole lines were acknowledged.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time


def read_until(fd: int, buf: bytearray, token: bytes, deadline: float) -> bool:
    """Append what ``fd`` gives to ``buf`` until ``token`` is in it (False at EOF/deadline)."""
    while token not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            return False
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return False
        buf += chunk
    return True


def kill_and_collect(proc: subprocess.Popen, buf: bytearray) -> tuple[list[str], str]:
    """SIGKILL ``proc`` (if still running), read the rest of its stdout into ``buf``.

    Returns (the complete stdout lines, stderr). Asserts the child died by the kill,
    not on its own.
    """
    proc.send_signal(signal.SIGKILL)
    fd = proc.stdout.fileno()
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
    err = proc.stderr.read().decode()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"child died on its own:\n{err[-3000:]}"
    return bytes(buf).decode().split("\n")[:-1], err


FORKSERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver.py")


class ForkServer:
    """Drive ``forkserver.py``: one process imports a child module once, then forks a
    fresh child per :meth:`run_child` (a child that costs seconds to start as a new
    process costs milliseconds as a fork). Use as a context manager."""

    def __init__(self, module: str, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, FORKSERVER, module],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._buf = bytearray()
        line = self._line(time.monotonic() + 120)
        assert line == "SERVER READY", f"the fork server did not start: {line!r}"

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()         # the server exits at the end of its commands
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _line(self, deadline: float) -> str | None:
        """The next whole line from the server or its children (None at the deadline)."""
        if not read_until(self.proc.stdout.fileno(), self._buf, b"\n", deadline):
            assert self.proc.poll() is None, "the fork server died"
            return None
        i = self._buf.index(b"\n")
        line = bytes(self._buf[:i]).decode()
        del self._buf[:i + 1]
        return line

    def run_child(self, argv: list[str], err_path: str, kill_after: float,
                  go: str = "GO", end: str = "END ", start_timeout: float = 60) -> list[str]:
        """Fork a child running ``main(argv)``; once it printed ``go``, wait up to
        ``kill_after`` seconds for a line starting with ``end``, then SIGKILL it by its
        pid (always: a child that ended waits to be killed). Returns the child's lines.
        Fails if the child died of anything but the kill."""
        req = json.dumps({"argv": argv, "stderr": err_path})
        self.proc.stdin.write(f"FORK {req}\n".encode())
        self.proc.stdin.flush()
        pid, lines, exit_code = None, [], None
        deadline = time.monotonic() + start_timeout
        while exit_code is None:
            if go in lines or any(ln.startswith(end) for ln in lines):
                if pid is not None:
                    break
            line = self._line(deadline)
            if line is None:
                break                       # never became ready: killed below, then fails
            if line.startswith("PID "):
                pid = int(line.split()[1])
            elif line.startswith("EXIT "):
                exit_code = int(line.split()[2])
            else:
                lines.append(line)
        ready = go in lines
        if ready and exit_code is None:
            deadline = time.monotonic() + kill_after
            while not any(ln.startswith(end) for ln in lines):
                line = self._line(deadline)
                if line is None:
                    break
                assert not line.startswith("EXIT "), f"child died on its own: {line}"
                lines.append(line)
        if exit_code is None and pid is not None:
            os.kill(pid, signal.SIGKILL)
            while exit_code is None:
                line = self._line(time.monotonic() + 30)
                assert line is not None, "the fork server did not report the child's end"
                if line.startswith(f"EXIT {pid} "):
                    exit_code = int(line.split()[2])
                else:
                    lines.append(line)
        err = open(err_path).read() if os.path.exists(err_path) else ""
        assert ready, f"child never became ready:\n{err[-3000:]}"
        assert exit_code == -signal.SIGKILL, f"child died on its own ({exit_code}):\n{err[-3000:]}"
        return lines
