"""``eva collect``: record episodes from the configured rig, scripted or interactive."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import click

from eva.cli.collect_screen import (
    CaptureLogHandler,
    EpisodeNumbers,
    JobReporter,
    LogLimiter,
    StatusScreen,
    collect_status_line,
)
from eva.cli.output import (
    EXIT_INVALID,
    EXIT_USAGE,
    emit_json,
    fail,
    first_line,
    say,
    typed_text,
    verbosity_options,
)
from eva.config_table import MAX_DURATION_S

# The simulated rig's seeds (numpy takes non-negative integers; 32 bits are plenty for a rig).
MAX_SEED = 2**32 - 1
# Episodes of one scripted run (a million: years of recording; more is a typing mistake).
MAX_EPISODES = 1_000_000


def _collect_load(config_path: Path, dataset: str | None) -> Any:
    """The CollectionConfig of ``config_path`` (usage errors exit 2), its rings checked to fit
    this machine."""
    from eva.config import ConfigError, load_config, ring_memory_problem

    try:
        cfg = load_config(config_path).collection
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    problem = ring_memory_problem(cfg)
    if problem is not None:
        fail(f"{config_path}: {problem}", EXIT_USAGE)
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


@click.command("collect")
@verbosity_options(quiet=False)
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--episodes",
    type=click.IntRange(min=1, max=MAX_EPISODES),
    default=None,
    help="Scripted: record N episodes back to back, then exit.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.0, max=MAX_DURATION_S),
    default=10.0,
    show_default=True,
    help="Scripted: length of each episode.",
)
@click.option(
    "--reset-seconds",
    type=click.FloatRange(min=0.0, max=MAX_DURATION_S),
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
    "--dataset",
    default=None,
    callback=typed_text,
    help="Dataset name from collection.tasks (default: first).",
)
@click.option(
    "--task",
    default=None,
    callback=typed_text,
    help="Task prompt (default: the dataset's first prompt).",
)
@click.option(
    "--seed", type=click.IntRange(0, MAX_SEED), default=0, help="Seed of the simulated rig."
)
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
    Examples (without --episodes, on a terminal, it runs the interactive screen):
      eva collect demo-data/collect.toml --list
      eva collect demo-data/collect.toml --check
      eva collect demo-data/collect.toml --episodes 2 --seconds 1 --reset-seconds 0.5
      eva collect demo-data/collect.toml --episodes 1 --seconds 1 --source replay:demo-data/logs/pick_cube/raw
    """
    import os

    from eva.capture.recorder import (
        Recorder,
        RecorderError,
        pin_mmap_threshold,
        shorten_switch_interval,
    )
    from eva.libc import raise_open_file_limit

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
    raise_open_file_limit()  # saving an episode never runs out of descriptors
    import logging

    handler = CaptureLogHandler(LogLimiter(), logging.ERROR if quiet else logging.INFO)
    capture_log = logging.getLogger("eva.capture")
    capture_log.addHandler(handler)
    capture_log.setLevel(logging.INFO)
    try:
        recorder = Recorder(cfg, dataset, rings=rec_source.rings)
    except Exception as e:
        rec_source.close()
        fail(str(e) or type(e).__name__)
    reporter = JobReporter(as_json and episodes is not None, interactive=interactive)
    try:  # episodes a crash cut short become episodes again (the capture log reports them)
        recorder.recover_datasets()
    except RecorderError as e:
        recorder.close()
        rec_source.close()
        fail(str(e))

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
    reporter: JobReporter,
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
    reporter: JobReporter,
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
    numbers = EpisodeNumbers(recorder)
    screen = StatusScreen()

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
            screen.draw(collect_status_line(recorder.status(), episode))
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
