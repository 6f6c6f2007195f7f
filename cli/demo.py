"""``durkv demo``: a small simulated agent loop on a real store.

Each step of the "agent" appends two messages (its thought and a tool result)
and bumps a step counter, then commits one checkpoint. The demo then reopens
the store to show the state survived, and verifies the log. With ``--crash``
the loop runs in a child process that is killed with SIGKILL mid-run; the demo
reopens the store and resumes from the last committed step, and checks the
result is exactly what an uninterrupted run produces.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from .. import open as open_store
from ..durability import DURABILITIES, EXIT, SYNC
from ..errors import ConfigError, DurkvError
from . import output, reports
from .stores import log_module

THREAD = "demo"
STEP_PAUSE = 0.005  # seconds per step in the crash child: "the LLM is thinking"


def messages_for(step: int) -> list[str]:
    """The two messages step ``step`` appends (deterministic, so runs can be compared)."""
    return [f"assistant: step {step}: I will call tool_{step % 3}",
            f"tool_{step % 3}: result {step * step}"]


def expected_messages(last_step: int) -> list[str]:
    out = ["user: plan a trip to Lisbon"]
    for s in range(1, last_step + 1):
        out += messages_for(s)
    return out


def latest(store: Any) -> tuple[int, list[str]]:
    """(step, messages) of the thread's latest checkpoint; (0, [first message]) if none."""
    ck = store.get(THREAD)
    if ck is None:
        return 0, expected_messages(0)
    return int(ck.values["step"]), list(ck.values["messages"])


def agent_loop(store: Any, last_step: int, report=None) -> int:
    """Run steps after the latest one up to ``last_step``, one commit each; returns the last."""
    step, messages = latest(store)
    while step < last_step:
        step += 1
        messages = messages + messages_for(step)
        store.put(THREAD, "", f"{step:08d}", checkpoint={}, metadata={"step": step},
                  values={"messages": messages, "step": step},
                  versions={"messages": step, "step": step},
                  parent_id=f"{step - 1:08d}" if step > 1 else None)
        if report:
            report(step)
    return step


def crash_child(path: str, last_step: int, durability: str) -> None:
    """The process --crash kills: runs the loop, prints 'step N' after each commit returns."""
    def report(step: int) -> None:
        print(f"step {step}", flush=True)
        time.sleep(STEP_PAUSE)

    with open_store(path, durability=durability) as store:
        agent_loop(store, last_step, report)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _check_path(path: Path) -> None:
    if path.exists() and (not path.is_dir() or
                          (any(path.iterdir()) and not any(path.glob("*.seg")))):
        raise ConfigError(f"{path} exists and is not a durkv store; "
                          f"give a new directory (or none, for a temporary one)")


def _kill_mid_run(path: Path, last_step: int, kill_at: int, durability: str) -> int:
    """Run the loop in a child process, SIGKILL it once it reported step ``kill_at``."""
    code = ("import sys; from durkv.cli.demo import crash_child; "
            "crash_child(sys.argv[1], int(sys.argv[2]), sys.argv[3])")
    child = subprocess.Popen([sys.executable, "-c", code, str(path), str(last_step), durability],
                             stdout=subprocess.PIPE, text=True)
    reported = 0
    try:
        assert child.stdout is not None
        for line in child.stdout:
            reported = int(line.split()[1])
            if reported >= kill_at:
                os.kill(child.pid, signal.SIGKILL)
                break
    finally:
        child.kill()  # no-op when already dead; never leave the child running
        child.wait()
    if reported < kill_at:
        raise DurkvError(f"the agent process exited early (exit code {child.returncode})")
    click.echo(f"  killed the agent process (pid {child.pid}) with SIGKILL "
               f"right after it reported step {reported}")
    return reported


@click.command()
@click.argument("path", required=False, type=output.STORE_PATH)
@click.option("--steps", default=12, show_default=True, type=click.IntRange(2, 100_000),
              help="Agent steps to run.")
@click.option("--crash", is_flag=True,
              help="Run the loop in a child process, kill -9 it mid-run, then resume.")
@click.option("--durability", type=click.Choice(DURABILITIES), default=SYNC,
              show_default=True, help="When a commit's bytes are safe (see README).")
def demo(path: Path | None, steps: int, crash: bool, durability: str) -> None:
    """Run a simulated agent on a real store and show it is durable.

    Commits one checkpoint per agent step (a growing message list and a step
    counter) to the store at PATH (a new temporary directory if omitted),
    reopens it, prints the latest state and its history, then verifies the log.
    With --crash the agent runs in a child process killed with SIGKILL halfway;
    the demo reopens the store and resumes exactly where the agent stopped.

    \b
    Example:
        durkv demo
        durkv demo --crash ./agent.durkv
        durkv verify ./agent.durkv
    """
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="durkv-demo-")) / "agent.durkv"
    _check_path(path)

    with open_store(str(path), durability=durability) as store:
        start, _ = latest(store)
    target = start + steps
    click.echo(f"durkv demo: an agent runs steps {start + 1}..{target} on {path} "
               f"(durability={durability})")

    if crash:
        kill_at = start + max(1, steps // 2)
        reported = _kill_mid_run(path, target, kill_at, durability)
        with open_store(str(path), durability=durability) as store:
            resumed, _ = latest(store)
            click.echo(f"  reopened: the latest checkpoint is step {resumed} "
                       f"(the agent had reported step {reported} committed when it was killed)")
            if resumed < reported:
                if durability != EXIT:
                    raise DurkvError(f"step {reported} was committed but is lost after the kill")
                click.echo("  (durability=exit keeps commits in memory until a flush or a "
                           "clean close: a kill loses them, by design)")
            click.echo(f"  resuming at step {resumed + 1}")
            agent_loop(store, target)
    else:
        with open_store(str(path), durability=durability) as store:
            agent_loop(store, target,
                       lambda s: click.echo(f"  step {s}: committed checkpoint {s:08d}"))

    with open_store(str(path), read_only=True) as store:
        step, messages = latest(store)
        n_history = sum(1 for _ in store.history(THREAD))
    same = messages == expected_messages(target)
    click.echo(f"  reopened: step {step}, {len(messages)} messages, "
               f"{n_history} checkpoints in history, "
               f"{output.human_bytes(_dir_bytes(path))} on disk")
    click.echo(f"  last message: {messages[-1]!r}")
    click.echo(f"  state identical to an uninterrupted run: {'yes' if same else 'NO'}")

    report = log_module().verify(str(path))
    clean = reports.is_clean(report)
    click.echo(f"verify: {'ok' if clean else 'DAMAGED'}: {reports.summary(report)}")
    click.echo(f"Try: durkv verify {path}")
    if not same or step != target:
        raise DurkvError("the reopened state is not the state the agent committed")
    if not clean:
        click.get_current_context().exit(output.EXIT_CORRUPT)
