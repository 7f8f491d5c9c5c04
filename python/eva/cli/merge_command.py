"""``eva merge``: one new raw dataset from several recording sessions of one rig."""

from __future__ import annotations

import sys

import click

from eva.cli.output import (
    EXIT_INVALID,
    EXIT_USAGE,
    emit_json,
    fail,
    human_bytes,
    note,
    say,
    verbosity_options,
)


@click.command("merge")
@verbosity_options()
@click.argument("sessions", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--into",
    "into",
    required=True,
    type=click.Path(),
    help="The new raw dataset (a directory that must not exist yet).",
)
@click.option(
    "--map",
    "maps",
    multiple=True,
    metavar="[SESSION:]OLD=NEW",
    help="Rename feature OLD to NEW in SESSION (as given), or in every session that has OLD.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def merge_command(
    sessions: tuple[str, ...], into: str, maps: tuple[str, ...], as_json: bool
) -> None:
    """Merge raw SESSIONS of one rig into a new raw dataset; the sessions are never changed.

    Episodes are renumbered in the order the sessions are given; tasks are unioned; every
    episodes.jsonl field (verdicts, notes, quality flags, edits) is carried, and each episode's
    source_session names the dataset and episode it was recorded as. Refused, before anything
    is written, when the sessions differ in fps, robot type, features or any camera's encoding
    (one line per difference). Exit 0 merged, 1 refused (data), 2 usage.

    --map b/raw:observation.images.high=observation.images.top renames a camera of session b/raw
    (without "b/raw:", of every session that has it).

    \b
    Example:
      eva merge demo-data/logs/pick_cube/raw demo-data/logs/pick_cube_2/raw --into demo-data/logs/pick_cube_all/raw
    """
    from eva.dataset.errors import DatasetError
    from eva.dataset.merge import MergeUsageError, RigMismatch, merge_sessions

    try:
        result = merge_sessions(sessions, into, maps)
    except RigMismatch as e:
        for line in e.lines:
            say(f"eva: error: {line}", err=True)
        say(f"eva: error: {len(e.lines)} difference(s): not one rig; nothing written", err=True)
        sys.exit(EXIT_INVALID)
    except MergeUsageError as e:
        fail(str(e), EXIT_USAGE)
    except DatasetError as e:
        fail(str(e))
    for leftover in result.leftovers_removed:
        note(f"removed {leftover} (left by a merge that was killed)")
    written = result.written
    if as_json:
        emit_json(
            {
                "into": str(result.into),
                "sessions": [str(s) for s in result.sources],
                "episodes": written.episodes,
                "frames": written.frames,
                "tasks": written.tasks,
                "video_bytes": written.video_bytes,
                "leftovers_removed": [str(p) for p in result.leftovers_removed],
            }
        )
    else:
        say(
            f"{into}: merged {len(result.sources)} sessions: {written.episodes} episodes, "
            f"{written.frames} frames, {written.tasks} task(s), "
            f"{human_bytes(written.video_bytes)} of video copied"
        )
