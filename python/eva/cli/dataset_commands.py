"""``eva info``, ``eva validate``, ``eva qc`` and ``eva cleanup``: commands on one dataset."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from eva.cli.output import (
    EXIT_INVALID,
    EXIT_USAGE,
    FormatChoice,
    detail,
    emit_json,
    fail,
    format_help,
    note,
    say,
    typed_text,
    verbosity,
    verbosity_options,
)
from eva.textsafe import printable

if TYPE_CHECKING:
    from eva.quality.verdicts import ReviewUpdate


def _shape_text(shape: Any) -> str:
    if isinstance(shape, list) and len(shape) == 3:
        return f"{shape[1]}x{shape[0]}"
    return "x".join(map(str, shape)) if isinstance(shape, list) else "?"


def _info_lines(s: dict[str, Any]) -> list[str]:
    from eva.cli.output import human_bytes

    duration = f"{s['duration_s']:.1f} s" if s["duration_s"] is not None else "?"
    if s["kind"] == "export":
        what = f"{s['format']} export, {s['subset']} subset of {s['source_dir']}"
    else:
        what = f"raw {s['format']} ({s['codebase_version']})"
    cameras = ", ".join(f"{k} {_shape_text(v)}" for k, v in s["cameras"].items())
    images = " (decoded frames embedded)" if s["embedded_images"] else ""
    vectors = ", ".join(f"{k} [{_shape_text(v)}]" for k, v in s["vectors"].items())
    q, v = s["quality"], s["qc_verdict"]
    lines = [
        f"dataset   {s['dataset']}",
        f"kind      {what}",
        f"episodes  {s['episodes']}, frames {s['frames']}, fps {s['fps']}, duration {duration}",
        f"cameras   {cameras or '-'}{images}",
        f"vectors   {vectors or '-'}",
        f"tasks     {len(s['tasks'])}: " + "; ".join(map(printable, s["tasks"])),
        f"quality   green {q['green']}, red {q['red']}; qc pass {v['pass']}, fail {v['fail']}"
        + _edit_counts_text(s.get("edits", {})),
        f"size      {human_bytes(s['size_bytes'])} in {s['files']} files",
    ]
    if s["kind"] == "export":
        marker = s["marker"]
        state = "published" if marker["matches"] else "NOT the published run"
        lines.append(f"marker    {marker['path']}: {state} (export {s['export_id']})")
        staleness = s["staleness"]
        if staleness is None:
            lines.append("review    source not found: staleness unknown")
        else:
            lines.append(
                f"review    {'STALE: ' if staleness['stale'] else ''}{staleness['detail']}"
            )
    for entry in s.get("stale_exports", []):
        lines.append(
            f"stale     {entry['format']} export {entry['export_root']}: {entry['detail']}"
        )
    return lines


def _edit_counts_text(counts: dict[str, int]) -> str:
    """``; edits: trim 2, task 1, drop 1`` for ``eva info`` (nothing when no episode has one)."""
    shown = [f"{key.removeprefix('edit_')} {n}" for key, n in counts.items() if n]
    return f"; edits: {', '.join(shown)}" if shown else ""


def _episode_lines(rows: list[dict[str, Any]]) -> list[str]:
    from eva.cli.edit_command import edit_summary

    header = ("ep", "frames", "seconds", "quality", "verdict", "subset", "issues", "edits")
    cells = [
        (
            str(r["episode_index"]),
            str(r["length"]),
            f"{r['duration_s']:.2f}" if r["duration_s"] is not None else "?",
            str(r["quality"] or "-"),
            str(r["qc_verdict"] or "-"),
            str(r["subset"]),
            ",".join(r["issues"]) or "-",
            edit_summary(r.get("edits", {})),
        )
        for r in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]
    right = (True, True, True, False, False, False, False, False)

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        ).rstrip()

    return [line(header)] + [line(c) for c in cells]


@click.command("info")
@verbosity_options()
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--episodes", "per_episode", is_flag=True, help="Also one line per episode.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def info_command(dataset: Path, per_episode: bool, as_json: bool) -> None:
    """Summarise a dataset or an export: format, episodes, frames, cameras, size, review.

    DATASET is a raw v2.1 dataset or one subset of an export of any format (accepted or
    rejected): for an export it also says whether the directory is the published run (the
    marker) and whether the source's current review still gives it (stale or current).

    \b
    Examples:
      eva info demo-data/logs/pick_cube/raw
      eva info demo-data/logs/pick_cube/export/hdf5/accepted --episodes
      eva info demo-data/logs/pick_cube/raw --json
    """
    from eva.dataset.errors import DatasetError
    from eva.export.describe import describe_directory

    try:
        summary = describe_directory(dataset, episodes=per_episode or verbosity() > 0)
    except DatasetError as e:
        fail(str(e))
    if as_json:
        emit_json(summary)
        return
    if "metadata_behind" in summary:
        say(f"eva: warning: {summary['metadata_behind']}", err=True)
    if summary.get("awaiting_recovery"):
        say(
            f"eva: warning: {summary['awaiting_recovery']} recording(s) cut short by a crash "
            f"await recovery: eva recover {dataset} (or the next eva collect / console start)",
            err=True,
        )
    for text in _info_lines(summary):
        say(text)
    if "episode_rows" in summary:
        for text in _episode_lines(summary["episode_rows"]):
            say(text)


# The command that fixes a problem, where one does (the others need the data itself mended).
VALIDATE_FIXES = {
    "totals_mismatch": "eva cleanup {dataset}  (repairs the totals an interrupted save left behind)",
    "non_finite_values": "eva export {dataset} --allow-non-finite ...  (exports them as they are)",
}


@click.command("validate")
@verbosity_options()
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--decode", is_flag=True, help="Decode every video to count frames (slow, exact).")
def validate_command(dataset: Path, as_json: bool, decode: bool) -> None:
    """Check a LeRobot v2.1 DATASET; report every problem. Exit 0 valid, 1 invalid, 2 usage.

    \b
    Examples:
      eva validate demo-data/logs/pick_cube/raw
      eva validate demo-data/logs/pick_cube/raw --decode --json
    """
    from eva.dataset.validate import validate_dataset
    from eva.formats import catalog

    problems = validate_dataset(dataset, decode=decode, dataset_format=catalog.source_entry().name)
    if as_json:
        emit_json(
            {
                "dataset": str(dataset),
                "valid": not problems,
                "decode": decode,
                "problems": [p.to_dict() for p in problems],
            }
        )
    else:
        for problem in problems:
            if verbosity() >= 0:
                say(str(problem))
            where = ", ".join(
                part
                for part in (
                    f"file {problem.path}" if problem.path else "",
                    f"episode {problem.episode}" if problem.episode is not None else "",
                )
                if part
            )
            if where:
                detail(f"    at {where}")
            fix = VALIDATE_FIXES.get(problem.code)
            if fix is not None and verbosity() >= 0:
                say(f"    fix: {fix.format(dataset=dataset)}")
        say(
            f"{dataset}: valid" if not problems else f"{dataset}: {len(problems)} problem(s)",
            err=bool(problems),
        )
    if problems:
        sys.exit(EXIT_INVALID)


QC_COLUMNS = ("ep", "frames", "quality", "verdict", "subset", "reason")


def _qc_table_lines(table: list[dict[str, Any]], with_score: bool = False) -> list[str]:
    """``--list`` as aligned columns sized to their content; each episode's issues (code and
    detail, e.g. "frozen_camera: camera observation.images.wrist frozen from frame 19"), the
    note and the edits (eva edit) close its line. ``with_score`` (``--sort score``) puts the
    anomaly score after the index and its reasons before the issues."""
    from eva.cli.edit_command import edit_summary

    rows: list[tuple[str, ...]] = [
        (
            str(e["episode_index"]),
            str(e["length"]) if e["length"] is not None else "?",
            str(e["quality"] or "-"),
            str(e["qc_verdict"] or "-"),
            str(e["subset"]),
            str(e["reason"]),
            "; ".join(e["issue_details"]) or "-",
            f"note: {e['qc_note']}" if e["qc_note"] else "",
            f"edits: {edit_summary(e['edits'])}" if e["edits"] else "",
        )
        for e in table
    ]
    columns: tuple[str, ...] = QC_COLUMNS
    numeric: tuple[bool, ...] = (True, True, False, False, False, False)
    if with_score:
        rows = [
            (r[0], _score_text(e), *r[1:6], _reasons_text(e), *r[6:])
            for r, e in zip(rows, table, strict=True)
        ]
        columns = (QC_COLUMNS[0], "score", *QC_COLUMNS[1:])
        numeric = (True, True, *numeric[1:])
    head = len(columns)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(columns)]

    def line(cells: tuple[str, ...], last: str) -> str:
        parts = [
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(cells, widths, numeric, strict=True)
        ]
        return ("  ".join(parts) + "  " + last).rstrip()

    last = ("reasons, " if with_score else "") + "issues, note, edits"
    out = [line(columns, last)]
    out += [line(r[:head], "  ".join(x for x in r[head:] if x)) for r in rows]
    return out


def _score_text(entry: dict[str, Any]) -> str:
    score = entry.get("anomaly_score")
    return "-" if score is None else f"{score:.1f}"


def _reasons_text(entry: dict[str, Any]) -> str:
    reasons = entry.get("anomaly_reasons") or []
    return "reasons: " + "; ".join(reasons) if reasons else ""


def parse_episode_list(spec: str) -> list[int]:
    """``3``, ``3-7``, ``3-7,9,12-13`` -> the sorted episode indices (BadParameter otherwise)."""
    indices: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        first, sep, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if sep else low
        except ValueError:
            raise click.BadParameter(f"{spec!r}: use indices and ranges like 3-7,9") from None
        if low < 0 or high < low:
            raise click.BadParameter(f"{spec!r}: range {part!r} is empty or negative")
        if high - low >= 1_000_000:
            raise click.BadParameter(f"{spec!r}: range {part!r} is too long")
        indices.update(range(low, high + 1))
    return sorted(indices)


@click.command("qc")
@verbosity_options()
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("episodes", required=False)
@click.option("--pass", "pass_", is_flag=True, help="Accept the episode (overrides red).")
@click.option("--fail", "fail_", is_flag=True, help="Reject the episode.")
@click.option("--clear", "clear_", is_flag=True, help="Remove the verdict (quality decides again).")
@click.option(
    "--note",
    default=None,
    callback=typed_text,
    help="Replace the operator note (alone: note-only update).",
)
@click.option("--list", "list_", is_flag=True, help="Show every episode's review and subset.")
@click.option(
    "--sort",
    type=click.Choice(["index", "score"]),
    default="index",
    help="--list order: by episode index, or worst anomaly score first (with its reasons).",
)
@click.option(
    "--rescore",
    is_flag=True,
    help="Compute the review metrics and anomaly score again (all episodes, or EPISODES).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="--rescore: take the metric limits from this config's [collection.metrics].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
# Not cut: one click command; each branch is a few lines that call out to the work
def qc_command(
    dataset: Path,
    episodes: str | None,
    pass_: bool,
    fail_: bool,
    clear_: bool,
    note: str | None,
    list_: bool,
    sort: str,
    rescore: bool,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """Review episodes: set a verdict and/or note, or --list the review and resulting split.

    EPISODES is an index, a range or a list of both (3, 3-7, 3-7,9): every one is updated, or
    none (an unknown episode refuses the whole update).

    \b
    Examples:
      eva qc demo-data/logs/pick_cube/raw 2 --pass --note "red flag was a glitch"
      eva qc demo-data/logs/pick_cube/raw 0 --note "check lighting"  # note only, verdict unchanged
      eva qc demo-data/logs/pick_cube/raw 0-2 --clear  # no verdict: quality decides
      eva qc demo-data/logs/pick_cube/raw 1 --fail --note "gripper slipped"
      eva qc demo-data/logs/pick_cube/raw --list
      eva qc demo-data/logs/pick_cube/raw --rescore
      eva qc demo-data/logs/pick_cube/raw --list --sort score  # worst first, with reasons
    """
    from eva.dataset.errors import DatasetError
    from eva.quality.verdicts import review_episodes

    if pass_ + fail_ + clear_ > 1:
        fail("qc: --pass, --fail and --clear exclude each other", EXIT_USAGE)
    verdict = "pass" if pass_ else "fail" if fail_ else None
    if config_path is not None and not rescore:
        fail("qc: --config goes with --rescore", EXIT_USAGE)
    if sort != "index" and not list_:
        fail("qc: --sort goes with --list", EXIT_USAGE)
    try:
        if rescore:
            if list_ or verdict or clear_ or note is not None:
                fail("qc --rescore takes no --list, verdict or note", EXIT_USAGE)
            _rescore(dataset, episodes, config_path, as_json)
            return
        if list_:
            if episodes is not None or verdict or clear_ or note is not None:
                fail("qc --list takes no episode, verdict or note", EXIT_USAGE)
            _show_review(dataset, as_json, sort)
            return
        if episodes is None:
            fail("qc needs EPISODES (an index, a range or a list: 3, 3-7,9) or --list", EXIT_USAGE)
        if verdict is None and note is None and not clear_:
            fail("qc needs --pass, --fail, --clear or --note", EXIT_USAGE)
        try:
            indices = parse_episode_list(episodes)
        except click.BadParameter as e:
            fail(f"qc: EPISODES {e.message}", EXIT_USAGE)
        stale_before = stale_export_roots(dataset)
        updates = review_episodes(
            dataset, indices, verdict=verdict, note=note, clear_verdict=clear_
        )
    except DatasetError as e:
        fail(str(e))
    show_updates(dataset, updates, as_json, _review_line, stale_before)


def _rescore(dataset: Path, episodes: str | None, config_path: Path | None, as_json: bool) -> None:
    """``qc --rescore``: the review metrics of every episode (or EPISODES) computed again."""
    from eva.config import ConfigError, load_config
    from eva.quality.rescore import rescore

    limits = None
    if config_path is not None:
        try:
            limits = load_config(config_path).collection.metrics
        except ConfigError as e:
            fail(str(e), EXIT_USAGE)
    indices = None
    if episodes is not None:
        try:
            indices = parse_episode_list(episodes)
        except click.BadParameter as e:
            fail(f"qc: EPISODES {e.message}", EXIT_USAGE)
    for update in rescore(dataset, limits, episodes=indices):
        row = update.row
        if as_json:
            keys = ("episode_index", "quality_metrics", "anomaly_score", "anomaly_reasons")
            emit_json({k: row.get(k) for k in keys})
        else:
            reasons = "; ".join(row.get("anomaly_reasons") or []) or "-"
            say(f"episode {row['episode_index']}: score {row['anomaly_score']:g}: {reasons}")


def _show_review(dataset: Path, as_json: bool, sort: str = "index") -> None:
    """``qc --list``: every episode's review and subset, then the split's counts."""
    from eva.quality.verdicts import read_episode_rows, review_table

    table = review_table(read_episode_rows(dataset), sort)
    if as_json:
        for entry in table:
            emit_json(entry)
        return
    for text in _qc_table_lines(table, with_score=sort == "score"):
        say(text)
    counts = {s: sum(1 for e in table if e["subset"] == s) for s in ("accepted", "rejected")}
    dropped = len(table) - sum(counts.values())
    click.echo(
        f"accepted {counts['accepted']}, rejected {counts['rejected']}"
        + (f", dropped {dropped}" if dropped else "")
    )


def show_updates(
    dataset: Path,
    updates: list[ReviewUpdate],
    as_json: bool,
    line: Callable[[dict[str, Any]], str],
    stale_before: frozenset[str] = frozenset(),
) -> None:
    """Each updated episode (``line`` of its row, e.g. its verdict and note) with its subset,
    then a warning for each export of ``dataset`` the change made stale (eva qc, eva edit): once,
    as it becomes stale; an export in ``stale_before`` (stale_export_roots before the change)
    was warned of then."""
    from eva.quality.verdicts import subset_of

    stale = _stale_exports(dataset) if any(u.changed for u in updates) else []
    for update in updates:
        row = update.row
        if as_json:
            emit_json(
                {
                    **row,
                    "subset": subset_of(row),
                    "changed": update.changed,
                    "stale_exports": [s["format"] for s in stale],
                }
            )
        else:
            say(f"{line(row)} -> {subset_of(row)}" + ("" if update.changed else " (unchanged)"))
    for entry in (s for s in stale if s["export_root"] not in stale_before):
        say(
            f"eva: warning: the {entry['format']} export {entry['export_root']} is now stale "
            f"({entry['detail']}): export again before uploading",
            err=True,
        )


def _review_line(row: dict[str, Any]) -> str:
    return (
        f"episode {row.get('episode_index')}: verdict {row.get('qc_verdict') or '-'}, "
        f"note {row.get('qc_note')!r}"
    )


def stale_export_roots(dataset: Path) -> frozenset[str]:
    """The export roots of ``dataset`` already stale (before a review change)."""
    return frozenset(s["export_root"] for s in _stale_exports(dataset))


def _stale_exports(dataset: Path) -> list[dict[str, str]]:
    """The exports of ``dataset`` the current review no longer gives (eva.export.staleness);
    a review that cannot be read lists none (the command itself reports that dataset)."""
    from eva.dataset.errors import DatasetError
    from eva.export.staleness import stale_exports

    try:
        found = stale_exports(dataset)
    except DatasetError:
        return []
    return [
        {"format": s.format, "export_root": str(s.export_root), "detail": s.describe()}
        for s in found
    ]


@click.command("cleanup")
@verbosity_options()
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=FormatChoice(),
    default=None,
    help="Only this format (default: all). " + format_help(),
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def cleanup_command(dataset: Path, fmt: str | None, as_json: bool) -> None:
    """Finish or undo interrupted exports of DATASET and remove hidden staging/backup dirs.

    Also removes what a killed eva merge --into DATASET left beside it; DATASET need not exist
    for that (a killed merge leaves none).

    \b
    Example:
      eva cleanup demo-data/logs/pick_cube/raw --format hdf5
    """
    from eva.dataset.errors import DatasetError
    from eva.export.pipeline import cleanup

    try:
        actions = cleanup(dataset, fmt)
    except (DatasetError, ValueError) as e:
        fail(str(e))
    if not os.path.lexists(dataset) and not actions:
        fail(
            f"{dataset}: no such dataset (nor leftovers of a killed eva merge into it)", EXIT_USAGE
        )
    failed = actions.pop("failed", [])
    if as_json:
        emit_json({"dataset": str(dataset), "actions": actions, "failed": failed})
    else:
        count = 0
        for name, lines in actions.items():
            for line in lines:
                say(f"{name}: {line}")
                count += 1
        if not count and not failed:
            note("nothing to clean up", err=False)
    if failed:  # the rest was done; what was not is an error
        fail(failed[0] + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
