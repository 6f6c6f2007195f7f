"""Child process of test_kill_journal.py: a 300-step agent driven through the run journal.

Usage: journal_child.py STORE WORKDIR EXEC MODE STEPS   (MODE: plain | async)

Each step makes a recorded model call (it appends ``EXEC i`` to WORKDIR/models.log
when it really runs), asks for an approval every 50 steps, sleeps once (step 150)
and calls a mutating tool that appends its idempotency key to WORKDIR/effects.log
and fsyncs (``async``: two tools at once with asyncio.gather). Prints ``READY``
after opening the store and ``GO`` once the run's journal is read, then at the end ``END DONE <digest>`` or ``END WAITING
<step_id>``, and waits to be killed (the parent kills every child, so a child that
ends never races the parent's kill). The test runs it through forkserver.py
(``main(argv)`` in a fork of a process that imported this module once).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import xxhash

import durkv

RUN = "agent"
STEPS = 300


def make_agent(work: str, exe: int, steps: int = STEPS):
    def model(i):
        time.sleep(0.003)      # a model call takes time (and the kills need a running agent)
        with open(os.path.join(work, "models.log"), "a") as f:
            f.write(f"{exe} {i}\n")
        return f"m{i}"

    @durkv.tool(version="1", name="effect")
    def effect(i, j=0, *, idempotency_key):
        fd = os.open(os.path.join(work, "effects.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o644)
        try:
            os.write(fd, f"{idempotency_key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return f"r{i}.{j}"

    def plain(run) -> str:
        h = xxhash.xxh3_64()
        for i in range(steps):
            m = run.step("model", model, i)
            if i % 50 == 49 and not run.approve("publish", {"i": i, "m": m}).approved:
                h.update(f"{i} rejected;".encode())
                continue
            if i == 150:
                run.sleep(0.2)
            h.update(f"{i} {m} {run.tool(effect, i)};".encode())
        return h.hexdigest()

    async def concurrent(run) -> str:
        h = xxhash.xxh3_64()
        for i in range(steps):
            m = await run.astep("model", model, i)
            if i % 50 == 49 and not (await run.aapprove("publish", {"i": i, "m": m})).approved:
                h.update(f"{i} rejected;".encode())
                continue
            if i == 150:
                await run.asleep(0.2)
            a, b = await asyncio.gather(run.atool(effect, i, 0), run.atool(effect, i, 1))
            h.update(f"{i} {m} {a} {b};".encode())
        return h.hexdigest()

    return plain, concurrent


def decision_for(payload: dict) -> bool:
    """The parent's (and the reference's) decision: every approval but step 99's."""
    return payload["i"] != 99


def drive(store, work: str, exe: int, mode: str, steps: int = STEPS,
          opened=lambda: None) -> tuple[str, str]:
    """One execution: ("DONE", digest) or ("WAITING", step_id). ``opened()`` is called
    once the run's journal is read (the parent's kill clock starts there)."""
    plain, concurrent = make_agent(work, exe, steps)
    digest = ""
    if mode == "plain":
        with store.run(RUN, input={"agent": mode}) as run:
            opened()
            digest = plain(run)
    else:
        run = store.arun(RUN, input={"agent": mode})

        async def main():
            async with run:
                opened()
                return await concurrent(run)     # None when the run paused
        digest = asyncio.run(main())
    if run.status == "waiting":
        return "WAITING", run.interrupt.step_id
    return "DONE", digest


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())     # one write per line: lines never interleave


def main(argv: list[str] | None = None) -> None:
    path, work, exe, mode, steps = argv if argv is not None else sys.argv[1:6]
    with durkv.open(path, durability="async") as store:
        say("READY")
        what, arg = drive(store, work, int(exe), mode, int(steps), opened=lambda: say("GO"))
    say(f"END {what} {arg}")
    time.sleep(600)


if __name__ == "__main__":
    main()
