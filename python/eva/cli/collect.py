"""``eva collect``: record episodes from the configured rig, scripted or interactive."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from eva.cli.collect_interactive import collect_interactive
from eva.cli.collect_list import collect_header, print_list
from eva.cli.collect_screen import CaptureLogHandler, EpisodeNumbers, JobReporter, LogLimiter
from eva.cli.output import (
    EXIT_INVALID,
    EXIT_USAGE,
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


def _refuse_a_held_dataset(cfg: Any, dataset: str | None) -> None:
    """Refuse a dataset another eva collect or eva console records into before any source
    starts or the run announces it (else the refusal came at its first START, after the
    header and the sources' checks)."""
    from eva.dataset import layout
    from eva.dataset.locks import is_flocked

    root = cfg.dataset_dir(dataset if dataset is not None else next(iter(cfg.tasks)))
    try:
        held = is_flocked(root / layout.WORK_DIR / layout.WRITER_LOCK)
    except OSError:  # a tree the writer refuses: it says why when it opens it
        return
    if held:
        fail(
            f"{root}: another writer has this dataset open (eva collect or eva console is "
            "recording into it); stop it, or collect into another dataset (--dataset)"
        )


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
    cfg = _collect_load(config, dataset)
    if list_only:
        if source is not None and source != "sim":  # the replayed dataset's streams
            from eva.capture.sources import SourceSpecError, source_from_spec

            try:
                cfg, _, _ = source_from_spec(cfg, source, seed=seed)
            except SourceSpecError as e:
                fail(str(e), EXIT_USAGE)
        print_list(cfg, source, config, as_json)
        return
    run = RunOptions(episodes, seconds, reset_seconds, dataset, task, quiet, check_only, as_json)
    if run.interactive and (quiet or reset_seconds):
        fail("--quiet and --reset-seconds are for scripted runs (--episodes N)", EXIT_USAGE)
    if run.interactive and not sys.stdin.isatty():  # before any source process starts
        fail(
            "interactive collect needs a terminal; script it with --episodes N --seconds S",
            EXIT_USAGE,
        )
    _refuse_a_held_dataset(cfg, dataset)  # --check too: its recorder recovers the dataset
    rec_source = _collect_setup(cfg, source, seed)
    if not quiet:
        if rec_source.note:
            say(f"eva: note: {rec_source.note}", err=True)
        for line in collect_header(rec_source.config, source, config):
            say(line, err=True)
    _record(rec_source, run)


@dataclass(frozen=True)
class RunOptions:
    """What the command line asks of a run that starts the sources (all but ``--list``)."""

    episodes: int | None
    seconds: float
    reset_seconds: float
    dataset: str | None
    task: str | None
    quiet: bool
    check_only: bool
    as_json: bool

    @property
    def interactive(self) -> bool:
        return self.episodes is None and not self.check_only


def _capture_log_handler(quiet: bool) -> CaptureLogHandler:
    """This process set up for capture; its ``eva.capture`` log lines go to the terminal."""
    import logging
    import os

    from eva.capture.recorder import pin_mmap_threshold, shorten_switch_interval
    from eva.libc import raise_open_file_limit

    if os.environ.get("EVA_CAPTURE_MALLOC", "pin") != "keep":
        pin_mmap_threshold()  # flat RSS over long sessions (see pin_mmap_threshold)
    shorten_switch_interval()  # capture threads keep up beside busy Python threads
    raise_open_file_limit()  # saving an episode never runs out of descriptors
    handler = CaptureLogHandler(LogLimiter(), logging.ERROR if quiet else logging.INFO)
    capture_log = logging.getLogger("eva.capture")
    capture_log.addHandler(handler)
    capture_log.setLevel(logging.INFO)
    return handler


def _open_recorder(rec_source: Any, dataset: str | None) -> Any:
    """The recorder of the run, with the episodes a crash cut short recovered (the capture log
    reports them); on failure the sources are closed and the command fails."""
    from eva.capture.recorder import Recorder, RecorderError

    try:
        recorder = Recorder(rec_source.config, dataset, rings=rec_source.rings)
    except Exception as e:
        rec_source.close()
        fail(str(e) or type(e).__name__)
    try:
        recorder.recover_datasets()
    except RecorderError as e:
        recorder.close()
        rec_source.close()
        fail(str(e))
    return recorder


def _start_sources(
    recorder: Any, rec_source: Any, handler: CaptureLogHandler, quiet: bool, shut_down: Any
) -> None:
    """Start the sources; every stream must deliver a first sample (at once for an in-process
    source), else the run ends (exit 2, one line per stream, naming it and its own source: the
    capture log's lines of the same failures, held during the check, are left out)."""
    try:
        rec_source.start(recorder)
    except Exception as e:
        shut_down()
        fail(f"cannot start the sources: {first_line(str(e)) or type(e).__name__}")
    if not quiet and rec_source.rings is not None:
        click.echo("checking the sources: waiting for every stream's first sample", err=True)
    handler.held = True
    try:
        problems = rec_source.check()
    except KeyboardInterrupt:
        shut_down()
        sys.exit(130)
    if problems:
        handler.pending()  # the failures the problem lines say once each
        shut_down()
        for line in problems:
            say(f"eva: error: {line}", err=True)
        sys.exit(EXIT_USAGE)
    handler.resume()


def _record(rec_source: Any, run: RunOptions) -> None:
    """Start the sources and record what ``run`` asks (or only check the sources); no source
    process outlives it."""
    from eva.capture.recorder import RecorderError

    cfg = rec_source.config
    handler = _capture_log_handler(run.quiet)
    recorder = _open_recorder(rec_source, run.dataset)
    reporter = JobReporter(run.as_json and run.episodes is not None, interactive=run.interactive)

    def shut_down() -> None:
        recorder.wait_idle()
        rec_source.close()
        recorder.close()
        handler.resume()

    _start_sources(recorder, rec_source, handler, run.quiet, shut_down)
    if run.check_only:
        shut_down()
        n = len(cfg.cameras) + len(cfg.vectors)
        click.echo(f"check: ok, every stream delivered a sample ({n} streams)")
        return
    try:
        if run.episodes is not None:
            _collect_scripted(recorder, rec_source, reporter, run)
        else:
            collect_interactive(recorder, rec_source, reporter, handler, run.dataset, run.task)
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
    recorder: Any, rec_source: Any, reporter: JobReporter, run: RunOptions
) -> None:
    """Record ``run.episodes`` episodes of ``run.seconds``, a reset pause between them; each
    result is printed as soon as its save has finished (while the next episode records)."""
    import time

    assert run.episodes is not None
    episodes, seconds, reset_seconds = run.episodes, run.seconds, run.reset_seconds

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not rec_source.finished.is_set():
            reporter.flush(recorder.jobs)
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))

    def announce(text: str) -> None:
        if not run.quiet:
            say(text, err=True)

    # Episodes are named by the index they get in the dataset, as their saved lines name them
    # ("saved episode 3"), never by a count from 1; "(2 of 5)" counts this run's episodes.
    numbers = EpisodeNumbers(recorder)
    root = recorder.dataset_dir(run.dataset)
    for n in range(1, episodes + 1):
        if n > 1 and reset_seconds > 0:
            index = numbers.next_index(root)
            announce(f"reset: {reset_seconds:g} s to reset the scene before episode {index}")
            wait(reset_seconds)
            if rec_source.finished.is_set():
                break
        for message in rec_source.before_start():  # stopped source processes: restarted
            announce(f"eva: note: {message}")
        index = numbers.next_index(root)
        announce(f"episode {index}: recording {seconds:g} s ({n} of {episodes})")
        recorder.start(run.dataset, run.task)
        wait(seconds)
        recorder.stop()
        if rec_source.finished.is_set():
            announce(f"source ended after {n} of {episodes} episodes")
            break
    while not recorder.wait_idle(0.05):
        reporter.flush(recorder.jobs)
    reporter.flush(recorder.jobs)
