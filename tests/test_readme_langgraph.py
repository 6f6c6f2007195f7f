"""The README's LangGraph quick start works as written, and a second run of it resumes the
thread: the first invocation's model call and ticket are not made again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import json

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_langgraph_example(tmp_path):
    text = README.read_text()
    section = text[text.index("## Quick start: LangGraph"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    runs = [subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    first = runs[0].stdout.splitlines()
    assert first[0].startswith("filed 'assistant: I will file ticket 1' (key t1:")
    assert first[1] == ("['user: my printer is on fire', 'assistant: I will file ticket 1', "
                        "'tool: T-1']")
    second = runs[1].stdout.splitlines()      # a new invocation of the thread: one more ticket
    assert len(second) == 2 and second[0].startswith("filed 'assistant: I will file ticket 4'")
    assert second[0] != first[0]              # a new task, so a new idempotency key
    # what the README says to look at: `durkv journal` lists each call once, with its result
    shown = subprocess.run([sys.executable, "-m", "durkv.cli", "journal", "--json",
                            str(tmp_path / "agent.durkv"), "t1"], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    calls = [(e["kind"], e["planned_action"], e["result_receipt"])
             for e in json.loads(shown.stdout)["journal"]]
    assert calls == [("step", "model", "assistant: I will file ticket 1"),
                     ("tool", "file_ticket", "T-1"),
                     ("step", "model", "assistant: I will file ticket 4"),
                     ("tool", "file_ticket", "T-1")]
