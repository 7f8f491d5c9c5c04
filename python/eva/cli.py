"""The ``eva`` command line: the only module that talks to terminals.

Exit codes: 0 ok, 1 invalid data or a failed operation, 2 usage error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from eva import __version__
from eva._native import build_info

EXIT_INVALID = 1
EXIT_USAGE = 2


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, ensure_ascii=False, default=str))


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` (errors from libraries may span several)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def fail(message: str, code: int = EXIT_INVALID) -> NoReturn:
    """One-line error on stderr and a non-zero exit."""
    click.echo(f"eva: error: {first_line(message)}", err=True)
    sys.exit(code)


def _version_message() -> str:
    info = build_info()
    core = info["backend"]
    if core == "native":
        core = f"native ({info.get('compiler')}, C++{info.get('cxx_standard')})"
    return f"eva {__version__}, core: {core}"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, message=_version_message())
def main() -> None:
    """eva: record, review, split, export and upload robot-learning datasets.

    \b
    Example:
      eva info demo-data/pick/raw
    """


# ---- commands are added below, one section per stage; keep edits local to your section ----

# [dataset commands: info, validate]


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
    }


@main.command("info")
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
    click.echo(f"dataset   {summary['dataset']} ({summary['codebase_version']})")
    click.echo(f"episodes  {summary['episodes']}, frames {summary['frames']}, fps {summary['fps']}")
    click.echo(f"cameras   {cameras or '-'}")
    click.echo(f"tasks     {len(summary['tasks'])}: " + "; ".join(summary["tasks"]))
    q, v = summary["quality"], summary["qc_verdict"]
    click.echo(
        f"quality   green {q['green']}, red {q['red']}; qc pass {v['pass']}, fail {v['fail']}"
    )


@main.command("validate")
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
            click.echo(str(problem))
        click.echo(
            f"{dataset}: valid" if not problems else f"{dataset}: {len(problems)} problem(s)",
            err=bool(problems),
        )
    if problems:
        sys.exit(EXIT_INVALID)


# [capture commands: collect]


def _collect_setup(
    config_path: Path, source: str, dataset: str | None, seed: int
) -> tuple[Any, Any]:
    """(CollectionConfig, source): the config, and the source built from it (the streams adapted
    to a replayed dataset)."""
    from eva.capture.sources import SourceSpecError, source_from_spec
    from eva.config import ConfigError, load_config

    try:
        cfg = load_config(config_path).collection
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    if dataset is not None and dataset not in cfg.tasks:
        fail(f"dataset {dataset!r} is not in collection.tasks of {config_path}", EXIT_USAGE)
    try:
        cfg, rig, note = source_from_spec(cfg, source, seed=seed)
    except SourceSpecError as e:
        fail(str(e), EXIT_USAGE)
    if note:
        click.echo(f"eva: note: {note}", err=True)
    return cfg, rig


def _collect_status_line(status: dict[str, Any]) -> str:
    state = "REC" if status["recording"] else "idle"
    backlog = sum(status["backlog"].values())
    fps = " ".join(
        f"{key.rsplit('.', 1)[-1]}:{value:4.1f}" for key, value in status["camera_fps"].items()
    )
    return (
        f"{state} {status['elapsed_s']:6.1f}s | frames {status['frames']:6d} | backlog "
        f"{backlog} ({status['backlog_mb']:.1f} MB) | dropped {status['dropped']} | saves "
        f"{status['save_queue']} queued, {status['saved']} saved, {status['failed']} failed | "
        f"fps {fps}"
    )


def _collect_job_line(job: Any) -> str:
    if job.state == "failed":
        return f"episode save failed: {job.error}"
    if job.episode_index is None:
        return "zero-frame episode: nothing written"
    issues = ", ".join(i["code"] for i in job.quality_issues)
    return (
        f"saved episode {job.episode_index}: {job.frames} frames, {job.quality}"
        + (f" ({issues})" if issues else "")
        + f" -> {job.dataset_dir}"
    )


@main.command("collect")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--episodes",
    type=click.IntRange(min=1),
    default=None,
    help="Scripted: record N episodes back to back, then exit.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.0),
    default=10.0,
    show_default=True,
    help="Scripted: length of each episode.",
)
@click.option(
    "--source", default="sim", show_default=True, help="sim | replay:PATH (a v2.1 dataset)."
)
@click.option(
    "--dataset", default=None, help="Dataset name from collection.tasks (default: first)."
)
@click.option("--task", default=None, help="Task prompt (default: the dataset's first prompt).")
@click.option("--seed", type=int, default=0, help="Seed of the simulated rig.")
@click.option(
    "--json", "as_json", is_flag=True, help="Scripted: one JSON object per saved episode."
)
def collect_command(
    config: Path,
    episodes: int | None,
    seconds: float,
    source: str,
    dataset: str | None,
    task: str | None,
    seed: int,
    as_json: bool,
) -> None:
    """Record episodes into <log_dir>/<dataset>/raw (LeRobot v2.1).

    \b
    Interactive (a terminal): s START, e STOP, c CANCEL, q quit, d / t next dataset / task
    prompt; Ctrl-C cancels a running episode and quits. Scripted: --episodes N --seconds S.
    Episodes append to an existing dataset; every saved episode is green or red with its
    quality issues (see docs/capture.md).
    \b
    Examples:
      eva collect rig.toml
      eva collect rig.toml --episodes 3 --seconds 20 --source sim
      eva collect rig.toml --episodes 1 --seconds 5 --source replay:/data/eva/old/raw
    """
    import logging
    import os

    from eva.capture.recorder import Recorder, RecorderError, pin_mmap_threshold
    from eva.capture.sources import SourcePump

    cfg, rig = _collect_setup(config, source, dataset, seed)
    if os.environ.get("EVA_CAPTURE_MALLOC", "pin") != "keep":
        pin_mmap_threshold()  # flat RSS over long sessions (see pin_mmap_threshold)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("\neva: %(levelname)s: %(message)s"))
    capture_log = logging.getLogger("eva.capture")
    capture_log.addHandler(handler)
    capture_log.setLevel(logging.INFO)
    try:
        recorder = Recorder(cfg, dataset)
    except Exception as e:
        fail(str(e) or type(e).__name__)
    pump = SourcePump(rig, recorder).start()
    failed = False
    try:
        if episodes is not None:
            failed = _collect_scripted(recorder, pump, episodes, seconds, dataset, task, as_json)
        else:
            _collect_interactive(recorder, pump, dataset, task)
    except RecorderError as e:
        pump.stop()
        recorder.close()
        fail(str(e))
    except KeyboardInterrupt:
        if recorder.recording:
            recorder.cancel()
            click.echo("\ninterrupted: episode cancelled", err=True)
        pump.stop()
        recorder.close()
        sys.exit(130)
    pump.stop()
    recorder.close()
    if pump.error is not None:
        fail(f"source stopped: {pump.error}")
    if failed or any(j.state == "failed" for j in recorder.jobs):
        sys.exit(EXIT_INVALID)


def _collect_scripted(
    recorder: Any,
    pump: Any,
    episodes: int,
    seconds: float,
    dataset: str | None,
    task: str | None,
    as_json: bool,
) -> bool:
    import time

    jobs = []
    for _ in range(episodes):
        recorder.start(dataset, task)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not pump.finished.is_set():
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        jobs.append(recorder.stop())
        if pump.finished.is_set():
            break
    recorder.wait_idle()
    for job in jobs:
        if as_json:
            emit_json(job.as_dict())
        else:
            click.echo(_collect_job_line(job), err=job.state == "failed")
    return any(j.state == "failed" for j in jobs)


def _collect_interactive(recorder: Any, pump: Any, dataset: str | None, task: str | None) -> None:
    import select
    import termios
    import time
    import tty

    from eva.capture.recorder import RecorderError

    if not sys.stdin.isatty():
        fail(
            "interactive collect needs a terminal; script it with --episodes N --seconds S",
            EXIT_USAGE,
        )
    datasets = list(recorder.config.tasks)
    name = dataset if dataset is not None else recorder.default_dataset
    prompt = task or recorder.config.tasks[name][0]
    reported: set[int] = set()
    fd = sys.stdin.fileno()
    saved_mode = termios.tcgetattr(fd)
    tty.setcbreak(fd)  # before the banner: keys typed right after it must not sit in a line buffer
    try:
        click.echo(
            f"dataset {name} -> {recorder.dataset_dir(name)}\ntask: {prompt}\n"
            "keys: s START  e STOP  c CANCEL  q quit  d next dataset  t next task  "
            "(Ctrl-C cancels and quits)",
            err=True,
        )
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], 0.25)
            key = sys.stdin.read(1).lower() if ready else ""
            try:
                if key in ("d", "t") and recorder.recording:
                    click.echo("\nSTOP or CANCEL before changing the dataset or task", err=True)
                elif key == "d":
                    name = datasets[(datasets.index(name) + 1) % len(datasets)]
                    prompt = recorder.config.tasks[name][0]
                    click.echo(f"\ndataset {name} -> {recorder.dataset_dir(name)}", err=True)
                    click.echo(f"task: {prompt}", err=True)
                elif key == "t":
                    prompts = recorder.config.tasks[name]
                    position = prompts.index(prompt) if prompt in prompts else -1
                    prompt = prompts[(position + 1) % len(prompts)]
                    click.echo(f"\ntask: {prompt}", err=True)
                elif key == "s":
                    recorder.start(name, prompt)
                elif key == "e":
                    recorder.stop()
                elif key == "c":
                    recorder.cancel()
                    click.echo("\nepisode cancelled", err=True)
                elif key == "q":
                    if recorder.recording:
                        click.echo("\nSTOP (e) or CANCEL (c) the episode before quitting", err=True)
                    else:
                        break
            except RecorderError as e:
                click.echo(f"\n{e}", err=True)
            for job in recorder.jobs:
                if job.finished and job.job_id not in reported:
                    reported.add(job.job_id)
                    click.echo("\n" + _collect_job_line(job), err=True)
            click.echo("\r\033[K" + _collect_status_line(recorder.status()), nl=False, err=True)
            if pump.finished.is_set():
                click.echo("\nsource ended", err=True)
                break
            time.sleep(0)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved_mode)
        click.echo("", err=True)
    recorder.wait_idle()
    for job in recorder.jobs:
        if job.job_id not in reported:
            click.echo(_collect_job_line(job), err=True)


# [quality and export commands: qc, export, verify, cleanup]


def _qc_list_line(entry: dict[str, Any]) -> str:
    issues = ",".join(entry["issues"]) or "-"
    note = entry["qc_note"] if entry["qc_note"] is not None else ""
    return (
        f"{entry['episode_index']:>6}  {entry['length'] if entry['length'] is not None else '?':>6}  "
        f"{entry['quality'] or '-':<6} {entry['qc_verdict'] or '-':<5} {entry['subset']:<9} "
        f"{entry['reason']:<26} {issues}  {note}"
    ).rstrip()


@main.command("qc")
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.argument("episode", type=int, required=False)
@click.option("--pass", "pass_", is_flag=True, help="Accept the episode (overrides red).")
@click.option("--fail", "fail_", is_flag=True, help="Reject the episode.")
@click.option("--clear", "clear_", is_flag=True, help="Remove the verdict (quality decides again).")
@click.option("--note", default=None, help="Replace the operator note (alone: note-only update).")
@click.option("--list", "list_", is_flag=True, help="Show every episode's review and subset.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def qc_command(
    dataset: Path,
    episode: int | None,
    pass_: bool,
    fail_: bool,
    clear_: bool,
    note: str | None,
    list_: bool,
    as_json: bool,
) -> None:
    """Review episodes: set a verdict and/or note, or --list the review and resulting split.

    \b
    Examples:
      eva qc data/pick/raw 3 --pass --note "red flag was a glitch"
      eva qc data/pick/raw 4 --note "check lighting"      (note only, verdict unchanged)
      eva qc data/pick/raw 4 --clear                      (no verdict: quality decides)
      eva qc data/pick/raw --list
    """
    from eva.dataset.errors import DatasetError
    from eva.quality.verdicts import read_episode_rows, review_episode, review_table

    if pass_ + fail_ + clear_ > 1:
        fail("qc: --pass, --fail and --clear exclude each other", EXIT_USAGE)
    verdict = "pass" if pass_ else "fail" if fail_ else None
    try:
        if list_:
            if episode is not None or verdict or clear_ or note is not None:
                fail("qc --list takes no episode, verdict or note", EXIT_USAGE)
            table = review_table(read_episode_rows(dataset))
            if as_json:
                for entry in table:
                    emit_json(entry)
                return
            click.echo(
                f"{'ep':>6}  {'frames':>6}  quality verdict subset    reason{' ' * 21}issues  note"
            )
            for entry in table:
                click.echo(_qc_list_line(entry))
            accepted = sum(1 for e in table if e["subset"] == "accepted")
            click.echo(f"accepted {accepted}, rejected {len(table) - accepted}")
            return
        if episode is None:
            fail("qc needs an EPISODE index (or --list)", EXIT_USAGE)
        if verdict is None and note is None and not clear_:
            fail("qc needs --pass, --fail, --clear or --note", EXIT_USAGE)
        update = review_episode(dataset, episode, verdict=verdict, note=note, clear_verdict=clear_)
    except DatasetError as e:
        fail(str(e))
    from eva.quality.verdicts import subset_of

    row = update.row
    if as_json:
        emit_json({**row, "subset": subset_of(row), "changed": update.changed})
    else:
        click.echo(
            f"episode {episode}: verdict {row.get('qc_verdict') or '-'}, "
            f"note {row.get('qc_note')!r} -> {subset_of(row)}"
            + ("" if update.changed else " (unchanged)")
        )


def _human_bytes(n: float) -> str:
    """Decimal units, as progress lines show them: ``512 B``, ``3.0 MB``."""
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def _check_hdf5_compression(value: str | None) -> str | None:
    """Refuse a bad --hdf5-compression before a job starts (a failed job would block uploads)."""
    if value is not None:
        from eva.formats.hdf5 import parse_compression

        try:
            parse_compression(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


@main.command("export")
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    required=True,
    help="lerobot_v21, lerobot_v3, hdf5 or mcap (aliases: v21, v3, h5).",
)
@click.option("--copy-videos", is_flag=True, help="lerobot_v21: copy MP4s instead of hard-linking.")
@click.option(
    "--mcap-compression",
    type=click.Choice(["none", "zstd", "lz4"]),
    default=None,
    help="mcap: chunk compression (default none: frames come from lossy MP4s; zstd for size).",
)
@click.option(
    "--mcap-chunk-size",
    type=click.IntRange(min=1024),
    default=None,
    help="mcap: uncompressed chunk size in bytes (default 4 MiB).",
)
@click.option(
    "--hdf5-compression",
    default=None,
    callback=lambda _ctx, _param, value: _check_hdf5_compression(value),
    metavar="none|gzip[:LEVEL]|lzf",
    help="hdf5: image/column compression (default none: fastest; gzip and lzf are ~50 MB/s/core).",
)
@click.option(
    "--hdf5-frames-per-chunk",
    type=click.IntRange(min=1),
    default=None,
    help="hdf5: frames per image chunk (default 1: cheapest random access; more: fewer I/O calls "
    "and better compression, but one frame reads its whole chunk).",
)
@click.option(
    "--verify-decode",
    is_flag=True,
    help="lerobot_v3: decode every frame of every video shard to check the frame counts "
    "(and compute exact image quantiles); default counts MP4 samples without decoding.",
)
@click.option(
    "--data-file-size-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="lerobot_v3: data shard size limit (default 100).",
)
@click.option(
    "--video-file-size-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="lerobot_v3: video shard size limit (default 200).",
)
@click.option(
    "--image-quantiles",
    type=click.Choice(["keyframes", "none"]),
    default=None,
    help="lerobot_v3: image quantiles from the decoded keyframes (default) or none (faster).",
)
@click.option(
    "--image-quantile-keyframes",
    type=click.IntRange(min=0),
    default=None,
    help="lerobot_v3: keyframes decoded per episode and camera for the image quantiles "
    "(default 1, evenly spread; 0 = every keyframe).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON progress lines (default when not a terminal)."
)
def export_command(
    dataset: Path,
    fmt: str,
    copy_videos: bool,
    mcap_compression: str | None,
    mcap_chunk_size: int | None,
    hdf5_compression: str | None,
    hdf5_frames_per_chunk: int | None,
    verify_decode: bool,
    data_file_size_mb: float | None,
    video_file_size_mb: float | None,
    image_quantiles: str | None,
    image_quantile_keyframes: int | None,
    as_json: bool,
) -> None:
    """Split DATASET into accepted/rejected and export both as FMT, published as a pair.

    \b
    Output: <parent>/export/<fmt>/{accepted,rejected} for a source named raw,
    else <parent>/<name>_export/<fmt>/{accepted,rejected}.
    Example:
      eva export data/pick/raw --format v3
    """
    import time

    from eva.dataset.errors import DatasetError
    from eva.dataset.layout import normalize_format
    from eva.export.pipeline import export_dataset
    from eva.export.registry import ExportOptions

    try:
        fmt = normalize_format(fmt)
    except ValueError as e:
        fail(str(e), EXIT_USAGE)
    json_lines = as_json or not sys.stdout.isatty()
    last = [0.0]

    def on_progress(progress: Any, job: Any) -> None:
        now = time.monotonic()
        final = job.state in ("completed", "failed")
        if json_lines:
            if final or now - last[0] >= 0.2:
                last[0] = now
                emit_json({"event": "progress", "state": job.state, **progress.as_dict()})
            return
        if not final and now - last[0] < 0.1:
            return
        last[0] = now
        total = progress.total_episodes
        width = 30
        done = int(width * progress.episodes / total) if total else (width if final else 0)
        bar = "#" * done + "-" * (width - done)
        click.echo(
            f"\r{fmt} [{bar}] {progress.episodes}/{total if total is not None else '?'} episodes, "
            f"{progress.files} files, {_human_bytes(progress.bytes)}",
            nl=final,
            err=True,
        )

    try:
        result = export_dataset(
            dataset,
            fmt,
            options=ExportOptions(
                link_videos=not copy_videos,
                extra={
                    k: v
                    for k, v in (
                        ("mcap_compression", mcap_compression),
                        ("mcap_chunk_size", mcap_chunk_size),
                        ("hdf5_compression", hdf5_compression),
                        ("hdf5_frames_per_chunk", hdf5_frames_per_chunk),
                        ("verify_decode", verify_decode or None),
                        ("data_files_size_in_mb", data_file_size_mb),
                        ("video_files_size_in_mb", video_file_size_mb),
                        ("image_quantiles", image_quantiles),
                        ("image_quantile_keyframes", image_quantile_keyframes),
                    )
                    if v is not None
                },
            ),
            on_progress=on_progress,
        )
    except DatasetError as e:
        if json_lines:
            emit_json({"event": "failed", "error": str(e)})
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - any writer failure: one line, job.json has it too
        message = f"export failed: {type(e).__name__}: {first_line(str(e))}"
        if json_lines:
            emit_json({"event": "failed", "error": message})
        fail(message)
    summary = {
        "event": "completed",
        "job_id": result.job.job_id,
        "format": fmt,
        "accepted_dir": str(result.accepted_dir),
        "rejected_dir": str(result.rejected_dir),
        "accepted_episodes": result.metas["accepted"].total_episodes,
        "accepted_frames": result.metas["accepted"].total_frames,
        "rejected_episodes": result.metas["rejected"].total_episodes,
        "rejected_frames": result.metas["rejected"].total_frames,
        "recovered": result.recovered,
    }
    if json_lines:
        emit_json(summary)
        return
    for line in result.recovered:
        click.echo(f"recovered: {line}")
    click.echo(
        f"accepted: {summary['accepted_dir']} ({summary['accepted_episodes']} episodes, "
        f"{summary['accepted_frames']} frames)"
    )
    click.echo(
        f"rejected: {summary['rejected_dir']} ({summary['rejected_episodes']} episodes, "
        f"{summary['rejected_frames']} frames)"
    )


@main.command("verify")
@click.argument("export_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--source", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Current source dataset (default: derived from the export path).")  # fmt: skip
@click.option("--format", "fmt", default=None, help="Expected format (default: from the path).")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per problem, then a summary."
)
def verify_command(export_dir: Path, source: Path | None, fmt: str | None, as_json: bool) -> None:
    """Verify an exported accepted/rejected directory: marker, totals and a real read.

    \b
    Example:
      eva verify data/pick/export/lerobot_v21/accepted
    """
    from eva.dataset.errors import DatasetError
    from eva.export.pipeline import problem_line
    from eva.export.verify import verify_export

    try:
        problems = verify_export(export_dir, source_dir=source, fmt=fmt)
    except (DatasetError, ValueError) as e:
        fail(str(e))
    if as_json:
        for p in problems:
            emit_json(
                {"code": p.code, "message": p.message, "path": str(p.path), "episode": p.episode}
            )
        emit_json({"ok": not problems, "problems": len(problems), "export_dir": str(export_dir)})
    else:
        for p in problems:
            click.echo(f"{p.code}: {problem_line(p)}", err=True)
        if not problems:
            click.echo(f"ok: {export_dir}")
    if problems:
        sys.exit(EXIT_INVALID)


@main.command("cleanup")
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.option("--format", "fmt", default=None, help="Only this format (default: all).")
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
            click.echo(f"{name}: {line}")
            count += 1
    if not count:
        click.echo("nothing to clean up")


# [console: the operator's browser UI and HTTP API]


@main.command("console")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback must be given explicitly.")  # fmt: skip
@click.option("--port", type=click.IntRange(0, 65535), default=8750, show_default=True,
              help="TCP port (0: any free port; the printed URL names it).")  # fmt: skip
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the access token, mode 0600 (default: <log_dir>.console-token "
              "beside the log directory).")  # fmt: skip
@click.option(
    "--source", default="sim", show_default=True, help="sim | replay:PATH (a v2.1 dataset)."
)
@click.option("--seed", type=int, default=0, help="Seed of the simulated rig.")
@click.option("--known-hosts", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="known_hosts for uploads (default: storage.sftp.known_hosts).")  # fmt: skip
def console_command(
    config: Path,
    host: str,
    port: int,
    token_file: Path | None,
    source: str,
    seed: int,
    known_hosts: Path | None,
) -> None:
    """Serve the operator console: COLLECT, QUALITY CHECK, EXPORT and UPLOAD in a browser.

    It prints a URL with a fresh access token; scripts send it as `Authorization: Bearer TOKEN`
    (the token is also written to --token-file). The JSON API is the same control channel as the
    page: see docs/console.md.
    \b
    Example:
      eva console rig.toml
      curl -H "Authorization: Bearer $(cat /data/eva.console-token)" http://127.0.0.1:8750/api/status
    """
    import os

    from eva.capture.recorder import pin_mmap_threshold
    from eva.capture.sources import SourceSpecError

    try:
        from eva.console.server import default_token_file, new_token, serve, write_token_file
        from eva.console.session import ConsoleError, ConsoleSession
    except ImportError as e:
        fail(f"eva console needs the console extra (pip install 'eva[console]'): {e}", EXIT_USAGE)
    if os.environ.get("EVA_CAPTURE_MALLOC", "pin") != "keep":
        pin_mmap_threshold()  # flat RSS over long sessions (see pin_mmap_threshold)
    try:
        session = ConsoleSession(config, source=source, seed=seed, sftp_known_hosts=known_hosts)
    except (ConsoleError, SourceSpecError) as e:
        fail(str(e), EXIT_USAGE)
    except Exception as e:  # noqa: BLE001 - a recorder that cannot start: one line
        fail(f"console: {first_line(str(e)) or type(e).__name__}")
    token = new_token()
    path = token_file or default_token_file(session.config.log_dir)
    try:
        write_token_file(path, token)
    except OSError as e:
        session.close()
        fail(f"--token-file {path}: {e.strerror or e}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"eva: warning: serving on {host}: reachable from other hosts", err=True)
    if session.source_note:
        click.echo(f"eva: note: {session.source_note}", err=True)

    def ready(url: str) -> None:
        click.echo(f"eva console: recording from {session.status()['source']}", err=True)
        click.echo(f"eva console: token written to {path}", err=True)
        click.echo(url)
        sys.stdout.flush()

    try:
        serve(session, host=host, port=port, token=token, on_ready=ready)
    except OSError as e:
        fail(f"console: cannot listen on {host}:{port}: {e.strerror or e}")
    finally:
        session.close()


# [upload commands: upload]


def _upload_source_dir(dataset: str, collection: dict[str, Any], config_path: str) -> Any:
    """DATASET is the raw source directory, or a dataset name resolved like COLLECT does:
    ``<log_dir>/<sanitised name>/raw`` (empty log_dir -> eva.config's derived work directory).
    Only ``log_dir`` is read, so uploading does not depend on the capture settings."""
    from eva.config import ConfigError, dataset_dir, resolve_log_dir

    path = Path(dataset).expanduser()
    if path.is_dir() or "/" in dataset:
        return path
    log_dir_text = collection.get("log_dir", "")
    if not isinstance(log_dir_text, str):
        fail(f"{config_path}: collection.log_dir must be a string")
    log_dir, _ = resolve_log_dir(log_dir_text, Path(config_path).resolve().parent)
    try:
        return dataset_dir(log_dir, dataset)
    except ConfigError as e:
        fail(str(e))


def _upload_progress_line(progress: dict[str, Any], elapsed: float, width: int = 28) -> str:
    totals = progress.get("totals") or {}
    done, total = progress.get("bytes") or 0, totals.get("bytes") or 0
    fraction = done / total if total else 0.0
    bar = "#" * int(fraction * width) + "-" * (width - int(fraction * width))
    rate = done / elapsed if elapsed > 0 else 0.0
    current = progress.get("current") or ""
    if len(current) > 40:
        current = "..." + current[-37:]
    return (
        f"[{bar}] {fraction * 100:5.1f}%  {_human_bytes(done)}/{_human_bytes(total)}  "
        f"files {progress.get('files') or 0}/{totals.get('files') or 0}  "
        f"{_human_bytes(rate)}/s  {current}"
    )


@main.command("upload")
@click.argument("dataset")
@click.option("--format", "fmt", required=True, help="lerobot_v21, lerobot_v3, hdf5 or mcap.")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="TOML config with a [collection.storage.sftp] table.",
)
@click.option(
    "--accept-new-host-key",
    is_flag=True,
    help="Trust and record the server's host key if known_hosts does not list it yet.",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted upload of this export.")
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False),
    default=None,
    help="known_hosts file (default: storage.sftp.known_hosts, else ~/.ssh/known_hosts).",
)
@click.option("--json", "as_json", is_flag=True, help="Progress and result as JSON lines.")
def upload_command(
    dataset: str,
    fmt: str,
    config_path: str,
    accept_new_host_key: bool,
    resume: bool,
    known_hosts: str | None,
    as_json: bool,
) -> None:
    """Upload the current accepted export of DATASET over SFTP.

    DATASET is the raw source directory (or a dataset name under collection.log_dir). Only the
    accepted directory of the latest completed export in FORMAT is sent; it is staged remotely and
    published by one rename under <remote_dir>/<dataset-name>, or <...>.copy_<UTC time> if taken.

    \b
    Example:
      eva upload demo-data/pick/raw --format hdf5 --config eva.toml
    """
    import dataclasses
    import time

    from eva.dataset.errors import DatasetError
    from eva.upload.config import UploadConfigError, load_upload_config
    from eva.upload.gate import UploadRefused
    from eva.upload.job import start_upload
    from eva.upload.sftp import UploadError, UploadOptions

    def refuse(message: str) -> NoReturn:
        if as_json:
            emit_json({"event": "error", "error": message})
        fail(message)

    try:
        collection, sftp_config = load_upload_config(Path(config_path))
    except UploadConfigError as e:
        refuse(str(e))
    if sftp_config is not None and known_hosts:
        sftp_config = dataclasses.replace(sftp_config, known_hosts=Path(known_hosts).resolve())
    source = _upload_source_dir(dataset, collection, config_path)
    try:
        job = start_upload(
            source,
            fmt,
            sftp_config,
            options=UploadOptions(accept_new_host_key=accept_new_host_key),
            resume=resume,
        )
    except UploadRefused as e:
        refuse(f"upload refused ({e.reason}): {e}")
    except (UploadError, DatasetError, ValueError) as e:
        refuse(str(e))

    interactive = not as_json and sys.stderr.isatty()
    started = time.monotonic()
    last_emit = 0.0
    try:
        while not job.wait(0.2):
            now = time.monotonic()
            if as_json and now - last_emit >= 0.5:
                emit_json({"event": "progress", "state": job.state, **job.record.progress})
                last_emit = now
            elif interactive:
                line = _upload_progress_line(job.record.progress, now - started)
                click.echo("\r" + line + "\x1b[K", nl=False, err=True)
    except KeyboardInterrupt:
        job.cancel()
        job.wait()
    if interactive:
        line = _upload_progress_line(job.record.progress, time.monotonic() - started)
        click.echo("\r" + line + "\x1b[K", err=True)

    record = job.snapshot()
    if job.result is None:
        message = f"upload failed: {job.error}"
        if record.get("resumable") and "--resume" not in message:
            message += " (rerun with --resume to continue)"
        refuse(message)
    result = job.result.as_dict()
    if as_json:
        emit_json({"event": "result", "state": job.state, "job_id": record["job_id"], **result})
        return
    note = " (target existed: published under a copy name)" if job.result.used_copy_name else ""
    skipped = (
        f", {job.result.skipped_files} already staged files skipped" if job.result.resumed else ""
    )
    click.echo(
        f"uploaded {job.result.files} files ({_human_bytes(job.result.bytes)}) to "
        f"{sftp_config.host if sftp_config else ''}:{job.result.remote_path}{note}{skipped}"
    )


if __name__ == "__main__":
    main()
