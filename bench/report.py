"""Summarise a pytest-benchmark run as ratios vs targets.

Every benchmark with a target stores ``extra_info = {"target": str, "ratio": float,
"ok": bool, ...}``; this script reads pytest-benchmark's JSON and prints one row
per benchmark: group, name, median, ops/s, ratio, target, ok.

Example:
    python bench/report.py out.json                 # summarise an earlier run
    python bench/report.py --run -- -k sync         # run pytest bench/ first
    python bench/report.py out.json --json          # the rows as JSON
    python bench/report.py out.json --strict        # exit 1 if a target is missed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def rows(data: dict) -> list[dict]:
    out = []
    for b in data.get("benchmarks", []):
        info = b.get("extra_info", {}) or {}
        stats = b.get("stats", {}) or {}
        med = stats.get("median")
        per_round = info.get("ops_per_round")
        out.append({
            "group": b.get("group") or "",
            "name": b.get("name", ""),
            "median_s": med,
            "ops_per_s": (per_round / med) if (per_round and med) else None,
            "ratio": info.get("ratio"),
            "target": info.get("target"),
            "ok": info.get("ok"),
        })
    return out


def table(rs: list[dict]) -> str:
    head = ["group", "benchmark", "median", "ops/s", "ratio", "target", "ok"]
    lines = []
    for r in rs:
        lines.append([
            r["group"], r["name"],
            f"{r['median_s'] * 1000:.2f} ms" if r["median_s"] is not None else "",
            f"{r['ops_per_s']:,.0f}" if r["ops_per_s"] else "",
            f"{r['ratio']:.3f}" if r["ratio"] is not None else "",
            r["target"] or "",
            "" if r["ok"] is None else ("ok" if r["ok"] else "MISSED"),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt.format(*head), sep] + [fmt.format(*map(str, ln)) for ln in lines])


def run_pytest(extra: list[str]) -> dict:
    bench_dir = Path(__file__).parent
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "bench.json"
        cmd = [sys.executable, "-m", "pytest", str(bench_dir), "--benchmark-only", "-q",
               f"--benchmark-json={out}", *extra]
        rc = subprocess.call(cmd, env=dict(os.environ))
        if not out.exists():
            raise SystemExit(f"pytest produced no benchmark JSON (exit {rc})")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json_file", nargs="?", help="pytest-benchmark --benchmark-json output")
    ap.add_argument("--run", action="store_true", help="run pytest bench/ first")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("pytest_args", nargs="*", help="after --, passed to pytest (with --run)")
    a = ap.parse_args(argv)
    if a.run:
        data = run_pytest(a.pytest_args)
    elif a.json_file:
        data = json.loads(Path(a.json_file).read_text())
    else:
        ap.error("give a JSON file or --run")
    rs = rows(data)
    print(json.dumps(rs, indent=2) if a.json else table(rs))
    missed = [r for r in rs if r["ok"] is False]
    return 1 if (a.strict and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
