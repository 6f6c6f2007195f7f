"""``durkv stats`` on a live ``s3://`` store (issue 19): the same figures as on a local
store holding the same commits, read while its one writer holds the store."""

from __future__ import annotations

import json

import durkv
from click.testing import CliRunner
from durkv.cli import cli


def _fill(s) -> None:
    msgs: list[str] = []
    for i in range(12):
        msgs = msgs + [f"message {i} " + "z" * 60]
        s.put("t", "", f"{i:04d}", checkpoint={"i": i}, metadata={}, values={"msgs": msgs},
              versions={"msgs": i}, parent_id=f"{i - 1:04d}" if i else None)
        s.put_writes("t", "", f"{i:04d}", "task", [(0, "out", i)])
    s.append_journal("r", {"e": 1, "t": 0.0}, durable=True)


def test_stats_of_a_live_s3_store_while_its_writer_holds_it(tmp_path, s3_env, bucket):
    url = f"s3://{bucket}/agent"
    local = tmp_path / "agent.durkv"
    with durkv.open(str(local), compress_min_bytes=1 << 20) as s:
        _fill(s)
    with durkv.open(url, compress_min_bytes=1 << 20) as writer:
        _fill(writer)
        writer.flush()
        result = CliRunner().invoke(cli, ["stats", "--json", url], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        st = json.loads(result.stdout)
    ref = json.loads(CliRunner().invoke(cli, ["stats", "--json", str(local)]).stdout)
    same = ("threads", "runs", "checkpoints", "pending_writes", "journal_records",
            "channel_bytes", "whole_values_bytes", "whole_states_bytes")
    assert {k: st[k] for k in same} == {k: ref[k] for k in same}
    assert st["segments"] is None and st["url"] == url
    for kind in ("checkpoint_heads", "channel_full", "channel_delta", "pending_writes"):
        assert st["bytes_by_kind"][kind] == ref["bytes_by_kind"][kind], kind
