"""The ``eva`` command line: the only module that talks to terminals.

Exit codes: 0 ok, 1 invalid data or a failed operation, 2 usage error.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from eva import __version__
from eva._native import NativeCoreError, build_info
from eva.formats.base import ExportOptions, OptionError, OptionField, Options
from eva.formats.options import FORMAT_OPTIONS as FORMAT_OPTION_CLASSES
from eva.textsafe import json_line, printable

EXIT_INVALID = 1
EXIT_USAGE = 2


def emit_json(obj: Any) -> None:
    click.echo(json_line(obj))


def say(text: object, *, err: bool = False, nl: bool = True) -> None:
    """Print one line that may hold dataset text (notes, prompts, keys, file names, messages
    quoting them): controls are shown escaped, never sent to the terminal (eva.textsafe)."""
    click.echo(printable(text), err=err, nl=nl)


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` (errors from libraries may span several)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def fail(message: str, code: int = EXIT_INVALID) -> NoReturn:
    """One-line error on stderr and a non-zero exit."""
    say(f"eva: error: {first_line(message)}", err=True)
    sys.exit(code)


def _version_message() -> str:
    info = build_info()
    core = info["backend"]
    if core == "broken":
        core = f"broken ({info['error']})"
    elif core == "native":
        core = f"native ({info.get('compiler')}, C++{info.get('cxx_standard')})"
    return f"eva {__version__}, core: {core}"


class _EvaGroup(click.Group):
    """The command group; a filesystem error no command words itself (EACCES, EROFS, ENOSPC,
    ELOOP... while reading or writing a dataset) becomes one line naming the path, exit 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NativeCoreError as e:
            fail(str(e))
        except OSError as e:
            from eva.dataset.fsafe import os_error

            fail(str(os_error(e)))


@click.group(
    cls=_EvaGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
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
        "stale_exports": _stale_exports(root),
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
    say(f"dataset   {summary['dataset']} ({summary['codebase_version']})")
    say(f"episodes  {summary['episodes']}, frames {summary['frames']}, fps {summary['fps']}")
    say(f"cameras   {cameras or '-'}")
    say(f"tasks     {len(summary['tasks'])}: " + "; ".join(map(printable, summary["tasks"])))
    q, v = summary["quality"], summary["qc_verdict"]
    say(f"quality   green {q['green']}, red {q['red']}; qc pass {v['pass']}, fail {v['fail']}")
    for entry in summary["stale_exports"]:
        say(f"stale     {entry['format']} export {entry['export_root']}: {entry['detail']}")


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
            say(str(problem))
        say(
            f"{dataset}: valid" if not problems else f"{dataset}: {len(problems)} problem(s)",
            err=bool(problems),
        )
    if problems:
        sys.exit(EXIT_INVALID)


# [capture commands: collect]

# At most one backlog message per stream (and level) every this many seconds on the terminal;
# the others are counted, and the count rides on the next one shown.
BACKLOG_LOG_INTERVAL_S = 5.0


def _collect_load(config_path: Path, dataset: str | None) -> Any:
    """The CollectionConfig of ``config_path`` (usage errors exit 2)."""
    from eva.config import ConfigError, load_config

    try:
        cfg = load_config(config_path).collection
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    if dataset is not None and dataset not in cfg.tasks:
        fail(f"dataset {dataset!r} is not in collection.tasks of {config_path}", EXIT_USAGE)
    return cfg


def _stream_source(stream: Any, override: str | None) -> tuple[str, str]:
    """``(kind, one-line description)`` of what feeds one camera / vector stream: the
    ``--source`` override, else the stream's ``source`` (None: the simulator)."""
    if override == "sim":
        return "sim", "sim (simulated rig, --source sim)"
    if override is not None:
        return "replay", f"replay of {override.removeprefix('replay:')}"
    source = getattr(stream, "source", None)
    if source is None:
        return "sim", "sim (simulated rig: no source configured)"
    kind = str(getattr(source, "kind", "") or "unknown")
    describe = getattr(source, "describe", None)
    try:
        text = first_line(str(describe())) if callable(describe) else ""
    except Exception as e:  # a screen must not die of a description
        text = f"({type(e).__name__})"
    if not text:
        return kind, kind
    return kind, text if text.split(" ", 1)[0] == kind else f"{kind} ({text})"


def _source_summary(cfg: Any, override: str | None, config_path: Path) -> tuple[str, str]:
    """``(mode, one line)``: what this run records; ``mode`` is sim, replay or configured."""
    from eva.capture.rig import has_sources

    if override == "sim":
        return "sim", "recording the SIMULATOR (--source sim): no device is read"
    if override is not None:
        path = override.removeprefix("replay:")
        return "replay", f"recording a REPLAY of {path} (--source replay): no device is read"
    if not has_sources(cfg):
        return "sim", (
            f"recording the SIMULATOR: no stream in {config_path} has a source "
            "(source = {kind = ...} in a camera or vector table)"
        )
    kinds = [_stream_source(s, None)[0] for s in (*cfg.cameras, *cfg.vectors)]
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    if set(kinds) == {"sim"}:
        return "configured", f"recording the SIMULATOR for every stream (configured: {counts})"
    text = f"recording the configured sources ({counts})"
    if "sim" in kinds:
        text += f"; {kinds.count('sim')} stream(s) from the SIMULATOR"
    return "configured", text


def _collect_streams(cfg: Any, override: str | None) -> dict[str, list[dict[str, Any]]]:
    """Cameras and vector streams with their sources, as ``--list --json`` shows them."""

    def source(stream: Any) -> dict[str, str]:
        kind, text = _stream_source(stream, override)
        return {"kind": kind, "description": text}

    return {
        "cameras": [
            {"key": c.key, "width": c.width, "height": c.height, "source": source(c)}
            for c in cfg.cameras
        ],
        "vectors": [
            {"name": v.name, "dim": v.dim, "discrete": list(v.discrete), "source": source(v)}
            for v in cfg.vectors
        ],
    }


def _collect_header(cfg: Any, override: str | None, config_path: Path) -> list[str]:
    """What is recorded, one line per stream (printed when a run starts)."""
    lines = [_source_summary(cfg, override, config_path)[1]]
    streams = _collect_streams(cfg, override)
    for c in streams["cameras"]:
        lines.append(
            f"  camera {c['key']} {c['width']}x{c['height']}: {c['source']['description']}"
        )
    for v in streams["vectors"]:
        discrete = f" discrete {','.join(map(str, v['discrete']))}" if v["discrete"] else ""
        lines.append(f"  vector {v['name']} dim {v['dim']}{discrete}: {v['source']['description']}")
    return lines


def _collect_list(cfg: Any, override: str | None, config_path: Path, as_json: bool) -> None:
    """``--list``: the streams, their sources and the datasets with their prompts."""
    mode, summary = _source_summary(cfg, override, config_path)
    streams = _collect_streams(cfg, override)
    datasets = [
        {"name": name, "dir": str(cfg.dataset_dir(name)), "prompts": list(prompts)}
        for name, prompts in cfg.tasks.items()
    ]
    if as_json:
        emit_json(
            {
                "config": str(config_path),
                "fps": cfg.fps,
                "log_dir": str(cfg.log_dir),
                "recording": mode,
                "summary": summary,
                "source_override": override,
                **streams,
                "datasets": datasets,
            }
        )
        return
    lines = [f"config {config_path}: {cfg.fps} fps, log_dir {cfg.log_dir}", summary]
    lines.append(f"cameras ({len(streams['cameras'])}):")
    for c in streams["cameras"]:
        lines.append(
            f"  {c['key']}  {c['width']}x{c['height']}  source {c['source']['description']}"
        )
    lines.append(f"vectors ({len(streams['vectors'])}):")
    for v in streams["vectors"]:
        discrete = ",".join(map(str, v["discrete"])) or "-"
        lines.append(
            f"  {v['name']}  dim {v['dim']}  discrete {discrete}  "
            f"source {v['source']['description']}"
        )
    lines.append(f"datasets ({len(datasets)}):")
    for d in datasets:
        lines.append(f"  {d['name']} -> {d['dir']}")
        lines.extend(f"    task {i}: {p}" for i, p in enumerate(d["prompts"], 1))
    for line in lines:
        say(line)


def _collect_setup(cfg: Any, override: str | None, seed: int) -> Any:
    """The recording source (``eva.capture.sources.RecordingSource``): the ``--source``
    override, else the config's sources (a config without any records the in-process
    simulator)."""
    from eva.capture.rig import has_sources
    from eva.capture.sources import SourceSpecError, open_source

    spec = override if override is not None or has_sources(cfg) else "sim"
    try:
        return open_source(cfg, spec, seed=seed)
    except SourceSpecError as e:
        fail(str(e), EXIT_USAGE)
    except (OSError, ValueError) as e:
        fail(f"cannot open the sources: {e}")


def _fit(text: str, width: int) -> str:
    """``text`` cut to fewer than ``width`` terminal columns (the last column is left free, so
    the line never wraps, whatever the terminal does with a line that fills it)."""
    import unicodedata

    room = max(width - 1, 1)
    used = 0
    for i, ch in enumerate(text):
        w = 2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
        if used + w > room:
            return text[:i]
        used += w
    return text


def _terminal_width() -> int:
    """Columns of the terminal, read afresh (a resize takes effect on the next redraw)."""
    import os
    import shutil

    for stream in (sys.stderr, sys.stdout, sys.stdin):
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            continue
        if columns > 0:
            return columns
    return shutil.get_terminal_size().columns or 80


def _collect_status_line(status: dict[str, Any], episode: int | None = None) -> str:
    """The interactive status, most important first (the terminal width cuts its end)."""
    state = "REC" if status["recording"] else "idle"
    head = state if episode is None else f"{state} ep {episode}"
    cameras = list(status["camera_fps"])
    short = {key: key.rsplit(".", 1)[-1] for key in cameras}
    fps = " ".join(f"{short[k]}:{status['camera_fps'][k]:.1f}" for k in cameras) or "-"
    # samples waiting per camera (all streams' when there is no camera); MB over every stream
    waiting = " ".join(f"{short[k]}:{status['backlog'].get(k, 0)}" for k in cameras)
    total = sum(status["backlog"].values())
    return " | ".join(
        [
            head,
            f"{status['elapsed_s']:.1f}s",
            f"fps {fps}",
            f"dropped {status['dropped']}",
            f"backlog {waiting or total} ({status['backlog_mb']:.1f} MB)",
            f"frames {status['frames']}",
            f"saves {status['save_queue']} queued, {status['saved']} saved, "
            f"{status['failed']} failed",
        ]
    )


def _episode_bytes(job: Any) -> int | None:
    """Bytes on disk of a saved episode: its parquet file and its MP4s (0 for a zero-frame
    episode, None for a failed save or files that cannot be read)."""
    if job.state != "saved":
        return None
    if job.episode_index is None:
        return 0
    from eva.dataset.errors import DatasetError
    from eva.dataset.reader import DatasetReader

    try:
        reader = DatasetReader(job.dataset_dir)
        ep = job.episode_index
        paths = [reader.data_path(ep), *(reader.video_path(ep, k) for k in reader.video_keys)]
        return sum(p.stat().st_size for p in paths)
    except (DatasetError, OSError, ValueError):
        return None


def _collect_job_line(job: Any, size: int | None = None) -> str:
    if job.state == "failed":
        return f"episode save failed: {job.error}"
    if job.episode_index is None:
        return "zero-frame episode: nothing written"
    quality = job.quality or "?"
    codes = [i["code"] for i in job.quality_issues]
    if codes:
        quality += f" ({codes[0]}" + (f" +{len(codes) - 1} more" if len(codes) > 1 else "") + ")"
    size = _episode_bytes(job) if size is None else size
    return (
        f"saved episode {job.episode_index}: {job.frames} frames, {quality}"
        + (f", {_human_bytes(size)}" if size is not None else "")
        + f" -> {job.dataset_dir}"
        + (f" ({job.warning})" if getattr(job, "warning", None) else "")
    )


class _LogLimiter:
    """Turns ``eva.capture`` records into one-line messages; backlog messages (``capture
    backlog: stream NAME ...``) are shown at most once per stream and level every ``interval``
    seconds, the suppressed ones counted."""

    def __init__(self, interval: float = BACKLOG_LOG_INTERVAL_S, clock: Any = None) -> None:
        import re
        import time

        self.interval = interval
        self.clock = clock or time.monotonic
        self._pattern = re.compile(r"capture backlog: stream (\S+)")
        self._shown: dict[tuple[str, int], float] = {}
        self._suppressed: dict[tuple[str, int], int] = {}
        import threading

        self._lock = threading.Lock()

    def admit(self, record: Any) -> str | None:
        """The line to show for ``record``, or None when it is suppressed."""
        text = " ".join(part.strip() for part in record.getMessage().splitlines() if part.strip())
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text += f": {first_line(str(exc)) or type(exc).__name__}"
        line = f"eva: {record.levelname.lower()}: {text}"
        match = self._pattern.match(text)
        if match is None:
            return line
        key = (match.group(1), record.levelno)
        with self._lock:
            now = self.clock()
            last = self._shown.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            self._shown[key] = now
            count = self._suppressed.pop(key, 0)
        return line + (f" ({count} similar suppressed)" if count else "")

    def leftovers(self) -> list[str]:
        """Counts of suppressed messages no later message reported (end of the session)."""
        import logging

        with self._lock:
            items = sorted(self._suppressed.items())
            self._suppressed.clear()
        return [
            f"eva: {logging.getLevelName(level).lower()}: capture backlog: stream {name}: "
            f"{count} more message(s) suppressed"
            for (name, level), count in items
        ]


def _capture_log_handler_class() -> type:
    """The ``_CaptureLogHandler`` class, built on first use: ``logging`` is not imported for
    ``eva --help`` or any command that does not capture (it costs ~5-15 ms of start-up)."""
    cls = globals().get("_CaptureLogHandler")
    if cls is not None:
        return cls
    import logging

    class _CaptureLogHandler(logging.Handler):
        """``eva.capture`` records on stderr, one line each (see :class:`_LogLimiter`); while the
        interactive screen runs they wait in ``queue`` so the screen prints them above its status
        line."""

        def __init__(self, limiter: _LogLimiter, level: int) -> None:
            import queue

            super().__init__(level)
            self.limiter = limiter
            self.queue: queue.SimpleQueue[str] = queue.SimpleQueue()
            self.held = False

        def emit(self, record: logging.LogRecord) -> None:
            try:
                line = self.limiter.admit(record)
                if line is None:
                    return
                if self.held:
                    self.queue.put(line)
                else:
                    sys.stderr.write(printable(line) + "\n")
                    sys.stderr.flush()
            except Exception:
                self.handleError(record)

        def pending(self) -> list[str]:
            import queue

            lines = []
            while True:
                try:
                    lines.append(self.queue.get_nowait())
                except queue.Empty:
                    return lines

        def resume(self) -> None:
            """Back to writing straight to stderr, after what was held."""
            self.held = False
            for line in self.pending() + self.limiter.leftovers():
                sys.stderr.write(printable(line) + "\n")
            sys.stderr.flush()

    globals()["_CaptureLogHandler"] = _CaptureLogHandler
    return _CaptureLogHandler


def __getattr__(name: str) -> Any:
    if name == "_CaptureLogHandler":
        return _capture_log_handler_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _JobReporter:
    """Prints each save job's result once, in STOP order, as soon as it has finished."""

    def __init__(self, as_json: bool = False, interactive: bool = False) -> None:
        self.as_json = as_json
        self.interactive = interactive
        self.reported = 0

    def new(self, jobs: list[Any]) -> list[Any]:
        """Finished jobs not reported yet (stops at the first unfinished one: order is kept)."""
        out = []
        while self.reported < len(jobs) and jobs[self.reported].finished:
            out.append(jobs[self.reported])
            self.reported += 1
        return out

    def line(self, job: Any) -> str:
        size = _episode_bytes(job)
        if self.as_json:
            return json.dumps({**job.as_dict(), "bytes": size}, ensure_ascii=False, default=str)
        return _collect_job_line(job, size)

    def flush(self, jobs: list[Any]) -> None:
        for job in self.new(jobs):
            to_stderr = self.interactive or (job.state == "failed" and not self.as_json)
            say(self.line(job), err=to_stderr)


class _EpisodeNumbers:
    """The index the next (or the recording) episode of a dataset gets: the dataset's next free
    index, plus the episodes still being saved (a zero-frame episode takes none: then it is one
    too high until that save ends)."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.on_disk: dict[Path, int] = {}

    def next_index(self, root: Path) -> int:
        base = self.on_disk.get(root)
        if base is None:
            base = self.on_disk[root] = self._read(root)
        jobs = [j for j in list(self.recorder.jobs) if Path(j.dataset_dir) == root]
        saved = [j.episode_index for j in jobs if j.episode_index is not None]
        if saved:
            base = max(base, max(saved) + 1)
        return base + sum(1 for j in jobs if not j.finished)

    @staticmethod
    def _read(root: Path) -> int:
        from eva.dataset import layout
        from eva.dataset.reader import DatasetReader

        if not (root / layout.EPISODES).is_file():
            return 0
        try:
            return max(DatasetReader(root).episode_indices, default=-1) + 1
        except Exception:  # a broken dataset: START says why
            return 0


class _StatusScreen:
    """Message lines above one status line, redrawn in place and cut to the terminal width."""

    def __init__(self) -> None:
        self.drawn = False

    def say(self, text: str) -> None:
        sys.stderr.write(("\r\033[K" if self.drawn else "") + printable(text) + "\n")
        sys.stderr.flush()
        self.drawn = False

    def draw(self, line: str) -> None:
        sys.stderr.write("\r\033[K" + _fit(printable(line), _terminal_width()))
        sys.stderr.flush()
        self.drawn = True

    def end(self) -> None:
        """Leave the last status on screen and move below it."""
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.drawn = False


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
    "--reset-seconds",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Scripted: pause between episodes to reset the scene (nothing is recorded).",
)
@click.option(
    "--source",
    default=None,
    help="Override the config's sources: sim | replay:PATH (a v2.1 dataset). Default: each "
    "stream's configured source (the simulator for streams without one).",
)
@click.option(
    "--dataset", default=None, help="Dataset name from collection.tasks (default: first)."
)
@click.option("--task", default=None, help="Task prompt (default: the dataset's first prompt).")
@click.option("--seed", type=int, default=0, help="Seed of the simulated rig.")
@click.option(
    "--list",
    "list_only",
    is_flag=True,
    help="Print the cameras, vector streams (with their sources) and datasets, then exit.",
)
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Start the sources, check that every stream delivers a first sample (within its "
    "open_timeout_s), then exit: 0 if all did, 2 otherwise.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Scripted: one JSON object per saved episode; with --list: one JSON object.",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Scripted: print only the per-episode result lines (and errors).",
)
def collect_command(
    config: Path,
    episodes: int | None,
    seconds: float,
    reset_seconds: float,
    source: str | None,
    dataset: str | None,
    task: str | None,
    seed: int,
    list_only: bool,
    check_only: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Record episodes into <log_dir>/<dataset>/raw (LeRobot v2.1).

    \b
    Interactive (a terminal): s START, e STOP, c CANCEL, q quit, d / t next dataset / task
    prompt; Ctrl-C cancels a running episode and quits. The status line shows the episode
    number, elapsed time, per-camera fps and backlog. Scripted: --episodes N --seconds S
    [--reset-seconds R]; each episode's result is printed as soon as it is saved.
    Episodes append to an existing dataset; every saved episode is green or red with its
    quality issues (see docs/capture.md). The screen names each stream's source: the
    simulator unless the config gives a stream a source (or --source overrides them all).
    \b
    Examples:
      eva collect rig.toml --list
      eva collect rig.toml --check
      eva collect rig.toml
      eva collect rig.toml --episodes 3 --seconds 20 --reset-seconds 5
      eva collect rig.toml --episodes 1 --seconds 5 --source replay:/data/eva/old/raw
    """
    import os

    from eva.capture.recorder import (
        Recorder,
        RecorderError,
        pin_mmap_threshold,
        shorten_switch_interval,
    )

    cfg = _collect_load(config, dataset)
    if list_only:
        if source is not None and source != "sim":  # the replayed dataset's streams
            from eva.capture.sources import SourceSpecError, source_from_spec

            try:
                cfg, _, _ = source_from_spec(cfg, source, seed=seed)
            except SourceSpecError as e:
                fail(str(e), EXIT_USAGE)
        _collect_list(cfg, source, config, as_json)
        return
    interactive = episodes is None and not check_only
    if interactive and (quiet or reset_seconds):
        fail("--quiet and --reset-seconds are for scripted runs (--episodes N)", EXIT_USAGE)
    if interactive and not sys.stdin.isatty():  # before any source process starts
        fail(
            "interactive collect needs a terminal; script it with --episodes N --seconds S",
            EXIT_USAGE,
        )
    rec_source = _collect_setup(cfg, source, seed)
    cfg = rec_source.config
    if not quiet:
        if rec_source.note:
            say(f"eva: note: {rec_source.note}", err=True)
        for line in _collect_header(cfg, source, config):
            say(line, err=True)
    if os.environ.get("EVA_CAPTURE_MALLOC", "pin") != "keep":
        pin_mmap_threshold()  # flat RSS over long sessions (see pin_mmap_threshold)
    shorten_switch_interval()  # capture threads keep up beside busy Python threads
    import logging

    handler = _capture_log_handler_class()(_LogLimiter(), logging.ERROR if quiet else logging.INFO)
    capture_log = logging.getLogger("eva.capture")
    capture_log.addHandler(handler)
    capture_log.setLevel(logging.INFO)
    try:
        recorder = Recorder(cfg, dataset, rings=rec_source.rings)
    except Exception as e:
        rec_source.close()
        fail(str(e) or type(e).__name__)
    reporter = _JobReporter(as_json and episodes is not None, interactive=interactive)

    def shut_down() -> None:
        recorder.wait_idle()
        rec_source.close()
        recorder.close()
        handler.resume()

    try:
        rec_source.start(recorder)
    except Exception as e:
        shut_down()
        fail(f"cannot start the sources: {first_line(str(e)) or type(e).__name__}")
    # Every stream delivers a first sample (at once for an in-process source).
    if not quiet and rec_source.rings is not None:
        click.echo("checking the sources: waiting for every stream's first sample", err=True)
    try:
        problems = rec_source.check()
    except KeyboardInterrupt:
        shut_down()
        sys.exit(130)
    if problems:
        shut_down()
        for line in problems:
            say(f"eva: error: {line}", err=True)
        sys.exit(EXIT_USAGE)
    if check_only:
        shut_down()
        n = len(cfg.cameras) + len(cfg.vectors)
        click.echo(f"check: ok, every stream delivered a sample ({n} streams)")
        return
    try:
        if episodes is not None:
            _collect_scripted(
                recorder, rec_source, reporter, episodes, seconds, reset_seconds,
                dataset, task, quiet,
            )  # fmt: skip
        else:
            _collect_interactive(recorder, rec_source, reporter, handler, dataset, task)
    except RecorderError as e:
        shut_down()
        reporter.flush(recorder.jobs)
        fail(str(e))
    except KeyboardInterrupt:
        if recorder.recording:
            recorder.cancel()
            click.echo("interrupted: episode cancelled", err=True)
        shut_down()
        reporter.flush(recorder.jobs)
        sys.exit(130)
    except BaseException:  # no source process outlives eva, whatever went wrong
        with contextlib.suppress(Exception):
            shut_down()
        raise
    shut_down()
    reporter.flush(recorder.jobs)
    if rec_source.error is not None:
        fail(f"source stopped: {rec_source.error}")
    if any(j.state == "failed" for j in recorder.jobs):
        sys.exit(EXIT_INVALID)


def _collect_scripted(
    recorder: Any,
    rec_source: Any,
    reporter: _JobReporter,
    episodes: int,
    seconds: float,
    reset_seconds: float,
    dataset: str | None,
    task: str | None,
    quiet: bool,
) -> None:
    """Record ``episodes`` episodes of ``seconds``, a reset pause between them; each result is
    printed as soon as its save has finished (while the next episode records)."""
    import time

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not rec_source.finished.is_set():
            reporter.flush(recorder.jobs)
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))

    def announce(text: str) -> None:
        if not quiet:
            say(text, err=True)

    for n in range(1, episodes + 1):
        if n > 1 and reset_seconds > 0:
            announce(f"reset: {reset_seconds:g} s to reset the scene before episode {n}/{episodes}")
            wait(reset_seconds)
            if rec_source.finished.is_set():
                break
        for message in rec_source.before_start():  # stopped source processes: restarted
            announce(f"eva: note: {message}")
        announce(f"episode {n}/{episodes}: recording {seconds:g} s")
        recorder.start(dataset, task)
        wait(seconds)
        recorder.stop()
        if rec_source.finished.is_set():
            announce(f"source ended after {n} of {episodes} episodes")
            break
    while not recorder.wait_idle(0.05):
        reporter.flush(recorder.jobs)
    reporter.flush(recorder.jobs)


def _collect_interactive(
    recorder: Any,
    rec_source: Any,
    reporter: _JobReporter,
    handler: Any,  # a _CaptureLogHandler (built lazily: see _capture_log_handler_class)
    dataset: str | None,
    task: str | None,
) -> None:
    import os
    import select
    import termios
    import time
    import tty

    from eva.capture.recorder import RecorderError

    datasets = list(recorder.config.tasks)
    name = dataset if dataset is not None else recorder.default_dataset
    prompt = task or recorder.config.tasks[name][0]
    numbers = _EpisodeNumbers(recorder)
    screen = _StatusScreen()

    def announce_dataset() -> None:
        root = recorder.dataset_dir(name)
        screen.say(f"dataset {name} -> {root} (next episode {numbers.next_index(root)})")

    def handle(key: str) -> bool:
        """One key; True to quit."""
        nonlocal name, prompt
        try:
            if key in ("d", "t") and recorder.recording:
                screen.say("STOP or CANCEL before changing the dataset or task")
            elif key == "d":
                name = datasets[(datasets.index(name) + 1) % len(datasets)]
                prompt = recorder.config.tasks[name][0]
                announce_dataset()
                screen.say(f"task: {prompt}")
            elif key == "t":
                prompts = recorder.config.tasks[name]
                position = prompts.index(prompt) if prompt in prompts else -1
                prompt = prompts[(position + 1) % len(prompts)]
                screen.say(f"task: {prompt}")
            elif key == "s":
                for message in rec_source.before_start():  # stopped source processes: restarted
                    screen.say(f"eva: note: {message}")
                recorder.start(name, prompt)
            elif key == "e":
                recorder.stop()
            elif key == "c":
                recorder.cancel()
                screen.say("episode cancelled")
            elif key == "q":
                if not recorder.recording:
                    return True
                screen.say("STOP (e) or CANCEL (c) the episode before quitting")
        except RecorderError as e:
            screen.say(str(e))
        return False

    fd = sys.stdin.fileno()
    saved_mode = termios.tcgetattr(fd)
    tty.setcbreak(fd)  # before the banner: keys typed right after it must not sit in a line buffer
    handler.held = True  # log lines go above the status line, never into it
    try:
        announce_dataset()
        screen.say(f"task: {prompt}")
        screen.say(
            "keys: s START  e STOP  c CANCEL  q quit  d next dataset  t next task  "
            "(Ctrl-C cancels and quits)"
        )
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], 0.25)
            # Every key typed since the last turn (a buffered read(1) would hide the rest from
            # select until the next key arrives).
            data = os.read(fd, 64) if ready else b"-"
            if not data:  # the terminal is gone: as Ctrl-C (cancel a recording, exit 130)
                raise KeyboardInterrupt
            keys = data.decode(errors="ignore").lower() if ready else ""
            if any(handle(key) for key in keys):
                break
            for line in handler.pending():
                screen.say(line)
            for job in reporter.new(recorder.jobs):
                screen.say(reporter.line(job))
            episode = numbers.next_index(recorder.dataset_dir(name))
            screen.draw(_collect_status_line(recorder.status(), episode))
            if rec_source.finished.is_set():
                screen.say("source ended")
                break
            time.sleep(0)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved_mode)
        screen.end()
        handler.resume()
    recorder.wait_idle()
    reporter.flush(recorder.jobs)


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
    if note is not None:
        try:
            note.encode("utf-8")
        except UnicodeEncodeError:  # bytes the locale could not decode (surrogateescape)
            fail("qc: --note: not valid UTF-8", EXIT_USAGE)
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
                say(_qc_list_line(entry))
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
    stale = _stale_exports(dataset) if update.changed else []
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
            f"episode {episode}: verdict {row.get('qc_verdict') or '-'}, "
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


def _human_bytes(n: float) -> str:
    """Decimal units, as progress lines show them: ``512 B``, ``3.0 MB``."""
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def _generated_option(
    cls: type[Options], spec: OptionField, label: str | None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """One ``eva export`` option made from an options dataclass field (name, type, default,
    help, choices); its value is checked by the dataclass as soon as it is parsed, so a bad
    one is refused before a job starts (a failed job would block uploads)."""

    def check(_ctx: click.Context, _param: click.Parameter, value: object) -> object:
        try:
            cls(**{spec.field_name: value})
        except OptionError as e:
            raise click.BadParameter(e.reason) from None
        return value

    help_text = f"{label}: {spec.info.help}" if label else spec.info.help
    kind: click.ParamType | type | None
    minimum, min_open = spec.info.minimum, spec.info.minimum_open
    if spec.type == "bool":
        return click.option(
            spec.flag, spec.name, is_flag=True, default=spec.default, help=help_text, callback=check
        )
    if spec.type == "choice":
        kind = click.Choice(list(spec.info.choices))
    elif spec.type == "int":
        kind = click.IntRange(min=minimum, min_open=min_open) if minimum is not None else int
    elif spec.type == "float":
        kind = click.FloatRange(min=minimum, min_open=min_open) if minimum is not None else float
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
    """Every format's options (``eva.formats.options``), then the ones all formats take."""
    generated = [
        _generated_option(cls, spec, fmt)
        for fmt, cls in FORMAT_OPTION_CLASSES.items()
        for spec in cls.option_fields()
    ]
    generated += [
        _generated_option(ExportOptions, spec, None) for spec in ExportOptions.option_fields()
    ]
    for decorate in reversed(generated):
        command = decorate(command)
    return command


def _export_options(fmt: str, values: dict[str, Any]) -> ExportOptions:
    """The typed options of an ``eva export`` of ``fmt`` from the generated options' values
    (another format's options are not used)."""
    format_cls = FORMAT_OPTION_CLASSES[fmt]
    own = {spec.field_name: values[spec.name] for spec in format_cls.option_fields()}
    common = {spec.field_name: values[spec.name] for spec in ExportOptions.option_fields()}
    return ExportOptions(**common, format=format_cls(**own))


@main.command("export")
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    required=True,
    help="lerobot_v21, lerobot_v3, hdf5 or mcap (aliases: v21, v3, h5).",
)
@_format_options
@click.option(
    "--json", "as_json", is_flag=True, help="JSON progress lines (default when not a terminal)."
)
def export_command(dataset: Path, fmt: str, as_json: bool, **option_values: Any) -> None:
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
            options=_export_options(fmt, option_values),
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
        say(f"recovered: {line}")
    say(
        f"accepted: {summary['accepted_dir']} ({summary['accepted_episodes']} episodes, "
        f"{summary['accepted_frames']} frames)"
    )
    say(
        f"rejected: {summary['rejected_dir']} ({summary['rejected_episodes']} episodes, "
        f"{summary['rejected_frames']} frames)"
    )


@main.command("verify")
@click.argument("export_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--source", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Source dataset to compare with (default: the one the export's place derives, "
              "if it exists; a moved copy is checked on its own).")  # fmt: skip
@click.option("--format", "fmt", default=None, help="Expected format (default: from the path).")
@click.option(
    "--full",
    is_flag=True,
    help="Decode every frame of every MP4 (default: sampled keyframes of every MP4 and every "
    "frame of one random MP4 per camera).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per problem, then a summary."
)
def verify_command(
    export_dir: Path, source: Path | None, fmt: str | None, full: bool, as_json: bool
) -> None:
    """Verify an exported accepted/rejected directory: marker, totals and a real read.

    By default every MP4 has a few keyframes decoded and one random MP4 per camera is decoded
    whole: that proves the files are MP4s whose sampled frames decode, not that every frame of
    every file does (damage between keyframes of an unsampled file passes); --full decodes all.

    A copy moved or renamed away from <parent>/export/<fmt>/ is checked on its own (marker,
    totals, a real read); --source also compares it with that dataset's current review.

    \b
    Example:
      eva verify data/pick/export/lerobot_v21/accepted
      eva verify /archive/pick-2026-01 --source data/pick/raw
    """
    from eva.dataset.errors import DatasetError
    from eva.export.pipeline import problem_line
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
            say(f"{name}: {line}")
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
    "--source",
    default=None,
    help="Override the config's sources: sim | replay:PATH (a v2.1 dataset).",
)
@click.option("--seed", type=int, default=0, help="Seed of the simulated rig.")
@click.option("--known-hosts", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="known_hosts for uploads (default: storage.sftp.known_hosts).")  # fmt: skip
def console_command(
    config: Path,
    host: str,
    port: int,
    token_file: Path | None,
    source: str | None,
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

    from eva.capture.recorder import pin_mmap_threshold, shorten_switch_interval
    from eva.capture.sources import SourceSpecError

    try:
        from eva.console.server import default_token_file, new_token, serve, write_token_file
        from eva.console.session import ConsoleError, ConsoleSession
    except NativeCoreError as e:
        fail(str(e))
    except ImportError as e:
        fail(f"eva console needs the console extra (pip install 'eva[console]'): {e}", EXIT_USAGE)
    if os.environ.get("EVA_CAPTURE_MALLOC", "pin") != "keep":
        pin_mmap_threshold()  # flat RSS over long sessions (see pin_mmap_threshold)
    shorten_switch_interval()  # capture threads keep up beside busy Python threads
    import logging

    # Capture warnings (backlog, recovered leftovers, a stalled source) reach the page through
    # the session and the server's stderr through this handler, one line each.
    capture_log = logging.getLogger("eva.capture")
    capture_log.addHandler(_capture_log_handler_class()(_LogLimiter(), logging.WARNING))
    capture_log.setLevel(logging.INFO)
    try:
        session = ConsoleSession(config, source=source, seed=seed, sftp_known_hosts=known_hosts)
    except (ConsoleError, SourceSpecError) as e:
        fail(str(e), EXIT_USAGE)
    except Exception as e:  # noqa: BLE001 - a recorder that cannot start: one line
        fail(f"console: {first_line(str(e)) or type(e).__name__}")
    problems = session.source.check()  # every configured source delivers a first sample
    if problems:
        session.close()
        for line in problems:
            say(f"eva: error: {line}", err=True)
        sys.exit(EXIT_USAGE)
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
        say(f"eva: note: {session.source_note}", err=True)

    def ready(url: str) -> None:
        for stream, text in session.source.streams.items():
            say(f"eva console: {stream}: {text}", err=True)
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
                click.echo("\r" + printable(line) + "\x1b[K", nl=False, err=True)
    except KeyboardInterrupt:
        job.cancel()
        job.wait()
    if interactive:
        line = _upload_progress_line(job.record.progress, time.monotonic() - started)
        click.echo("\r" + printable(line) + "\x1b[K", err=True)

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
    say(
        f"uploaded {job.result.files} files ({_human_bytes(job.result.bytes)}) to "
        f"{sftp_config.host if sftp_config else ''}:{job.result.remote_path}{note}{skipped}"
    )


if __name__ == "__main__":
    main()
