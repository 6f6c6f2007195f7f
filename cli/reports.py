"""Human-readable lines for log reports (``durkv.log.verify`` / ``recover``)."""

from __future__ import annotations

from typing import Any

from .output import human_bytes, table


def kind_name(kind: Any) -> str:
    """A damage kind as its name; '' for 'no damage'."""
    if kind in (None, 0, "", "none"):
        return ""
    return str(kind)


def lost_range(first: Any, last: Any) -> str:
    """'lsn 7' / 'lsn 7..9' / 'lsn 7 and later', or '' when nothing is known lost."""
    if first is None:
        return ""
    if last is None:
        return f"lsn {first} and later"
    if first > last:
        return ""
    return f"lsn {first}" if first == last else f"lsn {first}..{last}"


def damage_line(d: Any) -> str:
    """'0000000000000000.seg offset 96: checksum_mismatch; lsn 1 unreadable; <detail>'."""
    parts = [f"{d.segment} offset {d.offset}: {kind_name(d.kind)}"]
    lost = lost_range(getattr(d, "lost_first_lsn", None), getattr(d, "lost_last_lsn", None))
    if lost:
        parts.append(f"{lost} unreadable")
    if getattr(d, "detail", ""):
        parts.append(d.detail)
    return "; ".join(parts)


def is_clean(report: Any) -> bool:
    """Nothing wrong at all: a torn tail counts as something to repair."""
    return bool(report.ok) and not report.damage


def only_torn_tail(report: Any) -> bool:
    kinds = {kind_name(d.kind) for d in report.damage}
    return bool(kinds) and kinds <= {"torn_tail"}


def repair_hint(path: str, report: Any) -> str:
    if not report.segments and not any(d.segment == "HEAD" or kind_name(d.kind) == "missing_segment"
                                       for d in report.damage):
        return (f"{path} holds no segment file named like one (16 hex digits + .seg); "
                "rename or move the files listed above")
    if only_torn_tail(report):
        return f"Try: durkv recover {path} (moves the torn tail to {path}/quarantine/)"
    return skip_corrupt_hint(path)


def skip_corrupt_hint(path: str) -> str:
    return (f"Try: durkv recover --skip-corrupt {path} "
            f"(copies removed bytes to {path}/quarantine/)")


def segment_table(report: Any) -> str:
    """One line per segment file: name, sealed/active, frames ok, size, status."""
    rows = []
    for s in report.segments:
        kind = kind_name(s.kind)
        status = f"{kind} at offset {s.bad_offset}" if kind else "ok"
        rows.append((s.segment, "sealed" if s.sealed else "active", str(s.frames_ok),
                     human_bytes(s.bytes), status))
    return table(rows, ("segment", "state", "frames", "size", "status"),
                 right=frozenset({2, 3}))


def summary(report: Any) -> str:
    """'3 segments, 10 frames ok, next lsn 10, 1.2 KiB'."""
    size = human_bytes(sum(s.bytes for s in report.segments))
    n = len(report.segments)
    return (f"{n} segment{'s' if n != 1 else ''}, {report.frames_ok} frames ok, "
            f"next lsn {report.next_lsn}, {size}")
