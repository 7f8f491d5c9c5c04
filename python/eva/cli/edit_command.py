"""``eva edit``: an operator's trim, task and drop decisions on episodes of a raw dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from eva.cli.output import EXIT_USAGE, fail, typed_text, verbosity_options


@click.command("edit")
@verbosity_options()
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("episodes")
@click.option(
    "--trim",
    default=None,
    metavar="A:B",
    help="Keep frames [A, B): frame indices or seconds (1.5s:9s); an empty side is the "
    "episode's first or last frame (30:, :9s).",
)
@click.option("--clear-trim", is_flag=True, help="Keep every frame again.")
@click.option(
    "--task", default=None, callback=typed_text, help="Export the episode with this task string."
)
@click.option("--clear-task", is_flag=True, help="Export the recorded task again.")
@click.option("--drop", is_flag=True, help="Leave out of both subsets.")
@click.option("--undrop", is_flag=True, help="Put back where the review sends it.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def edit_command(
    dataset: Path,
    episodes: str,
    trim: str | None,
    clear_trim: bool,
    task: str | None,
    clear_task: bool,
    drop: bool,
    undrop: bool,
    as_json: bool,
) -> None:
    """Edit episodes for export: trim, replace the task, drop; the recording is never touched.

    EPISODES is an index, a range or a list of both (3, 3-7, 3-7,9), as for eva qc: every one
    is edited, or none (an unknown episode or a trim outside one episode refuses the whole
    edit). Edits are stored beside the verdicts in meta/episodes.jsonl; each export applies
    them, and a changed edit makes the published exports stale, as a changed verdict does.

    \b
    Examples:
      eva edit demo-data/logs/pick_cube/raw 0 --trim 0.2s:  # leave out the first 0.2 s
      eva edit demo-data/logs/pick_cube/raw 0-1 --task "pick up the cube"
      eva edit demo-data/logs/pick_cube/raw 2 --drop  # a calibration run: in neither subset
      eva edit demo-data/logs/pick_cube/raw 0-2 --clear-trim --clear-task --undrop
    """
    from eva.cli.dataset_commands import parse_episode_list, show_updates, stale_export_roots
    from eva.dataset.errors import DatasetError
    from eva.quality.edits import EditRequest, edit_episodes

    if drop and undrop:
        fail("edit: --drop and --undrop exclude each other", EXIT_USAGE)
    request = EditRequest(
        trim=trim,
        clear_trim=clear_trim,
        task=task,
        clear_task=clear_task,
        drop=True if drop else False if undrop else None,
    )
    problem = request.problem()
    if problem is not None:
        fail(f"edit: {problem}", EXIT_USAGE)
    try:
        indices = parse_episode_list(episodes)
    except click.BadParameter as e:
        fail(f"edit: EPISODES {e.message}", EXIT_USAGE)
    try:
        stale_before = stale_export_roots(dataset)
        updates = edit_episodes(dataset, indices, request)
    except DatasetError as e:
        fail(str(e))
    show_updates(dataset, updates, as_json, _edit_line, stale_before)


def edit_summary(row: dict[str, Any]) -> str:
    """An episode's edits in a few words (``-`` for none), for ``eva edit``, ``qc --list`` and
    ``info --episodes``; a row the validator refuses shows what it holds."""
    from eva.dataset.edits import EDIT_DROP, EDIT_TASK, EDIT_TRIM

    parts = []
    trim = row.get(EDIT_TRIM)
    if isinstance(trim, list) and len(trim) == 2:
        parts.append(f"trim {trim[0]}:{trim[1]}")
    elif trim is not None:
        parts.append(f"trim {trim!r}")
    if row.get(EDIT_TASK) is not None:
        parts.append(f"task {row[EDIT_TASK]!r}")
    if row.get(EDIT_DROP) is True:
        parts.append("dropped")
    return ", ".join(parts) or "-"


def _edit_line(row: dict[str, Any]) -> str:
    return f"episode {row.get('episode_index')} ({row.get('length')} frames): {edit_summary(row)}"
