"""``eva info``, ``eva validate``, ``eva qc`` and ``eva cleanup``: commands on one dataset."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from eva.cli.output import (
    EXIT_INVALID,
    EXIT_USAGE,
    FORMAT_HELP,
    FormatChoice,
    detail,
    emit_json,
    fail,
    note,
    say,
    verbosity,
    verbosity_options,
)
from eva.textsafe import printable


def _dataset_summary(root: Path) -> dict[str, Any]:
    from eva.dataset.reader import DatasetReader

    reader = DatasetReader(root)
    info = reader.info
    rows = reader.episodes
    quality = [str(r.get("quality", "")).lower() for r in rows]
    verdicts = [str(r.get("qc_verdict") or "").lower() for r in rows]
    return {
        "dataset": str(root),
        "codebase_version": info.get("codebase_version"),
        "robot_type": info.get("robot_type"),
        "fps": reader.fps,
        "episodes": len(rows),
        "frames": reader.total_frames,
        "cameras": {key: reader.features[key].get("shape") for key in reader.video_keys},
        "vectors": {key: reader.features[key].get("shape") for key in reader.vector_keys},
        "tasks": [reader.tasks[i] for i in sorted(reader.tasks)],
        "quality": {"green": quality.count("green"), "red": quality.count("red")},
        "qc_verdict": {"pass": verdicts.count("pass"), "fail": verdicts.count("fail")},
        "stale_exports": _stale_exports(root),
    }


@click.command("info")
@verbosity_options()
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def info_command(dataset: Path, as_json: bool) -> None:
    """Summarise a LeRobot v2.1 DATASET: episodes, frames, cameras, fps, tasks, quality counts.

    \b
    Example:
      eva info demo-data/pick/raw
      eva info demo-data/pick/raw --json | jq .quality
    """
    from eva.dataset.errors import DatasetError

    try:
        summary = _dataset_summary(dataset)
    except DatasetError as e:
        fail(str(e))
    if as_json:
        emit_json(summary)
        return
    cameras = ", ".join(f"{k} {s[1]}x{s[0]}" for k, s in summary["cameras"].items() if s)
    say(f"dataset   {summary['dataset']} ({summary['codebase_version']})")
    say(f"episodes  {summary['episodes']}, frames {summary['frames']}, fps {summary['fps']}")
    say(f"cameras   {cameras or '-'}")
    say(f"tasks     {len(summary['tasks'])}: " + "; ".join(map(printable, summary["tasks"])))
    q, v = summary["quality"], summary["qc_verdict"]
    say(f"quality   green {q['green']}, red {q['red']}; qc pass {v['pass']}, fail {v['fail']}")
    for entry in summary["stale_exports"]:
        say(f"stale     {entry['format']} export {entry['export_root']}: {entry['detail']}")


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
    Example:
      eva validate demo-data/pick/raw
      eva validate demo-data/pick/raw --decode --json
    """
    from eva.dataset.validate import validate_dataset

    problems = validate_dataset(dataset, decode=decode)
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


def _qc_table_lines(table: list[dict[str, Any]]) -> list[str]:
    """``--list`` as aligned columns sized to their content; each episode's issues (code and
    detail, e.g. "frozen_camera: camera observation.images.wrist frozen from frame 19") and the
    note close its line."""
    rows = [
        (
            str(e["episode_index"]),
            str(e["length"]) if e["length"] is not None else "?",
            str(e["quality"] or "-"),
            str(e["qc_verdict"] or "-"),
            str(e["subset"]),
            str(e["reason"]),
            "; ".join(e["issue_details"]) or "-",
            f"note: {e['qc_note']}" if e["qc_note"] else "",
        )
        for e in table
    ]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(QC_COLUMNS)]
    numeric = (True, True, False, False, False, False)

    def line(cells: tuple[str, ...], last: str) -> str:
        parts = [
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(cells, widths, numeric, strict=True)
        ]
        return ("  ".join(parts) + "  " + last).rstrip()

    out = [line(QC_COLUMNS, "issues, note")]
    out += [line(r[:6], "  ".join(x for x in r[6:] if x)) for r in rows]
    return out


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
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.argument("episodes", required=False)
@click.option("--pass", "pass_", is_flag=True, help="Accept the episode (overrides red).")
@click.option("--fail", "fail_", is_flag=True, help="Reject the episode.")
@click.option("--clear", "clear_", is_flag=True, help="Remove the verdict (quality decides again).")
@click.option("--note", default=None, help="Replace the operator note (alone: note-only update).")
@click.option("--list", "list_", is_flag=True, help="Show every episode's review and subset.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def qc_command(
    dataset: Path,
    episodes: str | None,
    pass_: bool,
    fail_: bool,
    clear_: bool,
    note: str | None,
    list_: bool,
    as_json: bool,
) -> None:
    """Review episodes: set a verdict and/or note, or --list the review and resulting split.

    EPISODES is an index, a range or a list of both (3, 3-7, 3-7,9): every one is updated, or
    none (an unknown episode refuses the whole update).

    \b
    Examples:
      eva qc data/pick/raw 3 --pass --note "red flag was a glitch"
      eva qc data/pick/raw 4 --note "check lighting"      (note only, verdict unchanged)
      eva qc data/pick/raw 4 --clear                      (no verdict: quality decides)
      eva qc data/pick/raw --list
    """
    from eva.dataset.errors import DatasetError
    from eva.quality.verdicts import read_episode_rows, review_episodes, review_table

    if pass_ + fail_ + clear_ > 1:
        fail("qc: --pass, --fail and --clear exclude each other", EXIT_USAGE)
    if note is not None:
        try:
            note.encode("utf-8")
        except UnicodeEncodeError:  # bytes the locale could not decode (surrogateescape)
            fail("qc: --note: not valid UTF-8", EXIT_USAGE)
    verdict = "pass" if pass_ else "fail" if fail_ else None
    try:
        if list_:
            if episodes is not None or verdict or clear_ or note is not None:
                fail("qc --list takes no episode, verdict or note", EXIT_USAGE)
            table = review_table(read_episode_rows(dataset))
            if as_json:
                for entry in table:
                    emit_json(entry)
                return
            for text in _qc_table_lines(table):
                say(text)
            accepted = sum(1 for e in table if e["subset"] == "accepted")
            click.echo(f"accepted {accepted}, rejected {len(table) - accepted}")
            return
        if episodes is None:
            fail("qc needs EPISODES (an index, a range or a list: 3, 3-7,9) or --list", EXIT_USAGE)
        if verdict is None and note is None and not clear_:
            fail("qc needs --pass, --fail, --clear or --note", EXIT_USAGE)
        try:
            indices = parse_episode_list(episodes)
        except click.BadParameter as e:
            fail(f"qc: EPISODES {e.message}", EXIT_USAGE)
        updates = review_episodes(
            dataset, indices, verdict=verdict, note=note, clear_verdict=clear_
        )
    except DatasetError as e:
        fail(str(e))
    from eva.quality.verdicts import subset_of

    changed = any(u.changed for u in updates)
    stale = _stale_exports(dataset) if changed else []
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
            say(
                f"episode {row.get('episode_index')}: verdict {row.get('qc_verdict') or '-'}, "
                f"note {row.get('qc_note')!r} -> {subset_of(row)}"
                + ("" if update.changed else " (unchanged)")
            )
    for entry in stale:
        say(
            f"eva: warning: the {entry['format']} export {entry['export_root']} is now stale "
            f"({entry['detail']}): export again before uploading",
            err=True,
        )


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
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=FormatChoice(),
    default=None,
    help="Only this format (default: all). " + FORMAT_HELP,
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def cleanup_command(dataset: Path, fmt: str | None, as_json: bool) -> None:
    """Finish or undo interrupted exports of DATASET and remove hidden staging/backup dirs.

    \b
    Example:
      eva cleanup data/pick/raw --format hdf5
    """
    from eva.dataset.errors import DatasetError
    from eva.export.pipeline import cleanup

    try:
        actions = cleanup(dataset, fmt)
    except (DatasetError, ValueError) as e:
        fail(str(e))
    if as_json:
        emit_json({"dataset": str(dataset), "actions": actions})
        return
    count = 0
    for name, lines in actions.items():
        for line in lines:
            say(f"{name}: {line}")
            count += 1
    if not count:
        note("nothing to clean up", err=False)
