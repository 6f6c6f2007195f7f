"""The README's "Durable steps" example works as written (run twice: pause, then finish)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_durable_steps_example(tmp_path):
    text = README.read_text()
    section = text[text.index("## Durable steps"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    runs = [subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60) for _ in range(3)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout == ""                       # paused at the approval, nothing sent
    assert runs[1].stdout == "sending to a@b (key ticket-42:2)\n"
    assert runs[2].stdout == ""                       # finished: replayed, not sent again
