"""``eva recover``: turn the recordings a crash left in a dataset's work dir into episodes."""

from __future__ import annotations

from pathlib import Path

import click

from eva.cli.output import emit_json, fail, note, say, verbosity_options


@click.command("recover")
@verbosity_options()
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def recover_command(dataset: Path, as_json: bool) -> None:
    """Recover episodes a crash cut short in DATASET (a raw v2.1 dataset being recorded).

    Each episode that was recording (or saving) when eva was killed becomes an episode of
    DATASET holding every frame that all its streams had on disk, at most the last 2 s short
    of what was captured. It is marked red with the issue recovered_after_crash, for review.
    eva collect and eva console run this themselves as they start.

    \b
    Example:
      eva recover demo-data/logs/pick_cube/raw
    """
    from eva.dataset.errors import DatasetError
    from eva.dataset.writer import DatasetWriter

    try:
        writer = DatasetWriter.open_existing(dataset)
    except (DatasetError, ValueError) as e:
        fail(str(e))
    writer.close()
    results = writer.recovered
    if as_json:
        emit_json(
            {
                "dataset": str(dataset),
                "recovered": [
                    {
                        "work_dir": str(r.work_dir),
                        "episode_index": r.episode_index,
                        "frames": r.frames,
                        "note": r.note,
                        "error": r.error,
                    }
                    for r in results
                ],
            }
        )
    else:
        for result in results:
            if result.error is None:
                say(f"{dataset}: {result.line()}")
        if not results:
            note("nothing to recover", err=False)
    failed = [r for r in results if r.error is not None]
    if failed:
        fail(failed[0].line() + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
