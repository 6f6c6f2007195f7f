"""``durkv demo [DIR]``: the mission in one minute -- an agent that is killed and resumed.

The agent (:mod:`durkv.cli.demo_agent`: a support desk on ``durkv.Graph`` with a
scripted model, a read-only lookup, a mutating ``send_email`` and a human approval) runs
on the local store ``DIR/agent.durkv`` in a child process. The demo SIGKILLs it at
random moments, resumes it each time in a new process, approves its approval from a
third process while it waits, and then measures what happened from the evidence
(:mod:`durkv.cli.demo_report`): the store, the journal, the outbox, the model's bill
and ``verify``.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from .. import open as open_store
from ..durability import DURABILITIES, SYNC
from ..errors import ConfigError, DurkvError
from . import demo_report, output
from .demo_agent import STEPS_PER_TICKET, STORE_NAME
from .output import JSON_KEY

DEFAULT_STEPS = 300
DEFAULT_CRASHES = 4
EVENT_TIMEOUT = 120.0       # seconds without a word from a child: it is stuck
RUN_PREFIX = "support-"
AGENT_CODE = "from durkv.cli.demo_agent import agent_main; agent_main()"
APPROVER_CODE = "from durkv.cli.demo_agent import approver_main; approver_main()"


def prepare(directory: Path | None) -> tuple[Path, str]:
    """The demo's directory (made if new) and the id of the run to start in it."""
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="durkv-demo-"))
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} is a file; give the demo a directory (new, empty, "
                          "or one an earlier demo made)")
    directory.mkdir(parents=True, exist_ok=True)
    names = os.listdir(directory)
    if any(n.endswith(".seg") for n in names):
        raise ConfigError(f"{directory} is a durkv store itself; give the demo a directory "
                          f"of its own (it makes {STORE_NAME}, outbox.jsonl and the model's "
                          "bill there)")
    if names and STORE_NAME not in names:
        raise ConfigError(f"{directory} exists and holds no earlier demo ({STORE_NAME}); give "
                          "a new or empty directory (or none, for a temporary one)")
    done = 0
    if STORE_NAME in names:
        with open_store(str(directory / STORE_NAME), read_only=True) as store:
            done = sum(r.startswith(RUN_PREFIX) for r in store.journal_runs())
    return directory, f"{RUN_PREFIX}{done + 1}"


class Child:
    """A child process of the demo whose stdout is a stream of JSON events."""

    def __init__(self, code: str, *args: str) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", code, *args],
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.pid = self.proc.pid
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)       # end of stream: the process exited

    def next_event(self) -> dict | None:
        try:
            return self.events.get(timeout=EVENT_TIMEOUT)
        except queue.Empty:
            self.stop()
            raise DurkvError(f"the demo's child process {self.pid} said nothing for "
                             f"{EVENT_TIMEOUT:.0f} s and was stopped") from None

    def stop(self) -> None:
        """SIGKILL (if still running) and reap it."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self) -> None:
        """Wait for it to exit by itself (it may still be closing its store: a kill now
        would tear the frame it is writing), then insist on a clean exit."""
        try:
            self.proc.wait(timeout=EVENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.stop()
            raise DurkvError(f"the demo's process {self.pid} did not exit within "
                             f"{EVENT_TIMEOUT:.0f} s of its last word and was stopped") from None
        if self.proc.returncode != 0:
            raise self.failure()

    def failure(self) -> DurkvError:
        """Why it ended without finishing: its exit code and last line of stderr."""
        self.proc.wait()
        self.stderr.seek(0)
        lines = [ln for ln in self.stderr.read().decode(errors="replace").splitlines() if ln]
        last = f": {lines[-1]}" if lines else ""
        return DurkvError(f"the demo's process {self.pid} exited with code "
                          f"{self.proc.returncode}{last}")


class Demo:
    """One demo: the agent's processes, the kills, the approval; and what they did."""

    def __init__(self, workdir: Path, run_id: str, steps: int, crashes: int, seed: int,
                 durability: str, say: Any) -> None:
        self.workdir, self.run_id, self.steps = workdir, run_id, steps
        self.durability, self.say = durability, say
        self.rng = random.Random(seed)
        self.kill_at = sorted(self.rng.sample(kill_steps(steps), crashes))
        self.kills: list[dict] = []         # {"pid", "after_step"}
        self.agent_pids: list[int] = []
        self.approvals: list[dict] = []     # {"step_id", "by", "approver_pid", "agent_pid"}
        self.agent_seconds = 0.0            # agents running (waits for a human excluded)
        self.start_seconds = 0.0            # agent processes starting: import, open
        self.step_seconds: list[float] = [] # between step events: how long a step takes
        self.last_step: float | None = None
        self.progress_every = max(1, steps // 10)

    def run(self) -> None:
        """Run agent processes until one finishes the run and exits by itself."""
        while not self.one_agent():
            pass

    def one_agent(self) -> bool:
        """Start (or resume) the agent in a new process; True once it finishes the run."""
        agent = Child(AGENT_CODE, str(self.workdir), self.run_id, str(self.steps),
                      self.durability)
        self.agent_pids.append(agent.pid)
        self.last_step = None
        try:
            finished = self.follow(agent)
        except BaseException:
            agent.stop()    # an error on our side, or Ctrl-C: never leave an agent running
            raise
        if finished:
            agent.finish()
        return finished

    def follow(self, agent: Child) -> bool:
        """Tell what the agent reports, kill it when a kill is due; True once it finished."""
        spawned = running_since = time.monotonic()
        first_step: int | None = None
        while True:
            ev = agent.next_event()
            if ev is None:
                raise agent.failure()
            kind, now = ev["ev"], time.monotonic()
            if kind == "start":     # imported and opened: the agent runs from here
                self.start_seconds += now - spawned
                running_since = now
                self.on_start(ev)
            elif kind == "step":
                self.step_seconds.append(now - (self.last_step or now))
                self.last_step = now
                first_step = first_step or ev["step"]
                self.on_step(ev, first_step == ev["step"])
                if self.kill_at and ev["step"] >= self.kill_at[0]:
                    self.agent_seconds += now - running_since
                    self.kill(agent, ev["step"])
                    return False
            elif kind == "waiting":
                self.agent_seconds += now - running_since
                self.approve(agent, ev)
            elif kind == "decided":
                running_since, self.last_step = now, None
                self.say(f"agent (pid {agent.pid}) sees the decision in the journal and "
                         "goes on")
            elif kind == "signal":
                self.say(f"  {ev['msg']} (logged in pid {agent.pid})")
            elif kind == "repeat":
                self.say(f"mail service: a repeated request with key {ev['key']}: the "
                         "agent was killed after sending it, before its receipt; the key "
                         "says it was sent, so it is not sent again")
            elif kind in ("finished", "stopped"):
                self.agent_seconds += now - running_since
                self.say(f"agent (pid {agent.pid}) {ev['status']} the run at step "
                         f"{ev['step']}" + (f": {ev['message']}" if ev.get("message") else ""))
                return True

    def on_start(self, ev: dict) -> None:
        if len(self.agent_pids) == 1 and ev["step"] == 0:
            self.say(f"agent started in pid {ev['pid']}: run {self.run_id}, {self.steps} "
                     f"steps ({-(-self.steps // STEPS_PER_TICKET)} tickets, "
                     f"{STEPS_PER_TICKET} steps each)")
            return
        unreported = ""
        if self.kills and ev["step"] > self.kills[-1]["after_step"]:
            unreported = (f" (step {ev['step']} was committed just before the kill, "
                          "before the agent could say so)")
        self.say(f"resumed in pid {ev['pid']}: the state after {ev['step']} steps read from "
                 f"the last checkpoint{unreported}, {ev['journal']} journal records kept")
        if ev["torn_bytes"]:
            self.say(f"  the kill had torn a frame at the log's end: opening the store cut "
                     f"it, its {ev['torn_bytes']} bytes kept in quarantine/")

    def on_step(self, ev: dict, first: bool) -> None:
        if first and ev["replayed"]:
            self.say(f"  step {ev['step']}: {ev['replayed']} call(s) the killed process had "
                     "made were replayed from the journal, not made again")
        if ev["step"] % self.progress_every == 0 or ev["step"] == self.steps:
            self.say(f"  step {ev['step']}/{self.steps} committed")

    def kill(self, agent: Child, step: int) -> None:
        """SIGKILL the agent at a random moment of the step after ``step``."""
        recent = [t for t in self.step_seconds[-20:] if t > 0] or [0.005]
        delay = self.rng.uniform(0, sum(recent) / len(recent))
        time.sleep(delay)
        agent.stop()
        finished = False
        while (ev := agent.events.get()) is not None:   # what it said before it died
            finished = finished or ev["ev"] == "finished"
            step = ev.get("step", step)
        self.kill_at.pop(0)
        self.kills.append({"pid": agent.pid, "after_step": step})
        # Finished first (a slow moment): the kill fell while it closed the store, so a
        # new process still opens it -- repairing what the kill tore -- and finds it done.
        self.say(f"killed agent (pid {agent.pid}) with SIGKILL at a random moment after "
                 f"step {step}" + (": it had finished the run and was closing the store"
                                   if finished else ""))

    def approve(self, agent: Child, ev: dict) -> None:
        """Decide the approval the agent waits for, from a process of its own."""
        p = ev["payload"]
        again = any(a["step_id"] == ev["step_id"] for a in self.approvals)
        self.say(f"agent (pid {agent.pid}) waits at step {ev['step']} for approval of "
                 f"{ev['action']} to {p['to']} ({p['subject']}), journal step "
                 f"{ev['step_id']}" + (": the request an earlier process made" if again
                                       else ""))
        approver = Child(APPROVER_CODE, str(self.workdir), self.run_id, ev["step_id"])
        try:
            done = approver.next_event()
            if done is None:
                raise approver.failure()
        except BaseException:
            approver.stop()
            raise
        approver.finish()
        self.approvals.append({"step_id": ev["step_id"], "by": done["by"],
                               "approver_pid": approver.pid, "agent_pid": agent.pid})
        self.say(f"approved by {done['by']}, a process of its own, while the agent "
                 f"(pid {agent.pid}) waits")

    def trace(self) -> dict[str, Any]:
        return {"crashes": len(self.kills), "kills": self.kills, "agent_pids": self.agent_pids,
                "approved": self.approvals, "agent_seconds": self.agent_seconds,
                "start_seconds": self.start_seconds}


def kill_steps(steps: int) -> range:
    """The steps a kill may follow: none in the last quarter of the run. The demo hears
    of a step after the agent made it, and a fast agent (1,000 steps/s) can finish the
    run between the step that was due a kill and the signal: every kill asked for must
    land while the run still has steps to go."""
    return range(1, max(2, steps * 3 // 4))


def check_options(steps: int, crashes: int) -> None:
    if steps < STEPS_PER_TICKET:
        raise ConfigError(f"--steps {steps}: the agent needs at least {STEPS_PER_TICKET} "
                          f"steps (one ticket); the default is {DEFAULT_STEPS}")
    most = len(kill_steps(steps))
    if not 0 <= crashes <= most:
        raise ConfigError(f"--crashes {crashes}: give 0 to {most} for --steps {steps} "
                          "(at most one kill after each step of the first three quarters)")


@click.command()
@click.argument("directory", metavar="[DIR]", required=False, type=output.STORE_PATH)
@click.option("--steps", default=DEFAULT_STEPS, show_default=True, type=int,
              help="Agent steps (supersteps: four per ticket).")
@click.option("--crashes", default=DEFAULT_CRASHES, show_default=True, type=int,
              help="How many times to SIGKILL the agent at a random moment.")
@click.option("--seed", default=None, type=int,
              help="Seed of the kill moments (default: a random one, printed).")
@click.option("--durability", type=click.Choice(DURABILITIES), default=SYNC,
              show_default=True, help="When a commit's bytes are safe (see README).")
@output.json_option
@click.pass_context
def demo(ctx: click.Context, directory: Path | None, steps: int, crashes: int,
         seed: int | None, durability: str, as_json: bool) -> None:
    """Watch an agent survive SIGKILLs: no tool repeated, no model call paid twice.

    A support-desk agent (durkv.Graph: a scripted model, a read-only lookup, a
    send_email tool that writes an outbox, a human approval before a large refund)
    runs on DIR/agent.durkv in a child process (DIR: new, empty, or an earlier demo's;
    a temporary directory if omitted). The demo kills it with SIGKILL at random
    moments, resumes it each time in a new process, approves the refund from another
    process while the agent waits, then checks the outbox, the model's bill and the
    journal against each other and runs verify.

    Exit status: 0 every promise held; 1 one did not (or a process failed);
    2 bad options; 3 the log is damaged.

    \b
    Example:
        durkv demo
        durkv demo ./demo --steps 100 --crashes 2 --seed 7
        durkv demo --json | jq '.send_email.duplicates'
    """
    ctx.meta[JSON_KEY] = as_json
    check_options(steps, crashes)
    workdir, run_id = prepare(directory)
    seed = random.SystemRandom().randrange(1 << 31) if seed is None else seed

    def say(line: str) -> None:
        if not as_json:
            click.echo(line)

    say(f"durkv demo: {workdir} (seed {seed}, durability={durability})")
    t0 = time.monotonic()
    d = Demo(workdir, run_id, steps, crashes, seed, durability, say)
    d.run()
    trace = d.trace()
    f = {"dir": str(workdir), "store": str(workdir / STORE_NAME), "run_id": run_id,
         "seed": seed, "durability": durability, **trace,
         **demo_report.figures(workdir, run_id), "seconds": time.monotonic() - t0,
         "next": demo_report.next_commands(workdir, run_id)}
    f["steps_per_s"] = f["steps"] / trace["agent_seconds"] if trace["agent_seconds"] else 0.0
    problems = demo_report.broken_promises(f)
    f["ok"], f["problems"] = not problems and f["verify"]["ok"], problems
    if as_json:
        output.emit_json(f)
    else:
        for line in demo_report.text(f):
            click.echo(line)
    # the figures are printed whole first (one JSON document under --json); then one line
    if not f["verify"]["ok"]:
        damage = "; ".join(f["verify"]["damage"]) or f["verify"]["summary"]
        click.echo(f"error: verify found damage in {f['store']}: {damage}", err=True)
        ctx.exit(output.EXIT_CORRUPT)
    if problems:
        click.echo(f"error: a promise did not hold: {'; '.join(problems)}", err=True)
        ctx.exit(output.EXIT_ERROR)
