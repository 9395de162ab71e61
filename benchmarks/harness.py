"""Timing, result rows, the machine description and the report (table, Markdown, JSON)."""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One measured line of the report.

    ``ours`` and ``baseline`` are in ``unit`` (higher is better, except for ``MiB`` and ``ms``
    rows); ``ratio`` is ours / baseline (or, for memory rows, largest / smallest); ``target`` is
    the ratio aimed at, ``met`` whether the measured ratio reaches it (``None``: no target).
    """

    case: str
    what: str
    unit: str
    ours: float
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""


@dataclass
class Context:
    """What every case gets: sizes, repetitions, a scratch directory, TensorFlow if present."""

    quick: bool
    events: int
    images: int
    steps: int
    daemon_events: int
    repeat: int
    scratch: Path
    seed: int = 20240611
    tf: Any = None
    notes: list[str] = field(default_factory=list)

    @contextmanager
    def tmpdir(self, name: str) -> Iterator[Path]:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.scratch))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def best_of(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """The shortest wall time of ``repeat`` calls of ``fn``, after ``warmup`` untimed calls.

    The garbage collector runs before each call and is off during it, the same for both sides
    of every comparison.
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
    return best


def best_of_pair(
    ours: Callable[[], object], baseline: Callable[[], object] | None, repeat: int
) -> tuple[float, float | None]:
    """Best-of-``repeat`` times of both sides, their runs interleaved (ours, baseline, ours...)
    after one warm-up each, so that a noisy neighbour slows both sides alike."""
    ours()
    if baseline is not None:
        baseline()
    best_ours = best_base = float("inf")
    for _ in range(repeat):
        best_ours = min(best_ours, best_of(ours, 1, warmup=0))
        if baseline is not None:
            best_base = min(best_base, best_of(baseline, 1, warmup=0))
    return best_ours, (best_base if baseline is not None else None)


def ratio_row(
    case: str,
    what: str,
    unit: str,
    ours: float,
    baseline: float | None,
    baseline_name: str,
    target: float | None,
    note: str = "",
) -> Row:
    """A throughput row: ratio = ours / baseline, met when the ratio reaches ``target``."""
    ratio = ours / baseline if baseline else None
    met = None if target is None or ratio is None else ratio >= target
    text = "" if target is None else f">= {target:g}x"
    return Row(case, what, unit, ours, baseline, baseline_name, ratio, text, met, note)


def machine() -> dict[str, Any]:
    """CPU model, cores, OS, Python, TensorFlow and tfrecordd versions, and the date."""
    import tfrecordd

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    tf_version = "not installed"
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            tf_version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf_version,
        "tfrecordd": tfrecordd.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _met(row: Row) -> str:
    return "" if row.met is None else ("met" if row.met else "MISSED")


HEADERS = ("case", "measure", "unit", "tfrecordd", "baseline", "baseline is", "ratio", "target", "")


def table_rows(rows: list[Row]) -> list[tuple[str, ...]]:
    return [
        (
            r.case,
            r.what,
            r.unit,
            _num(r.ours),
            _num(r.baseline),
            r.baseline_name,
            _ratio(r.ratio),
            r.target,
            _met(r),
        )
        for r in rows
    ]


def text_table(rows: list[Row]) -> str:
    body = table_rows(rows)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def markdown(
    rows: list[Row], info: dict[str, Any], settings: dict[str, Any], notes: list[str]
) -> str:
    out = ["# tfrecordd benchmark results", ""]
    out.append(
        "Written by `scripts/bench.sh`; every ratio compares two measurements of the same run."
    )
    out.append("")
    out += [f"- **{k}**: {v}" for k, v in info.items()]
    out.append("- **settings**: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    out += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(b) + " |" for b in table_rows(rows)]
    missed = [r for r in rows if r.met is False]
    out += ["", "## Targets", ""]
    if missed:
        out += [
            f"- MISSED: {r.case} / {r.what}: {_ratio(r.ratio)}, target {r.target}" for r in missed
        ]
    met = [r for r in rows if r.met]
    out += [f"- met: {r.case} / {r.what}: {_ratio(r.ratio)}, target {r.target}" for r in met]
    notes = notes + [f"{r.case} / {r.what}: {r.note}" for r in rows if r.note]
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def as_json(
    rows: list[Row], info: dict[str, Any], settings: dict[str, Any], notes: list[str]
) -> dict[str, Any]:
    return {
        "machine": info,
        "settings": settings,
        "rows": [asdict(r) for r in rows],
        "notes": notes,
    }
