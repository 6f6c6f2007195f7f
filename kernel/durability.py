"""The durability policies: their one list of names, and their order of strength.

- ``sync``: a commit returns once its frame is written and fdatasync'd.
- ``async``: a commit returns once written to the OS; a flusher syncs it soon after.
- ``exit``: frames stay in the process until ``flush()``/``close()``.

docs/GUARANTEES.md section 1 states what each survives. Every layer (the log, the
backends, the store, the LangGraph saver, the command line) takes these names from
here; nothing below this module is needed, so anything may import it.

>>> DURABILITIES
('sync', 'async', 'exit')
>>> STRENGTH["sync"] > STRENGTH["async"] > STRENGTH["exit"]
True
"""

from __future__ import annotations

__all__ = ["SYNC", "ASYNC", "EXIT", "DURABILITIES", "STRENGTH"]

SYNC = "sync"
ASYNC = "async"
EXIT = "exit"

DURABILITIES = (SYNC, ASYNC, EXIT)
"""Every policy, strongest first: the order errors and ``--help`` list them in."""

STRENGTH = {EXIT: 0, ASYNC: 1, SYNC: 2}
"""Higher is stronger: a frame made durable under one policy meets every weaker one."""
