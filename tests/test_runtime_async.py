"""The awaitable forms: astep/atool/aapprove/asleep and `async with store.arun(...)`."""

from __future__ import annotations

import asyncio

import pytest

import durkv


def test_gather_gets_step_ids_in_issue_order(url):
    done = []

    @durkv.tool(name="slow")
    async def slow(tag, delay, *, idempotency_key):
        await asyncio.sleep(delay)
        done.append((tag, idempotency_key))
        return tag

    async def agent(store):
        async with store.arun("r", input=1) as run:
            # the first finishes last: ids follow the order of issue, not of completion
            a, b = await asyncio.gather(run.atool(slow, "a", 0.05), run.atool(slow, "b", 0.0))
            c = await run.astep("model", _amodel, "q")
            return a, b, c

    with durkv.open(url) as s:
        assert asyncio.run(agent(s)) == ("a", "b", "Q")
        assert done == [("b", "r:1"), ("a", "r:0")]
        assert asyncio.run(agent(s)) == ("a", "b", "Q")       # replayed, nothing called
        assert len(done) == 2
        j = durkv.Run(s, "r").journal()
        assert [(e.step_id, e.planned_action, e.inputs[0][0]) for e in j] == [
            ("0", "slow", "a"), ("1", "slow", "b"), ("2", "model", "q")]


def test_tasks_a_calls_function_starts_do_not_shift_the_ids_of_tasks_gathered_after(url):
    # fetch_all gathers its own requests (tasks, as wait_for makes one): a replay does not
    # run it, so those tasks must not take paths in the run's task tree, or the pipelines
    # gathered after it get other step ids on the re-execution and send again
    sent = []

    async def get(u):
        await asyncio.sleep(0)
        return f"<{u}>"

    @durkv.tool(name="fetch_all")
    async def fetch_all(urls, *, idempotency_key):
        pages = await asyncio.gather(*(get(u) for u in urls))
        return [await asyncio.wait_for(get(p), 5) for p in pages]

    @durkv.tool(name="send")
    async def send(body, *, idempotency_key):
        sent.append(idempotency_key)
        return "sent"

    async def pipeline(run, page):
        return await run.atool(send, await run.astep("summarize", _amodel, page))

    async def child_pipe(run, x):
        return await run.astep("c", _amodel, x)

    async def child_run(store):      # another run opened inside a call keeps its own tree
        async with store.arun("child") as run:
            return await asyncio.gather(*(child_pipe(run, x) for x in "ab"))

    async def agent(store):
        async with store.arun("r") as run:
            pages = await run.atool(fetch_all, ["a", "b"])
            await run.astep("nested run", lambda: child_run(store))
            return await asyncio.gather(*(pipeline(run, p) for p in pages))

    with durkv.open(url) as s:
        assert asyncio.run(agent(s)) == ["sent", "sent"]
        assert sorted(sent) == ["r:0/1", "r:1/1"]
        assert asyncio.run(agent(s)) == ["sent", "sent"]      # replayed: nothing sent
        assert len(sent) == 2
        assert [e.step_id for e in durkv.Run(s, "child").journal()] == ["0/0", "1/0"]


async def _amodel(p):
    await asyncio.sleep(0)
    return p.upper()


def test_aapprove_and_asleep(url):
    naps = []
    now = [100.0]

    async def nap(d):
        naps.append(d)
        now[0] += d

    async def agent(store):
        run = store.arun("r", clock=lambda: now[0], sleep=nap)
        async with run:
            await run.asleep(5)
            d = await run.aapprove("go", {"x": 1})
            return d.approved
        return run

    with durkv.open(url) as s:
        r = asyncio.run(agent(s))
        assert isinstance(r, durkv.Run) and r.status == "waiting"
        s.decide("r", r.interrupt.step_id, True)
        assert asyncio.run(agent(s)) is True
        assert naps == [5.0]          # the recorded wake time: no second sleep


def test_astep_retries_and_records_failure(url):
    calls = []

    async def flaky():
        calls.append(1)
        raise TimeoutError("slow model")

    async def agent(store):
        async with store.arun("r") as run:
            await run.astep("m", flaky, retry=durkv.Retry(3, backoff=0, jitter=0))

    with durkv.open(url) as s:
        for _ in range(2):
            with pytest.raises(TimeoutError):
                asyncio.run(agent(s))
        assert len(calls) == 3


def test_no_fdatasync_wait_on_the_event_loop_under_sync(tmp_path):
    """Every durable wait of every async verb runs off the loop's thread (durability=sync)."""
    import threading

    waits: list = []

    @durkv.tool(name="charge")
    async def charge(n, *, idempotency_key):
        return n

    async def agent(store):
        loop_thread = threading.get_ident()
        async with store.arun("r", input=1) as run:
            await run.astep("model", _amodel, "q")
            await run.atool(charge, 1)
            await run.asleep(0)
            await run.acompensate()
            await run.aapprove("pay", 1)
        return loop_thread

    with durkv.open(str(tmp_path / "s"), durability="sync") as s:
        b = s._b
        real = b.wait_durable

        def spy(lsn):
            waits.append(threading.get_ident())
            return real(lsn)
        b.wait_durable = spy
        loop_thread = asyncio.run(agent(s))
        assert durkv.Run(s, "r").journal()[-1].kind == "approval"
    assert len(waits) >= 5          # RUN, step, intent, receipt, sleep, approval, status
    assert loop_thread not in waits


class Killed(BaseException):
    """A kill between a tool's call and its receipt, as the run sees it."""


def test_no_fdatasync_wait_on_the_event_loop_for_an_in_doubt_atool(tmp_path):
    """An at-most-once atool met in doubt journals the run's in_doubt status before it
    raises InDoubtError: under sync that record's fdatasync is waited for off the loop."""
    import threading

    waits: list = []

    @durkv.tool(name="wire", at_most_once=True)
    async def wire(n, *, idempotency_key):
        raise Killed("killed after the call, before its receipt")

    async def agent(store):
        async with store.arun("r", input=1) as run:
            await run.atool(wire, 1)

    with durkv.open(str(tmp_path / "s"), durability="sync") as s:
        with pytest.raises(Killed):
            asyncio.run(agent(s))           # a durable intent, no receipt
        b = s._b
        real = b.wait_durable
        loop_threads: list = []

        def spy(lsn):
            waits.append(threading.get_ident())
            return real(lsn)

        async def in_doubt():
            loop_threads.append(threading.get_ident())
            async with s.arun("r", input=1) as run:
                n = len(waits)
                with pytest.raises(durkv.InDoubtError):
                    await run.atool(wire, 1)
                assert len(waits) > n       # the in_doubt status was waited for
                raise durkv.InDoubtError("again", run_id="r", step_id="0", key="r:0")

        b.wait_durable = spy
        with pytest.raises(durkv.InDoubtError, match="again"):
            asyncio.run(in_doubt())
        assert s.runs()[0].status == "in_doubt"
    assert waits and loop_threads[0] not in waits


def test_async_with_releases_the_run_only_after_every_call_it_started_records(tmp_path):
    """gather(run.atool(a), run.atool(b)) raises as soon as `a` fails, while `b` runs
    on. The `async with` released the run at once and `b`'s receipt landed after the
    run's final status, while another driver could hold the run. Its exit now waits for
    `b` to record."""
    from durkv.runtime.records import E_RECEIPT, E_STATUS

    effects = []

    @durkv.tool(at_most_once=True)
    async def pay(i, *, idempotency_key):
        if i == 0:
            raise ValueError("declined")
        await asyncio.sleep(0.3)
        effects.append(i)
        return i

    async def agent(store):
        async with store.arun("o") as run:
            await asyncio.gather(run.atool(pay, 0), run.atool(pay, 1))

    with durkv.open(str(tmp_path / "s")) as store:
        with pytest.raises(ValueError, match="declined"):
            asyncio.run(agent(store))
        assert effects == [1]                   # the sibling finished before the exit
        kinds = [r["e"] for r in store.journal("o")]
        assert E_RECEIPT in kinds and kinds[-1] == E_STATUS      # the receipt, then the end
        assert store.runs()[0].status == "failed"


def test_a_cancelled_exit_still_releases_the_run(tmp_path):
    """The exit's wait for a call under way can be cancelled: the run is released all
    the same (a new driver opens it)."""

    @durkv.tool
    async def slow(*, idempotency_key):
        await asyncio.sleep(30)

    @durkv.tool
    async def fails(*, idempotency_key):
        raise ValueError("no")

    async def agent(store):
        async with store.arun("c") as run:
            await asyncio.gather(run.atool(fails), run.atool(slow))

    async def main(store):
        t = asyncio.create_task(agent(store))
        await asyncio.sleep(0.3)                # in the exit's wait for `slow`
        t.cancel()
        with pytest.raises((asyncio.CancelledError, ValueError)):
            await t

    with durkv.open(str(tmp_path / "s")) as store:
        asyncio.run(main(store))
        with store.run("c"):                    # released: no RunBusyError
            pass


def test_a_run_cancelled_while_it_opens_lets_its_claim_go(tmp_path):
    # a request handler whose client went away: cancelled while `async with` waits for
    # the fsync of the run's first record; __aexit__ never runs
    async def handler(store):
        async with store.arun("job") as run:
            await run.astep("s", lambda: 1)

    async def main(store):
        t = asyncio.create_task(handler(store))
        await asyncio.sleep(0)          # the task now awaits its open's fsync
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert store.claim_held("run", "job") is None
        async with store.arun("job") as run:        # not RunBusyError
            return await run.astep("s", lambda: 1)

    with durkv.open(str(tmp_path / "s"), durability="sync") as s:
        assert asyncio.run(main(s)) == 1


@pytest.mark.skipif(not hasattr(asyncio, "TaskGroup"), reason="asyncio.TaskGroup: 3.11+")
def test_approvals_in_a_task_group_pause_the_run(url):
    # a TaskGroup wraps the pause in a BaseExceptionGroup: the run was recorded failed and
    # the group escaped to the caller
    async def review(run, doc):
        return (await run.aapprove("publish", {"doc": doc})).approved

    async def main(store):
        async with store.arun("pub") as run:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(review(run, doc)) for doc in "ab"]
            return [t.result() for t in tasks]

    with durkv.open(url) as s:
        assert asyncio.run(main(s)) is None             # paused, nothing escaped
        (r,) = s.runs()     # the pause that reached the group first names its step
        assert r.status == "waiting" and r.step in ("0/0", "1/0")
        s.decide("pub", "0/0", True)
        s.decide("pub", "1/0", False)
        assert asyncio.run(main(s)) == [True, False]
        assert s.runs()[0].status == "finished"


def test_an_at_most_once_atool_cancelled_before_its_call_is_not_in_doubt(tmp_path):
    # a timeout, a TaskGroup sibling's failure, a dropped client: cancelled while its
    # intent's fsync was waited for, the tool never began; the next execution found it
    # in doubt although this process knew it never ran
    calls = []

    @durkv.tool(at_most_once=True, name="charge")
    async def charge(amount, *, idempotency_key):
        calls.append(idempotency_key)
        return f"charged {amount}"

    async def first(store):
        async with store.arun("order") as run:
            task = asyncio.create_task(run.atool(charge, 10))
            await asyncio.sleep(0)          # it now awaits its intent's fsync
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    async def second(store):
        async with store.arun("order") as run:
            return await run.atool(charge, 10)

    path = str(tmp_path / "s")
    with durkv.open(path, durability="sync") as s:
        asyncio.run(first(s))
        assert calls == []
        assert asyncio.run(second(s)) == "charged 10"      # not InDoubtError
        assert calls == ["order:0"]
        assert asyncio.run(second(s)) == "charged 10"      # replayed
        assert calls == ["order:0"]


def test_undos_of_gathered_calls_follow_issue_order_so_a_re_execution_replays(tmp_path):
    # the hotel is booked first and completes last: its undo order must not follow
    # completion, which a replay (completing in issue order) cannot reproduce
    undone = []

    @durkv.tool(name="cancel_hotel")
    def cancel_hotel(res, *, idempotency_key):
        undone.append(res)
        return f"cancelled {res}"

    @durkv.tool(name="cancel_flight")
    def cancel_flight(res, *, idempotency_key):
        undone.append(res)
        return f"cancelled {res}"

    @durkv.tool(name="book_hotel", compensate=cancel_hotel)
    async def book_hotel(city, *, idempotency_key):
        await asyncio.sleep(0.05)
        return f"hotel in {city}"

    @durkv.tool(name="book_flight", compensate=cancel_flight)
    async def book_flight(city, *, idempotency_key):
        return f"flight to {city}"

    def charge(amount):
        raise RuntimeError("card declined")

    async def trip(store):
        async with store.arun("trip") as run:
            await asyncio.gather(run.atool(book_hotel, "Rome"), run.atool(book_flight, "Rome"))
            try:
                await run.astep("charge", charge, 500)
            except RuntimeError:
                return await run.acompensate()

    with durkv.open(str(tmp_path / "s")) as s:
        first = asyncio.run(trip(s))
        assert first == ["cancelled flight to Rome", "cancelled hotel in Rome"]
        assert asyncio.run(trip(s)) == first        # replayed, not NonDeterminismError
        assert undone == ["flight to Rome", "hotel in Rome"]


def test_a_sleep_that_outlives_its_run_writes_nothing_after_the_runs_end(tmp_path):
    # gather(asleep, a step that fails): the block ends at the failure, recorded failed;
    # the sleep woke later on the still-running loop and journaled "running"
    def refuse():
        raise ValueError("model refused")

    async def main(store):
        with pytest.raises(ValueError):
            async with store.arun("job") as run:
                await asyncio.gather(run.asleep(0.2), run.astep("m", refuse))
        assert [r.status for r in store.runs()] == ["failed"]
        await asyncio.sleep(0.5)        # the server's loop goes on; the sleep wakes
        return [r.status for r in store.runs()]

    with durkv.open(str(tmp_path / "s")) as s:
        assert asyncio.run(main(s)) == ["failed"]
