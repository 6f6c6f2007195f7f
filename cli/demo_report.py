"""What ``durkv demo`` found, measured from the evidence rather than from the story.

Every figure is read after the run: steps and tool receipts from the store and the run
journal, effects from the outbox the mail service wrote, paid model calls from the
model's bill, bytes from the directory, and the log's health from the real ``verify``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import open as open_store
from ..runtime.view import describe
from . import output, reports
from .demo_agent import MODEL_CALLS_NAME, OUTBOX_NAME, REQUESTS_NAME, STORE_NAME
from .stores import log_module


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _keys_of_run(path: Path, run_id: str) -> list[str]:
    """The idempotency keys of a JSON-lines file's records that belong to ``run_id``."""
    keys = (json.loads(line)["key"] for line in _lines(path))
    return [k for k in keys if k.startswith(f"{run_id}:")]


def journal_figures(store_dir: Path, run_id: str) -> dict[str, Any]:
    """The run as the store holds it: steps, status, and its journal's calls by kind."""
    with open_store(str(store_dir), read_only=True) as store:
        ck = store.get(run_id)
        entries = describe(store, run_id)
    tools = [e for e in entries if e.kind == "tool"]
    return {
        "steps": 0 if ck is None else ck.metadata.get("step", 0),
        "status": None if ck is None else ck.metadata.get("status", "unfinished"),
        "model_steps": sum(e.kind == "step" and e.planned_action == "model" for e in entries),
        "lookups": sum(e.kind == "step" and e.planned_action == "lookup_order"
                       for e in entries),
        "receipt_keys": sorted(e.idempotency_key for e in tools if e.state == "done"),
        "tool_retries": sum(e.retry_count for e in tools),
        "approvals": [{"step_id": e.step_id, "status": e.approval_status}
                      for e in entries if e.kind == "approval"],
    }


def figures(workdir: Path, run_id: str) -> dict[str, Any]:
    """The demo's figures from the store, the outbox, the bill and ``verify``."""
    store_dir = workdir / STORE_NAME
    j = journal_figures(store_dir, run_id)
    effects = _keys_of_run(workdir / OUTBOX_NAME, run_id)
    requests = _keys_of_run(workdir / REQUESTS_NAME, run_id)
    bill = [line for line in _lines(workdir / MODEL_CALLS_NAME)
            if line.split(" ", 1)[0] == run_id]
    report = log_module().verify(str(store_dir))
    receipts = j["receipt_keys"]
    return {
        "steps": j["steps"], "status": j["status"], "lookups": j["lookups"],
        "approvals": j["approvals"],
        "model": {"calls_paid": len(bill), "model_steps": j["model_steps"],
                  "repaid": len(bill) - len({" ".join(b.split()[:3]) for b in bill})},
        "send_email": {
            "receipts": len(receipts), "retried_with_same_key": j["tool_retries"],
            "requests": len(requests), "effects": len(effects),
            "distinct_keys": len(set(effects)), "duplicates": len(effects) - len(set(effects)),
            "receipts_match_effects": sorted(set(effects)) == receipts,
        },
        "bytes_on_disk": dir_bytes(store_dir),
        "verify": {"ok": reports.is_clean(report), "summary": reports.summary(report),
                   "damage": [reports.damage_line(d) for d in report.damage]},
    }


def next_commands(workdir: Path, run_id: str) -> list[str]:
    store = workdir / STORE_NAME
    return [f"durkv runs {store}", f"durkv journal {store} {run_id}",
            f"durkv show {store} {run_id}", f"durkv verify {store}",
            f"cat {workdir / OUTBOX_NAME}"]


def text(f: dict[str, Any]) -> list[str]:
    """The closing report, a line per figure."""
    m, s = f["model"], f["send_email"]
    paid = ("each paid once" if m["calls_paid"] == m["model_steps"] and not m["repaid"] else
            f"{m['repaid']} paid twice: a kill fell between a reply and its journal record "
            "(a step is recorded after it returns)")
    repeats = s["requests"] - s["effects"]
    approvals = ", ".join(f"{a['step_id']} {a['status']}" for a in f["approvals"]) or "none"
    agent_pids = f["agent_pids"]
    return [
        f"done: run {f['run_id']} {f['status']} after {f['steps']} steps, "
        f"{f['crashes']} crashes survived, {len(agent_pids)} agent processes "
        f"(pids {', '.join(map(str, agent_pids))})",
        f"  model calls:  {m['calls_paid']} paid for {m['model_steps']} model steps: {paid}",
        f"  lookups:      {f['lookups']} read-only calls, each recorded in the journal",
        f"  send_email:   {s['receipts']} receipts in the journal, "
        f"{s['retried_with_same_key']} retried after a crash with the same key",
        f"  outbox:       {s['effects']} emails, {s['distinct_keys']} distinct keys, "
        f"duplicates: {s['duplicates']}; the mail service got {s['requests']} requests "
        f"({repeats} repeated a key and were not sent again)",
        f"  receipts vs outbox: "
        f"{'the same keys' if s['receipts_match_effects'] else 'DIFFERENT keys'}",
        f"  approvals:    {approvals}",
        f"  speed:        {f['steps_per_s']:.0f} steps/s while the agent ran "
        f"(durability={f['durability']}); the demo took {f['seconds']:.1f} s, "
        f"{f['start_seconds']:.1f} s of it starting {len(agent_pids)} Python processes",
        f"  on disk:      {output.human_bytes(f['bytes_on_disk'])} in {f['store']}",
        f"  verify:       {'ok' if f['verify']['ok'] else 'DAMAGED'}: {f['verify']['summary']}",
        *(f"  damage:       {d}" for d in f["verify"]["damage"]),
        "Look inside:",
        *(f"  {c}" for c in f["next"]),
    ]


def broken_promises(f: dict[str, Any]) -> list[str]:
    """What the figures show went wrong (empty: every promise held)."""
    s = f["send_email"]
    out = []
    if f["status"] != "finished":
        out.append(f"the run did not finish (status {f['status']})")
    if s["duplicates"]:
        out.append(f"{s['duplicates']} emails were sent twice")
    if not s["receipts_match_effects"]:
        out.append("the journal's receipts and the outbox's emails do not match")
    return out
