"""Small agents that test_runtime_kill.py runs in a child (killed by a real SIGKILL at a
chosen instant inside a tool) and then again in the test process, with the same code.

Usage: journal_agents.py STORE WORKDIR AGENT KILL_AT   (the child SIGKILLs itself at
KILL_AT; it exits 0 if KILL_AT was never reached, which the test treats as a failure).

Every tool call appends ``<what> <idempotency key>`` to WORKDIR/effects.log and
fsyncs before it returns: that file is what the outside world saw.
"""

from __future__ import annotations

import os
import signal
import sys

import durkv


def effect(work: str, what: str, key: str) -> None:
    fd = os.open(os.path.join(work, "effects.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def effects(work: str) -> list[tuple[str, str]]:
    p = os.path.join(work, "effects.log")
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return [tuple(ln.split()) for ln in f.read().splitlines()]


def _kill_here(kill_at: str | None, here: str) -> None:
    if kill_at == here:
        os.kill(os.getpid(), signal.SIGKILL)


def pay_agent(run, work: str, kill_at: str | None = None):
    """A plan, an at-most-once payment, then a shipment that needs the payment's receipt."""

    @durkv.tool(at_most_once=True, name="pay", version="1")
    def pay(amount, *, idempotency_key):
        _kill_here(kill_at, "before-pay")        # killed before the service saw the call
        effect(work, "pay", idempotency_key)
        _kill_here(kill_at, "after-pay")         # killed after it, before the receipt
        return {"paid": amount}

    @durkv.tool(name="ship", version="1")
    def ship(receipt, *, idempotency_key):
        effect(work, f"ship-{receipt['paid']}", idempotency_key)
        return "shipped"

    run.step("plan", lambda: "plan-1")
    receipt = run.tool(pay, 10)
    return run.tool(ship, receipt)


def trip_agent(run, work: str, kill_at: str | None = None):
    """Three reservations, then their compensation (newest first)."""

    @durkv.tool(name="release")
    def release(what, *, idempotency_key):
        effect(work, f"release-{what}", idempotency_key)
        _kill_here(kill_at, what)                # killed inside an undo, before its receipt
        return f"released {what}"

    @durkv.tool(compensate=release, name="reserve")
    def reserve(what, *, idempotency_key):
        effect(work, f"reserve-{what}", idempotency_key)
        return what

    for what in ("hotel", "flight", "car"):
        run.tool(reserve, what)
    return run.compensate()


def nap_agent(run, work: str, kill_at: str | None = None):
    """A step, an hour's durable sleep, a step."""
    run.step("before", lambda: "a")
    run.sleep(3600)
    return run.step("after", lambda: "b")


AGENTS = {"pay": pay_agent, "trip": trip_agent, "nap": nap_agent}


def main() -> None:
    path, work, agent, kill_at = sys.argv[1:5]
    # kill_at "sleep": killed as the durable sleep begins
    sleep = (lambda s: _kill_here("sleep", "sleep")) if kill_at == "sleep" else None
    with durkv.open(path, durability="async") as store, \
            store.run(agent, sleep=sleep) as run:
        AGENTS[agent](run, work, kill_at)


if __name__ == "__main__":
    main()
