"""Run every ``bench/bench_*.py`` ``report()``, print one aligned table, write a JSON report.

    python bench/run_all.py [--quick] [--only NAME ...] [--json bench-report.json]

A module that fails to import or whose report() raises is listed as skipped (with its one-line
error) and the others still run. Each row is ``{"name", "value", "baseline", "ratio", "unit",
"note"}``; run_all adds ``"module"``. The JSON also records the machine (nproc, CPU, Python, numpy,
eva backend) because ratios only make sense next to where they were measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import os
import platform
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
COLUMNS = ("name", "value", "unit", "baseline", "ratio", "note")


def discover(only: list[str]) -> list[Path]:
    """bench_*.py files, sorted; ``only`` keeps those whose area name contains one of the words."""
    paths = sorted(BENCH_DIR.glob("bench_*.py"))
    if only:
        wanted = [word.removeprefix("bench_").removesuffix(".py") for word in only]
        paths = [p for p in paths if any(w in p.stem.removeprefix("bench_") for w in wanted)]
    return paths


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def call_report(module: ModuleType, quick: bool) -> list[dict[str, Any]]:
    report = module.report
    takes_quick = "quick" in inspect.signature(report).parameters
    rows = report(quick=quick) if takes_quick else report()
    return [dict(row) for row in rows]


def machine_facts() -> dict[str, Any]:
    import numpy as np

    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        from eva import _native

        facts["eva_backend"] = _native.backend()
        facts["eva_build"] = _native.build_info()
    except Exception as error:  # the report must still be written
        facts["eva_backend"] = f"unavailable: {error}"
    facts["env"] = {
        key: os.environ[key]
        for key in ("EVA_PUREPYTHON", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
        if key in os.environ
    }
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def format_number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4g}" if magnitude < 1000 else f"{value:.0f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    cells = [list(COLUMNS)]
    for row in rows:
        cells.append(
            [
                str(row.get("name", "?")),
                format_number(row.get("value")),
                str(row.get("unit", "")),
                format_number(row.get("baseline")),
                format_number(row.get("ratio")),
                str(row.get("note", "")),
            ]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS) - 1)]
    numeric = {1, 3, 4}
    lines = []
    for index, line in enumerate(cells):
        parts = []
        for column, text in enumerate(line[:-1]):
            right = column in numeric and index > 0
            parts.append(text.rjust(widths[column]) if right else text.ljust(widths[column]))
        parts.append(line[-1])
        lines.append("  ".join(parts).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths) + "  ----")
    return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    """Rows may carry numpy scalars or NaN; JSON gets plain numbers and null."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_json_safe(report), indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="bench-report.json", type=Path, help="report path")
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="area(s) to run, e.g. stats"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    args = parser.parse_args(argv)

    paths = discover(args.only)
    if not paths:
        print(f"no bench module matches {args.only}", file=sys.stderr)
        return 2
    # Bench modules may import helpers that sit beside them.
    sys.path.insert(0, str(BENCH_DIR))

    rows: list[dict[str, Any]] = []
    modules: list[dict[str, Any]] = []
    for path in paths:
        area = path.stem.removeprefix("bench_")
        started = time.perf_counter()
        try:
            module = load_module(path)
            if not callable(getattr(module, "report", None)):
                print(f"skip {path.name}: no report()", file=sys.stderr)
                modules.append({"module": area, "status": "no report()"})
                continue
            module_rows = call_report(module, args.quick)
        except Exception as error:
            last = traceback.format_exception_only(error)[-1].strip()
            print(f"skip {path.name}: {last}", file=sys.stderr)
            modules.append({"module": area, "status": "error", "error": last})
            continue
        seconds = time.perf_counter() - started
        print(f"ran {path.name}: {len(module_rows)} rows in {seconds:.1f} s", file=sys.stderr)
        modules.append({"module": area, "status": "ok", "seconds": seconds})
        rows.extend({"module": area, **row} for row in module_rows)

    print(format_table(rows))
    report = {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine_facts(),
        "modules": modules,
        "rows": rows,
    }
    write_json(args.json, report)
    print(
        f"\nwrote {args.json} ({len(rows)} rows; ratio > 1 means better than the baseline, see bench/README.md)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
