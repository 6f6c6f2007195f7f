"""``durkv bench``: checkpoint and journal throughput on this machine, side by side.

The workloads are :mod:`durkv.cli.benchwork` (durkv and the raw C loop) and, when
LangGraph is installed, :mod:`durkv.cli.benchgraph`. This module chooses the sizes,
runs them in a temporary directory, and prints the table, the JSON or the plot.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

import click

from .. import __version__
from ..durability import DURABILITIES
from ..errors import ConfigError
from . import output
from .benchwork import MESSAGE_BYTES, Row, Workload, durkv_workloads, filesystem, measure
from .output import JSON_KEY

STEPS = (100, 300, 1000)
QUICK_STEPS = (50, 200)
ROUNDS = 3
QUICK_ROUNDS = 1
PLOT_HINT = "pip install 'durkv[plot]'"


def graph_workloads() -> tuple[list[Workload], list[str]]:
    """The LangGraph rows, or none and a note saying why."""
    try:
        from . import benchgraph
    except ImportError as exc:
        return [], [f"LangGraph rows left out: {exc} (pip install 'durkv[langgraph]')"]
    return benchgraph.workloads()


# The longest agent loop one run measures: far past any useful figure (SqliteSaver's bytes
# grow as N squared, ~0.5 GB at N=1000), and a count the C raw loop takes (a larger one
# was an OverflowError after the other workloads had run).
MAX_STEPS = 1_000_000


def parse_steps(ctx: click.Context, param: click.Parameter, value: str | None):
    if value is None:
        return None
    try:
        sizes = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_STEPS:
        raise ConfigError(f"--steps takes step counts from 1 to {MAX_STEPS:,} separated by "
                          f"commas (e.g. 100,1000), not {value!r:.80}")
    return tuple(sizes)


def check_plot(path: Path) -> None:
    """Fail before measuring anything when --plot cannot be drawn or saved."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise ConfigError(f"--plot needs matplotlib, which is not installed: {PLOT_HINT}") \
            from None
    # matplotlib picks the format from the suffix: an unknown one failed only after the
    # whole benchmark had run, and none at all saved to another name (FILE.png)
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix[1:].lower()
    if suffix not in formats:
        what = (f".{suffix} is not an image type matplotlib saves" if suffix else
                "the name has no suffix to choose the image type")
        others = ", ".join("." + f for f in sorted(formats) if f != "png")
        raise ConfigError(f"--plot {path}: {what}; end it in .png (or {others})")
    if not path.parent.is_dir():
        raise ConfigError(f"--plot {path}: there is no directory {path.parent}; "
                          f"give a path in an existing directory")


LINESTYLES = dict(zip(DURABILITIES, ("-", "--", ":"), strict=True))  # sync solid...


def plot(rows: list[Row], path: Path) -> None:
    """Two panels against N: steps/s and bytes on disk. One colour per workload, one line
    style per policy (sync solid, async dashed, exit dotted)."""
    import matplotlib
    matplotlib.use("Agg")               # files only: no display needed
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        series.setdefault((r.name, r.policy), []).append(r)
    names = list(dict.fromkeys(r.name for r in rows))
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    fig, (speed, size) = plt.subplots(1, 2, figsize=(15, 6))
    for (name, policy), rs in series.items():
        style = {"color": colours[name], "linestyle": LINESTYLES[policy], "marker": "o",
                 "label": f"{name} ({policy})"}
        ns = [r.n for r in rs]
        speed.plot(ns, [r.steps_per_s for r in rs], **style)
        if rs[0].bytes is not None:
            size.plot(ns, [r.bytes for r in rs], **style)
    sizes = sorted({r.n for r in rows})
    for ax, title in ((speed, "steps/s"), (size, "bytes on disk")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("N (agent-loop steps)")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
    fig.legend(*speed.get_legend_handles_labels(), fontsize=8, loc="center right")
    fig.suptitle(f"durkv bench: the agent loop, a ~{MESSAGE_BYTES} B message per step")
    fig.tight_layout(rect=(0, 0, 0.82, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine(where: Path) -> dict[str, Any]:
    return {"durkv": __version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "dir": str(where), "filesystem": filesystem(where)}


def table(rows: list[Row]) -> str:
    def baseline(r: Row) -> str:
        return "itself (the floor)" if (r.name, r.policy) == (r.baseline, r.baseline_policy) \
            else f"{r.baseline} ({r.baseline_policy})"

    lines = [(r.name, r.policy, f"{r.n:,}", f"{r.steps_per_s:,.0f}",
              "-" if r.bytes is None else output.human_bytes(r.bytes),
              "-" if r.bytes_per_step is None else f"{r.bytes_per_step:,.0f}",
              f"{r.ratio:.3f}x", baseline(r)) for r in rows]
    return output.table(lines, ("workload", "policy", "N", "steps/s", "on disk", "B/step",
                                "ratio", "vs"), right=frozenset({2, 3, 4, 5, 6}))


def summary(info: dict[str, Any], rounds: int) -> str:
    fs = f" ({info['filesystem']})" if info["filesystem"] else ""
    load = ", ".join(f"{x:g}" for x in info["load_average"])
    return (f"measured in {info['dir']}{fs}; {info['cpus']} CPUs, load average {load}; "
            f"median of {rounds} round(s)\nratios pair rows of this one run: on a shared "
            f"machine compare them, not absolute figures")


def run_bench(directory: Path | None, sizes: tuple[int, ...], rounds: int,
              show_progress: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    lg, notes = graph_workloads()
    workloads = durkv_workloads() + lg
    root = Path(tempfile.mkdtemp(prefix="durkv-bench-", dir=directory))
    try:
        info = machine(directory or Path(tempfile.gettempdir()))
        if info["filesystem"] in ("tmpfs", "ramfs"):
            notes.append(f"{info['dir']} is on {info['filesystem']}: fdatasync costs nothing there, "
                         "so sync figures mean nothing; use --dir on a real disk")
        rows = output.with_progress(
            "bench", show_progress,
            lambda bar: measure(workloads, sizes, rounds, root, progress=bar))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows, notes, info


@click.command()
@click.option("--quick", is_flag=True,
              help=f"Short run: N={','.join(map(str, QUICK_STEPS))}, {QUICK_ROUNDS} round "
                   "(well under a minute).")
@click.option("--steps", "sizes", metavar="N[,N...]", callback=parse_steps,
              help=f"Agent-loop lengths to measure (default {','.join(map(str, STEPS))}). "
                   "SqliteSaver's bytes grow as N squared: ~0.5 GB at N=1000, removed "
                   "after each run.")
@click.option("--rounds", type=click.IntRange(1, 99), default=None,
              help=f"Runs of each workload per N; the median is kept (default {ROUNDS}).")
@click.option("--dir", "directory",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Measure the disk holding DIR: the bench works in a new temporary "
                   "directory inside it, removed at the end (default: the temp dir).")
@click.option("--plot", "plot_path", metavar="FILE.png",
              type=click.Path(dir_okay=False, path_type=Path),
              help=f"Also draw steps/s and bytes against N into FILE.png ({PLOT_HINT}).")
@output.json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no table.")
@click.pass_context
def bench(ctx: click.Context, quick: bool, sizes: tuple[int, ...] | None, rounds: int | None,
          directory: Path | None, plot_path: Path | None, as_json: bool, quiet: bool) -> None:
    """Measure checkpoint and journal throughput on this machine, side by side.

    One run times the same agent loop (N steps, a ~1 KiB message each) as durkv
    checkpoints and as durkv journal steps under sync, async and exit; the raw C
    loop of write+fdatasync (the floor under sync) and of write alone (under
    async and exit); and, when LangGraph is installed, the loop as a LangGraph
    graph on DurkvSaver, SqliteSaver, InMemorySaver and a saver that stores
    nothing (each under durability sync and async). Prints steps/s, bytes on
    disk and each row's ratio to its baseline: the raw loop for durkv rows, the
    saver that stores nothing for LangGraph rows.

    \b
    Example:
        durkv bench --quick
        durkv bench --dir /mnt/data --json > bench.json
        durkv bench --plot bench.png
    """
    ctx.meta[JSON_KEY] = as_json
    if plot_path is not None:
        check_plot(plot_path)
    sizes = sizes or (QUICK_STEPS if quick else STEPS)
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    rows, notes, info = run_bench(directory, sizes, rounds, not (quiet or as_json))
    if plot_path is not None:
        plot(rows, plot_path)
    if as_json:
        output.emit_json({**info, "quick": quick, "steps": list(sizes), "rounds": rounds,
                          "message_bytes": MESSAGE_BYTES, "rows": [r.to_dict() for r in rows],
                          "notes": notes, "plot": None if plot_path is None else str(plot_path)})
        return
    if quiet:
        return
    click.echo(table(rows))
    click.echo(summary(info, rounds))
    for note in notes:
        click.echo(f"note: {note}")
    if plot_path is not None:
        click.echo(f"plot: {plot_path}")
