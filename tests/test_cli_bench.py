"""``durkv bench``: the real command, its JSON rows and ratios, the plot, and its errors.

The timing figures themselves are not checked (benchmarks report, tests do not time):
what is checked is that every row the run promises is there, measured (positive
figures, real bytes on disk), and that each ratio is the row's steps/s over its
baseline's, taken from rows of the same run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from durkv.cli.main import cli
from durkv.durability import DURABILITIES

HAVE_LANGGRAPH = importlib.util.find_spec("langgraph") is not None
HAVE_SQLITE_SAVER = HAVE_LANGGRAPH and importlib.util.find_spec(
    "langgraph.checkpoint.sqlite") is not None
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

DURKV_ROWS = ([("raw write+fdatasync", "sync"), ("raw write", "async")]
              + [("durkv checkpoints", p) for p in DURABILITIES]
              + [("durkv journal steps", p) for p in DURABILITIES])
SAVERS = (["langgraph + null saver", "langgraph + InMemorySaver", "langgraph + DurkvSaver"]
          + (["langgraph + SqliteSaver"] if HAVE_SQLITE_SAVER else []))
GRAPH_ROWS = [(s, mode) for mode in ("sync", "async") for s in SAVERS]
IN_MEMORY = {"langgraph + null saver", "langgraph + InMemorySaver"}
MESSAGE_BYTES = 1024

# Run the console script's entry point with LangGraph made unimportable first: what a
# user without the `langgraph` extra gets (a None entry makes every import of it fail).
NO_LANGGRAPH = ("import sys; sys.modules['langgraph'] = None; "
                "from durkv.cli.main import main; main()")


def durkv_cmd() -> list[str]:
    script = Path(sys.executable).with_name("durkv")
    return [str(script)] if script.exists() else [sys.executable, "-m", "durkv.cli"]


def check_rows(doc: dict, expected: list[tuple[str, str]]) -> None:
    """Every expected row at every N, measured, with ratios consistent with the rows."""
    rows = {(r["name"], r["policy"], r["n"]): r for r in doc["rows"]}
    assert len(rows) == len(doc["rows"]), "a row appears twice"
    assert set(rows) == {(name, policy, n) for n in doc["steps"] for name, policy in expected}
    for (name, policy, n), r in rows.items():
        assert r["seconds"] > 0 and r["steps_per_s"] > 0, r
        assert r["steps_per_s"] == pytest.approx(n / r["seconds"], rel=1e-3)
        base = rows[(r["baseline"], r["baseline_policy"], n)]
        assert r["ratio"] == pytest.approx(r["steps_per_s"] / base["steps_per_s"], rel=1e-3)
        if name.startswith("raw"):
            assert r["bytes"] == n * MESSAGE_BYTES      # the loop wrote exactly this
        if name in IN_MEMORY:
            assert r["bytes"] is None and r["bytes_per_step"] is None
        else:
            assert r["bytes"] > 0
            assert r["bytes_per_step"] == pytest.approx(r["bytes"] / n)
        if name.startswith("langgraph"):
            assert (r["baseline"], r["baseline_policy"]) == ("langgraph + null saver", policy)
        elif policy == "sync":
            assert r["baseline"] == "raw write+fdatasync"
        else:
            assert r["baseline"] == "raw write"


def test_quick_json_through_the_script_under_a_minute(tmp_path):
    t0 = time.monotonic()
    out = subprocess.run(durkv_cmd() + ["bench", "--quick", "--json", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert took < 60, f"durkv bench --quick took {took:.0f} s"
    assert out.stderr == ""            # piped: no progress bar; --json: nothing but JSON
    doc = json.loads(out.stdout)
    assert doc["quick"] is True and len(doc["steps"]) >= 2 and doc["rounds"] >= 1
    assert doc["dir"] == str(tmp_path)
    check_rows(doc, DURKV_ROWS + (GRAPH_ROWS if HAVE_LANGGRAPH else []))
    if HAVE_SQLITE_SAVER:
        assert doc["notes"] == []
    assert list(tmp_path.iterdir()) == []   # cleaned up after itself


def test_without_langgraph_the_graph_rows_are_left_out_with_a_note(tmp_path):
    out = subprocess.run([sys.executable, "-c", NO_LANGGRAPH, "bench", "--steps", "20,40",
                          "--json", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    check_rows(doc, DURKV_ROWS)
    [note] = doc["notes"]
    assert "LangGraph rows left out" in note and "pip install 'durkv[langgraph]'" in note

    human = subprocess.run([sys.executable, "-c", NO_LANGGRAPH, "bench", "--steps", "5",
                            "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert human.returncode == 0, human.stderr
    assert "durkv checkpoints" in human.stdout and "langgraph +" not in human.stdout
    assert "note: LangGraph rows left out" in human.stdout


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib is not installed (durkv[plot])")
def test_plot_writes_a_png(tmp_path):
    png = tmp_path / "bench.png"
    work = tmp_path / "work"
    work.mkdir()
    result = CliRunner().invoke(cli, ["bench", "--steps", "10,30", "--plot", str(png),
                                      "--dir", str(work)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"plot: {png}" in result.output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert list(work.iterdir()) == []


def test_plot_without_matplotlib_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)    # `import matplotlib` fails
    png = tmp_path / "bench.png"
    result = CliRunner().invoke(cli, ["bench", "--quick", "--plot", str(png),
                                      "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines == ["error: --plot needs matplotlib, which is not installed: "
                     "pip install 'durkv[plot]'"]
    assert not png.exists() and list(tmp_path.iterdir()) == []   # refused before measuring

    as_json = CliRunner().invoke(cli, ["bench", "--json", "--plot", str(png)])
    assert as_json.exit_code == 2
    err = json.loads(as_json.stdout)
    assert err["exit_code"] == 2 and "pip install 'durkv[plot]'" in err["message"]


def test_plot_into_a_missing_directory_is_refused_before_measuring(tmp_path):
    png = tmp_path / "no-such-dir" / "bench.png"
    result = CliRunner().invoke(cli, ["bench", "--plot", str(png), "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --plot {png}: there is no directory")
    assert list(tmp_path.iterdir()) == []


def test_quiet_prints_nothing(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "-q", "--steps", "3", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output == ""


@pytest.mark.parametrize("args", [["--steps", "0"], ["--steps", "ten"], ["--steps", "5,-1"],
                                  ["--steps", ","], ["--dir", "/no/such/dir"]])
def test_bad_arguments_are_usage_errors(args):
    result = CliRunner().invoke(cli, ["bench", *args])
    assert result.exit_code == 2
    assert args[0] in result.output


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib is not installed (durkv[plot])")
@pytest.mark.parametrize("name", ["bench.txt", "bench"])
def test_plot_to_a_name_matplotlib_cannot_save_is_refused_before_measuring(tmp_path, name):
    # it failed with matplotlib's ValueError after the whole benchmark had run
    result = CliRunner().invoke(cli, ["bench", "--steps", "3", "--plot", str(tmp_path / name),
                                      "--dir", str(tmp_path)])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --plot {tmp_path / name}: ")
    assert "end it in .png (or " in lines[0] and ".svg" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("steps", ["99999999999999999999", "10,1000001"])
def test_steps_past_the_bound_is_one_line_and_exit_2(tmp_path, steps):
    # 99999999999999999999 was an OverflowError traceback, after the other workloads ran
    result = CliRunner().invoke(cli, ["bench", "--steps", steps, "--dir", str(tmp_path)])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: --steps takes step counts from 1 to 1,000,000 separated by commas "
        f"(e.g. 100,1000), not {steps!r}"]
    assert list(tmp_path.iterdir()) == []
