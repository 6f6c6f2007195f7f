"""A keyed tool's intent on a live s3:// store under ``async`` (docs/GUARANTEES.md 16.9):
there a kill loses every commit since the last PUT, so the intent gets a PUT of its own
before the call (on a local store it is only written)."""

from __future__ import annotations

import durkv


def test_a_keyed_tools_intent_is_in_s3_before_the_call_under_async(s3_env, bucket):
    url = f"s3://{bucket}/live"
    seen = []

    @durkv.tool
    def send(n, *, idempotency_key):
        with durkv.open(url, read_only=True) as r:      # what a kill of the writer leaves
            seen.append([rec["e"] for rec in r.journal("r")])
        return n

    # the flusher would PUT only after a minute: whatever S3 holds in the tool was PUT
    # for the intent itself
    with durkv.open(url, durability="async", flush_interval_ms=60_000) as s:
        assert not s.commits_survive_kill
        with s.run("r") as run:
            assert run.tool(send, 1) == 1
    assert seen[0][-1] == 3, "the intent was not in S3 when the tool ran"      # INTENT
    with durkv.open(url, read_only=True) as r:
        assert [rec["e"] for rec in r.journal("r")][-2:] == [4, 8]     # RECEIPT, STATUS
