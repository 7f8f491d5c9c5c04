"""``eva export`` and ``eva verify``; the per-format options come from the catalogue's options
dataclasses (eva.formats.catalog, eva.formats.options), so each default is stated once."""

from __future__ import annotations

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
    event_printer,
    fail,
    first_line,
    format_help,
    human_bytes,
    note,
    on_interrupt,
    say,
    verbosity,
    verbosity_options,
)
from eva.cli.progress import ProgressBar
from eva.formats import catalog
from eva.formats.base import (
    ExportOptions,
    OptionError,
    OptionField,
    Options,
    check_range,
    parse_pairs,
)
from eva.formats.catalog import FormatEntry

if TYPE_CHECKING:
    from eva.export.pipeline import ExportResult

# Processes or Ray actors of one export (more only queue behind the cores and the disk).
MAX_WORKERS = 1024


def _generated_option(
    cls: type[Options], spec: OptionField, label: str | None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """One ``eva export`` option made from an options dataclass field (name, type, default,
    help, choices); its value is checked by the dataclass as soon as it is parsed, so a bad
    one is refused before a job starts (a failed job would block uploads)."""

    def check(_ctx: click.Context, _param: click.Parameter, value: object) -> object:
        try:
            if spec.type in ("int", "float"):
                check_range(spec, value)  # type: ignore[arg-type]
            if spec.type == "mapping":  # the flag once per pair: a tuple of KEY=VALUE texts
                value = parse_pairs(spec.name, value)
            cls(**{spec.field_name: value})
        except OptionError as e:
            if e.option != spec.name:  # a combination: refused when the options are built
                return value
            raise click.BadParameter(e.reason) from None
        return value

    help_text = f"{label}: {spec.info.help}" if label else spec.info.help
    kind: click.ParamType[Any, Any] | type[int] | type[float] | type[str] | None
    # The options' own bounds (every number has both), the ones the console applies; ``check``
    # also refuses nan, which a FloatRange lets through.
    low, high, min_open = spec.info.minimum, spec.info.maximum, spec.info.minimum_open
    if spec.type == "bool":
        return click.option(
            spec.flag, spec.name, is_flag=True, default=spec.default, help=help_text, callback=check
        )
    if spec.type == "mapping":
        return click.option(
            spec.flag,
            spec.name,
            multiple=True,
            default=spec.default,
            metavar=spec.info.metavar or "KEY=VALUE",
            help=help_text,
            callback=check,
        )
    if spec.type == "choice":
        kind = click.Choice(list(spec.info.choices))
    elif spec.type == "int":
        assert low is not None and high is not None  # Options.option_fields insists
        kind = click.IntRange(min=int(low), max=int(high), min_open=min_open)
    elif spec.type == "float":
        kind = click.FloatRange(min=low, max=high, min_open=min_open)
    else:
        kind = str
    return click.option(
        spec.flag,
        spec.name,
        type=kind,
        default=spec.default,
        show_default=True,
        metavar=spec.info.metavar,
        help=help_text,
        callback=check,
    )


def _format_options(command: Callable[..., None]) -> Callable[..., None]:
    """Every format's options (its catalogue entry's dataclass), then the ones all formats
    take."""
    # An option several formats share (the LeRobot formats' --video-profile, declared once in
    # a common base class) is one flag, labelled with each of them.
    owners: dict[str, tuple[type[Options], OptionField, list[str]]] = {}
    for entry in catalog.entries():
        for spec in entry.options.option_fields():
            owners.setdefault(spec.name, (entry.options, spec, []))[2].append(entry.name)
    generated = [
        _generated_option(cls, spec, ", ".join(labels)) for cls, spec, labels in owners.values()
    ]
    generated += [
        _generated_option(ExportOptions, spec, None) for spec in ExportOptions.option_fields()
    ]
    for decorate in reversed(generated):
        command = decorate(command)
    return command


def _refuse_other_formats_options(fmt: FormatEntry) -> None:
    """An option of another format given on the command line (or from the environment) is a
    usage error naming it: it would otherwise be silently ignored."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    own = {spec.name for spec in fmt.option_fields()}
    for entry in catalog.entries():
        if entry.name == fmt.name:
            continue
        for spec in entry.options.option_fields():
            if spec.name in own:  # shared with fmt
                continue
            source = ctx.get_parameter_source(spec.name)
            if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
                fail(
                    f"{spec.flag}: an option of --format {entry.name}, not of {fmt.name}",
                    EXIT_USAGE,
                )


def _export_options(fmt: FormatEntry, values: dict[str, Any]) -> ExportOptions:
    """The typed options of an ``eva export`` of ``fmt`` from the generated options' values
    (another format's options are refused before: ``_refuse_other_formats_options``; a format
    registered after this command was made has no options here, so its defaults)."""
    own = {
        spec.field_name: values.get(spec.name, spec.default) for spec in fmt.options.option_fields()
    }
    common = {spec.field_name: values[spec.name] for spec in ExportOptions.option_fields()}
    try:
        return ExportOptions(**common, format=fmt.options(**own))
    except OptionError as e:  # options each fine alone, not together
        fail(_option_message(fmt, e), EXIT_USAGE)


@click.command("export")
@verbosity_options()
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    required=True,
    type=FormatChoice(),
    help=format_help(),
)
@_format_options
@click.option(
    "--executor",
    type=click.Choice(["serial", "processes", "ray"]),
    default=None,
    help="Where the export's tasks (an episode file each; lerobot_v3: a data or video file "
    "each) are written: serial (this process) or processes (a local process pool) or ray (a "
    "Ray cluster, pip install 'eva[ray]'). Default: processes from 2 free cores for hdf5, from "
    "4 for mcap (which decodes its cameras on threads already), else serial (always for "
    "lerobot_v21 and lerobot_v3, file copies that a pool's start would slow down). The output "
    "is the same either way.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=MAX_WORKERS),
    default=None,
    metavar="N",
    help="Processes of --executor processes (default: the free cores), actors of --executor "
    "ray (default: the cluster's CPUs).",
)
@click.option(
    "--ray-address",
    default=None,
    metavar="ADDRESS",
    help="The Ray cluster of --executor ray (host:port, or ray://host:port; given alone it "
    "implies --executor ray); default: $RAY_ADDRESS, else a local Ray started for this export.",
)
@click.option(
    "--incremental",
    is_flag=True,
    help="Link every episode file (lerobot_v3: shard file) whose fingerprint (source files' "
    "size, mtime, ctime, inode and device; the episodes' rows and verdicts; the options) "
    "matches the published pair's, and write only the rest. The result is the same bytes as a "
    "full export.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per event on stdout (progress, then completed or failed).",
)
def export_command(
    dataset: Path,
    fmt: FormatEntry,
    executor: str | None,
    workers: int | None,
    ray_address: str | None,
    incremental: bool,
    as_json: bool,
    **option_values: Any,
) -> None:
    """Split DATASET into accepted/rejected and export both as FMT, published as a pair.

    \b
    Output: <parent>/export/<fmt>/{accepted,rejected} for a source named raw,
    else <parent>/<name>_export/<fmt>/{accepted,rejected}.
    Examples:
      eva export demo-data/logs/pick_cube/raw --format v3
      eva export demo-data/logs/pick_cube/raw --format mcap --mcap-compression zstd --json
      eva export demo-data/logs/pick_cube/raw --format hdf5 --executor processes --workers 4
      eva export demo-data/logs/pick_cube/raw --format mcap --incremental
    """
    from eva.dataset.errors import DatasetError
    from eva.export.executors import default_executor
    from eva.export.pipeline import export_dataset

    if ray_address and executor not in (None, "ray"):
        raise click.UsageError(f"--ray-address is for --executor ray, not {executor}")
    _refuse_other_formats_options(fmt)
    on_interrupt(
        "the published pair is unchanged; the next export (or eva cleanup) removes the staging"
    )
    json_lines = as_json  # a pipe, cron or ssh gets the same text as a terminal
    quiet = json_lines or verbosity() < 0
    bar = ProgressBar(f"export {fmt}", unit="episodes", enabled=False if quiet else None)
    on_progress = _progress_printer(bar, json_lines)
    try:
        result = export_dataset(
            dataset,
            fmt,
            options=_export_options(fmt, option_values),
            on_progress=on_progress,
            executor=executor or ("ray" if ray_address else default_executor(fmt)),
            workers=workers,
            incremental=incremental,
            ray_address=ray_address,
        )
    except OptionError as e:  # an option the source refuses (--hdf5-map naming no feature)
        bar.close()
        message = _option_message(fmt, e)
        if json_lines:
            emit_json({"event": "failed", "error": message})
        fail(message, EXIT_USAGE)
    except DatasetError as e:
        bar.close()
        if json_lines:
            emit_json({"event": "failed", "error": str(e)})
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - any writer failure: one line, job.json has it too
        bar.close()
        message = f"export failed: {type(e).__name__}: {first_line(str(e))}"
        if json_lines:
            emit_json({"event": "failed", "error": message})
        fail(message)
    except BaseException:  # Ctrl-C: give the terminal its cursor back first
        bar.close()
        raise
    _report_export(result, fmt, incremental, json_lines)


def _option_message(fmt: FormatEntry, error: OptionError) -> str:
    """``<flag>: <reason>`` for an option of ``fmt`` refused by the export (else the error)."""
    for spec in fmt.option_fields():
        if spec.name == error.option:
            return f"{spec.flag}: {error.reason}"
    return str(error)


def _progress_printer(bar: ProgressBar, json_lines: bool) -> Callable[[Any, Any], None]:
    """The export's progress listener: JSON lines (at most 5 a second, and the final one), or
    the progress bar."""
    import time

    last = [0.0]
    emit_event = event_printer()

    def on_progress(progress: Any, job: Any) -> None:
        now = time.monotonic()
        final = job.state in ("completed", "failed")
        if json_lines:
            if final or now - last[0] >= 0.2:
                last[0] = now
                emit_event({"event": "progress", "state": job.state, **progress.as_dict()})
            return
        if progress.stage != "writing":
            bar.stage(progress.stage)
        bar.update(
            progress.episodes,
            total=progress.total_episodes,
            detail=f"{progress.files} files, {human_bytes(progress.bytes)}",
        )
        if final:
            bar.close()

    return on_progress


def _report_export(
    result: ExportResult, fmt: FormatEntry, incremental: bool, json_lines: bool
) -> None:
    """The completed export: one JSON summary, or its lines of text."""
    summary = {
        "event": "completed",
        "job_id": result.job.job_id,
        "format": fmt.name,
        "accepted_dir": str(result.accepted_dir),
        "rejected_dir": str(result.rejected_dir),
        "accepted_episodes": result.metas["accepted"].total_episodes,
        "accepted_frames": result.metas["accepted"].total_frames,
        "rejected_episodes": result.metas["rejected"].total_episodes,
        "rejected_frames": result.metas["rejected"].total_frames,
        "episodes_reused": result.job.episodes_reused,
        "episodes_renumbered": result.job.episodes_renumbered,
        "episodes_rewritten": result.job.episodes_rewritten,
        "recovered": result.recovered,
        "warnings": result.job.warnings,
    }
    if json_lines:
        emit_json(summary)
        return
    for line in result.recovered:
        note(f"recovered: {line}", err=False)
    for line in result.job.warnings:
        say(f"warning: {line}", err=True)
    for subset in ("accepted", "rejected"):
        episodes, frames = summary[f"{subset}_episodes"], summary[f"{subset}_frames"]
        say(
            f"{subset}: {summary[f'{subset}_dir']} ({episodes} episode{'' if episodes == 1 else 's'}, "
            f"{frames} frame{'' if frames == 1 else 's'})"
        )
    if incremental:
        say(
            f"episodes: {result.job.episodes_reused} reused, "
            f"{result.job.episodes_renumbered} renumbered, "
            f"{result.job.episodes_rewritten} rewritten"
        )
    for subset in ("accepted", "rejected"):
        files = [p for p in Path(str(summary[f"{subset}_dir"])).rglob("*") if p.is_file()]
        size = human_bytes(sum(p.stat().st_size for p in files))
        detail(f"{subset}: {len(files)} files, {size}")


@click.command("verify")
@verbosity_options()
@click.argument("export_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--source",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Source dataset to compare with (default: the one the export's place derives, if it "
    "exists; a moved copy is checked on its own).",
)
@click.option(
    "--format",
    "fmt",
    type=FormatChoice(),
    default=None,
    help="Expected format (default: from the path). " + format_help(),
)
@click.option(
    "--full",
    is_flag=True,
    help="Decode every frame of every MP4 (default: sampled keyframes of every MP4 and every "
    "frame of one random MP4 per camera).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per problem, then a summary."
)
@click.option(
    "--decode-latency",
    is_flag=True,
    help="Also measure each camera's random-access decode latency: 200 frames at random "
    "indices, each read as LeRobot's pyav backend does (open, seek to the keyframe before, "
    "decode forward); p50, p99 and bytes per frame.",
)
def verify_command(
    export_dir: Path,
    source: Path | None,
    fmt: FormatEntry | None,
    full: bool,
    as_json: bool,
    decode_latency: bool,
) -> None:
    """Verify an exported accepted/rejected directory: marker, totals and a real read.

    By default every MP4 has a few keyframes decoded and one random MP4 per camera is decoded
    whole: that proves the files are MP4s whose sampled frames decode, not that every frame of
    every file does (damage between keyframes of an unsampled file passes); --full decodes all.

    A copy moved or renamed away from <parent>/export/<fmt>/ is checked on its own (marker,
    totals, a real read); --source also compares it with that dataset's current review.

    \b
    Examples:
      eva verify demo-data/logs/pick_cube/export/lerobot_v3/accepted
      eva verify demo-data/logs/pick_cube/export/lerobot_v3/rejected --full --source demo-data/logs/pick_cube/raw
      eva verify demo-data/logs/pick_cube/export/lerobot_v3/accepted --decode-latency
    """
    from eva.dataset.errors import DatasetError
    from eva.export.source import problem_line
    from eva.export.verify import verify_export_report

    try:
        report = verify_export_report(export_dir, source_dir=source, fmt=fmt, full=full)
    except (DatasetError, ValueError) as e:
        fail(str(e))
    problems = report.problems
    compared = (
        f"compared with the source {report.source}"
        if report.source is not None
        else "own consistency only: no source known (--source compares it with one)"
    )
    if as_json:
        for p in problems:
            emit_json(
                {"code": p.code, "message": p.message, "path": str(p.path), "episode": p.episode}
            )
        emit_json(
            {
                "ok": not problems,
                "problems": len(problems),
                "export_dir": str(export_dir),
                "source": str(report.source) if report.source is not None else None,
            }
        )
    else:
        for p in problems:
            say(f"{p.code}: {problem_line(p)}", err=True)
        if not problems:
            say(f"ok: {export_dir} ({compared})")
    if decode_latency and not problems:
        _report_latency(export_dir, as_json)
    if problems:
        sys.exit(EXIT_INVALID)


def _report_latency(export_dir: Path, as_json: bool) -> None:
    """``eva verify --decode-latency``: one line (or JSON object) per camera."""
    from eva.export.decode_latency import export_latency

    for camera, latency in export_latency(export_dir).items():
        if as_json:
            emit_json({"decode_latency": camera, **latency.as_dict()})
        else:
            say(
                f"decode latency {camera}: p50 {latency.p50_ms:.2f} ms, p99 "
                f"{latency.p99_ms:.2f} ms, {latency.bytes_per_frame:.0f} bytes/frame "
                f"({latency.samples} reads over {latency.frames} frames)"
            )
