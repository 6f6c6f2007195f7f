"""What every kill -9 test does with its child: wait for a line, SIGKILL, collect output.

The child prints one line per acknowledged operation (flushed at once); the parent
reads them as they come, kills at a random moment, then reads what is left. A line
the kill cut short is dropped: only whole lines were acknowledged.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
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
