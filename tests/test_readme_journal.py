"""The README's "Durable steps" example works as written: the first run says it waits and
records the decision, the second sends once, the third sends nothing."""

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
    assert runs[0].stdout == ("run ticket-42: waiting\n"          # paused, nothing sent
                              "waiting for approval of 'send' at step 1\n"
                              "approved by ann: run this script again to send the email, once\n")
    assert runs[1].stdout == "sending to a@b (key ticket-42:2)\nrun ticket-42: finished\n"
    assert runs[2].stdout == "run ticket-42: finished\n"     # replayed, not sent again
