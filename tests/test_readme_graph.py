"""The README's durkv.Graph example works as written (run three times: pause, finish,
finished)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_durable_graph_example(tmp_path):
    text = README.read_text()
    section = text[text.index("## Durable graphs: `durkv.Graph`"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 30
    runs = [subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60) for _ in range(3)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    # superstep 0 sends, superstep 1 pauses at the approval before its tool
    assert runs[0].stdout == "sent 'HI' (key ticket-7:0:agent:0:1)\n"
    # resumed: only the paused node runs again (its model call replayed), then one more turn
    assert runs[1].stdout == ("sent 'HI' (key ticket-7:1:agent:0:2)\n"
                              "sent 'HI' (key ticket-7:2:agent:0:1)\n")
    assert runs[2].stdout == ""                 # finished: nothing runs
