"""The agent ``durkv demo`` runs: a support desk on ``durkv.Graph``, and its two processes.

No network and no keys: the "model" is scripted (deterministic, it bills each call it
answers by a line in ``model-calls.log``), ``lookup_order`` is a read-only tool (a
recorded step), and ``send_email`` is a mutating ``@durkv.tool`` whose mail service
appends one line per email it really sends to ``outbox.jsonl`` -- the effect -- and
deduplicates requests by the idempotency key durkv passes it, as a real mail API does.
Every request it receives (repeats included) is logged in ``mail-requests.jsonl``.

The graph works through a queue of tickets, four supersteps each: the model plans
(``model``), looks the order up (``act``), the model drafts the reply (``model``), the
reply is sent (``act``). One ticket is a large refund: its email waits for a human
approval (``ctx.approve``) before it is sent.

Two entry points run as child processes of ``durkv demo`` (:mod:`durkv.cli.demo`):
:func:`agent_main` drives the run and reports what happens as one JSON line per event on
stdout; :func:`approver_main` decides the approval from another process.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .. import Append, END, START, Graph, Last, tool
from .. import open as open_store

GRAPH_NAME = "durkv-demo-support-desk"
STORE_NAME = "agent.durkv"
OUTBOX_NAME = "outbox.jsonl"            # one line per email sent: the effect
REQUESTS_NAME = "mail-requests.jsonl"   # one line per request the mail service received
MODEL_CALLS_NAME = "model-calls.log"    # one line per model call paid
PROMPT_VERSION = "support-v1"
STEPS_PER_TICKET = 4
REFUND_LIMIT = 500                      # refunds above this need a human's approval
APPROVAL_POLL = 0.05                    # seconds between the waiting agent's looks

CUSTOMERS = ("ada", "grace", "linus", "barbara", "ken", "margaret", "dennis", "frances")
ISSUES = ("late delivery", "wrong size", "damaged box", "address change", "missing item")


def approval_ticket(steps: int) -> int:
    """The ticket that asks for a large refund: about 60% into the run, always whole
    within ``steps`` supersteps (``steps >= STEPS_PER_TICKET``)."""
    return (steps * 3 // 5) // STEPS_PER_TICKET


def ticket(n: int, refund_ticket: int) -> dict:
    """Ticket ``n`` of the queue (deterministic: a re-run sees the same queue)."""
    who = CUSTOMERS[n % len(CUSTOMERS)]
    if n == refund_ticket:
        issue, amount = "refund request", 1250
    else:
        issue, amount = ISSUES[n % len(ISSUES)], 20 + (n * 37) % 180
    return {"id": n, "customer": f"{who}@example.com", "order_id": 10_000 + 7 * n,
            "issue": issue, "amount": amount}


def append_line(path: Path, line: str) -> None:
    """One ``write(2)`` of a whole line in append mode: concurrent or killed writers never
    leave half a line behind another."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def tell(ev: str, **fields: Any) -> None:
    """One event for the parent ``durkv demo``: a JSON line on stdout."""
    print(json.dumps({"ev": ev, "pid": os.getpid(), **fields}), flush=True)


class SignalsToParent(logging.Handler):
    """durkv's operator signals (its logger's warnings: a tool called again after a
    crash, version drift) as events, so that the demo prints them in its story."""

    def emit(self, record: logging.LogRecord) -> None:
        tell("signal", msg=record.getMessage())


class MailService:
    """The outside world's mail API: it sends an email once per idempotency key."""

    def __init__(self, workdir: Path) -> None:
        self.outbox = workdir / OUTBOX_NAME
        self.requests = workdir / REQUESTS_NAME
        self.sent: dict[str, str] = {}      # key -> message id, as the service remembers
        if self.outbox.exists():
            for line in self.outbox.read_text().splitlines():
                rec = json.loads(line)
                self.sent[rec["key"]] = rec["message_id"]

    def send(self, key: str, to: str, subject: str, body: str) -> dict:
        append_line(self.requests, json.dumps({"key": key, "pid": os.getpid()}))
        if key in self.sent:        # a retry after a crash: the key says it was sent
            tell("repeat", key=key)
            return {"message_id": self.sent[key], "to": to}
        mid = f"msg-{len(self.sent) + 1:05d}"
        append_line(self.outbox, json.dumps({"key": key, "message_id": mid, "to": to,
                                             "subject": subject, "body": body,
                                             "pid": os.getpid()}))
        self.sent[key] = mid
        return {"message_id": mid, "to": to}


class Desk:
    """The agent's world in one process: the scripted model, the order database, the mail
    service, and counters of calls asked for vs really made (the difference was replayed
    from the journal)."""

    def __init__(self, workdir: Path, run_id: str) -> None:
        self.run_id = run_id
        self.model_calls = workdir / MODEL_CALLS_NAME
        self.mail = MailService(workdir)
        self.asked = 0      # durable calls the nodes made (ctx.step / ctx.tool)
        self.made = 0       # of them, the calls that really ran in this process

    def model(self, tk: dict, phase: str, last: str) -> dict:
        """The scripted LLM: plans a lookup, then drafts the reply from what it found.
        Each answer is billed (a line in model-calls.log)."""
        self.made += 1
        if phase == "plan":
            out = {"say": f"ticket {tk['id']} ({tk['issue']}): let me look up order "
                          f"#{tk['order_id']}",
                   "call": {"tool": "lookup_order", "args": {"order_id": tk["order_id"]}}}
        else:
            subject = f"Re: your {tk['issue']} (order #{tk['order_id']})"
            body = (f"Hello {tk['customer'].split('@')[0].title()}, {last.split(': ', 1)[-1]}. "
                    f"We are sorry about the {tk['issue']} and have fixed it.")
            if tk["issue"] == "refund request":
                body += f" A refund of ${tk['amount']:,} is on its way."
            args = {"to": tk["customer"], "subject": subject, "body": body}
            out = {"say": f"ticket {tk['id']}: replying to {tk['customer']}",
                   "call": {"tool": "send_email", "args": args,
                            "approval": tk["amount"] > REFUND_LIMIT}}
        append_line(self.model_calls, f"{self.run_id} {tk['id']} {phase} {os.getpid()}")
        return out

    def lookup_order(self, order_id: int) -> str:
        """The read-only tool: the order's status (a database read)."""
        self.made += 1
        return f"order #{order_id} shipped on day {order_id % 28 + 1}, tracking TR{order_id * 13}"

    def send_email_tool(self) -> Callable:
        """``send_email`` as a mutating tool: durkv passes the idempotency key, the mail
        service deduplicates by it."""
        @tool(version="1", name="send_email")
        def send_email(to: str, subject: str, body: str, *, idempotency_key: str) -> dict:
            self.made += 1
            return self.mail.send(idempotency_key, to, subject, body)
        return send_email


def build_graph(desk: Desk, refund_ticket: int) -> Graph:
    """The support desk: ``model`` and ``act`` alternate until the run's ``goal`` of
    supersteps is reached."""
    g = Graph({"messages": Append(), "call": Last(None), "turn": Last(0), "goal": Last(0)})
    send_email = desk.send_email_tool()

    @g.node
    def model(state: dict, ctx: Any) -> dict:
        turn = state["turn"]
        tk = ticket(turn // STEPS_PER_TICKET, refund_ticket)
        phase = "plan" if turn % STEPS_PER_TICKET == 0 else "reply"
        desk.asked += 1
        out = ctx.step("model", desk.model, tk, phase, state["messages"][-1],
                       prompt_version=PROMPT_VERSION)
        return {"messages": [f"assistant: {out['say']}"], "call": out["call"], "turn": turn + 1}

    @g.node
    def act(state: dict, ctx: Any) -> dict:
        call = state["call"]
        if call["tool"] == "lookup_order":
            desk.asked += 1
            found = ctx.step("lookup_order", desk.lookup_order, call["args"]["order_id"])
            msg = f"tool lookup_order: {found}"
        else:
            if call["approval"] and not ctx.approve("send_email", call["args"]).approved:
                msg = f"tool send_email: not sent to {call['args']['to']} (rejected)"
            else:
                desk.asked += 1
                sent = ctx.tool(send_email, **call["args"])
                msg = f"tool send_email: sent {sent['message_id']} to {sent['to']}"
        return {"messages": [msg], "call": None, "turn": state["turn"] + 1}

    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: END if s["turn"] >= s["goal"] else "act",
                            ["act", END])
    g.add_conditional_edges("act", lambda s: END if s["turn"] >= s["goal"] else "model",
                            ["model", END])
    return g


def first_input(steps: int) -> dict:
    return {"messages": ["system: you are the support desk; answer every ticket in the "
                         "queue, and ask a human before promising a large refund"],
            "goal": steps}


def quarantined(store_dir: Path) -> set[tuple[str, int]]:
    """(file, size) of what the store's opens have cut and kept (a torn tail's bytes)."""
    q = store_dir / "quarantine"
    if not q.is_dir():
        return set()
    return {(str(p), p.stat().st_size) for p in q.rglob("*") if p.is_file()}


def agent_main() -> None:
    """``python -c ... agent_main()`` STORE_DIR RUN_ID STEPS DURABILITY: run (or resume)
    the agent until it finishes, waiting for the approval when it asks for one."""
    workdir, run_id, steps, durability = (Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                          sys.argv[4])
    desk = Desk(workdir, run_id)
    signals = SignalsToParent(logging.WARNING)
    logging.getLogger("durkv").addHandler(signals)
    kept_before = quarantined(workdir / STORE_NAME)
    with open_store(str(workdir / STORE_NAME), durability=durability) as store:
        app = build_graph(desk, approval_ticket(steps)).compile(store, name=GRAPH_NAME)
        ck = store.get(run_id)
        cut = quarantined(workdir / STORE_NAME) - kept_before   # a torn tail, cut at open
        tell("start", step=0 if ck is None else ck.metadata.get("step", 0),
             journal=store.journal_length(run_id), torn_bytes=sum(n for _, n in cut))
        given = first_input(steps) if ck is None else None
        while True:
            for ss in app.stream(given, run_id=run_id):
                tell("step", step=ss.step, replayed=desk.asked - desk.made)
            given = None
            res = app.state(run_id)
            if res.status != "waiting":
                break
            pend = res.interrupt
            tell("waiting", step=res.step, step_id=pend.step_id, action=pend.action,
                 payload=pend.payload)
            while app.state(run_id).status == "waiting":     # a decision from anywhere
                time.sleep(APPROVAL_POLL)
            tell("decided", step_id=pend.step_id)
        tell("finished" if res.status == "finished" else "stopped", step=res.step,
             status=res.status, message=res.message)


def approver_main() -> None:
    """``python -c ... approver_main()`` STORE_DIR RUN_ID STEP_ID: the human's decision,
    from a process of its own while the agent's process holds the store open."""
    workdir, run_id, step_id = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    with open_store(str(workdir / STORE_NAME)) as store:
        d = store.decide(run_id, step_id, True, by=f"ops@example.com (pid {os.getpid()})",
                         note="refund checked against the order")
    tell("approved", step_id=step_id, by=d.by)
