"""Every test docs/GUARANTEES.md and README.md cite exists: a promise whose named test
is gone (renamed, moved, deleted) is a promise nothing checks.

A citation is `tests/<file>.py::<test>`, or `::<test>` after one, meaning the file last
named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`|`::(\w+)`")


def _citations(text: str):
    current = None
    for m in CITE.finditer(text):
        path, test, bare = m.groups()
        if path:
            current = path
            yield path, test
        elif current is not None:
            yield current, bare


def test_every_cited_test_exists():
    missing = []
    for doc in ("docs/GUARANTEES.md", "README.md"):
        for path, test in _citations((ROOT / doc).read_text()):
            f = ROOT / path
            if not f.exists():
                missing.append(f"{doc}: {path} (no such file)")
            elif test and not re.search(rf"^\s*(async )?def {test}\b", f.read_text(), re.M):
                missing.append(f"{doc}: {path}::{test}")
    assert not missing, "cited tests that do not exist:\n" + "\n".join(missing)
