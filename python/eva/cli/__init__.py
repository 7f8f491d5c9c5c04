"""The ``eva`` command line: the only package that talks to terminals.

One module per command group; a command's module is imported only when that command runs (or
its help is asked for), so ``eva --help`` and ``eva <cmd> --help`` load no media or table
library. Exit codes, the same for every command: 0 ok, 1 the work failed or the data is invalid,
2 usage or configuration errors, 130 interrupted (after one line saying what was kept).
"""

from __future__ import annotations

import os

# Before NumPy is imported: its OpenBLAS starts a thread per core at import, which busy-wait as
# they start (about 0.1 CPU-s; a v3 export's median CPU fell 0.14 s without them, on 2 cores where
# the video checks' decode threads need both). eva makes no BLAS call. A value set by the user wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import importlib
import signal
import sys
import threading
from typing import Any

import click

from eva import __version__
from eva._native import NativeCoreError, build_info
from eva.cli.output import EXIT_INTERRUPTED, EXIT_USAGE, fail, say, usage_line

# name -> (module, command object, summary), in workflow order: the order `eva --help` lists
# them. The summary is what the top-level help shows without importing the command's module;
# tests check that it equals the first line of the command's own help.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "collect": (
        "eva.cli.collect",
        "collect_command",
        "Record episodes into <log_dir>/<dataset>/raw (LeRobot v2.1).",
    ),
    "qc": (
        "eva.cli.dataset_commands",
        "qc_command",
        "Review episodes: set a verdict and/or note, or --list the review and resulting split.",
    ),
    "edit": (
        "eva.cli.edit_command",
        "edit_command",
        "Edit episodes for export: trim, replace the task, drop; the recording is never touched.",
    ),
    "export": (
        "eva.cli.export_commands",
        "export_command",
        "Split DATASET into accepted/rejected and export both as FMT, published as a pair.",
    ),
    "verify": (
        "eva.cli.export_commands",
        "verify_command",
        "Verify an exported accepted/rejected directory: marker, totals and a real read.",
    ),
    "upload": (
        "eva.cli.upload_command",
        "upload_command",
        "Upload the current accepted export of DATASET over SFTP.",
    ),
    "merge": (
        "eva.cli.merge_command",
        "merge_command",
        "Merge raw SESSIONS of one rig into a new raw dataset; the sessions are never changed.",
    ),
    "info": (
        "eva.cli.dataset_commands",
        "info_command",
        "Summarise a dataset or an export: format, episodes, frames, cameras, size, review.",
    ),
    "validate": (
        "eva.cli.dataset_commands",
        "validate_command",
        "Check a LeRobot v2.1 DATASET; report every problem. Exit 0 valid, 1 invalid, 2 usage.",
    ),
    "cleanup": (
        "eva.cli.dataset_commands",
        "cleanup_command",
        "Finish or undo interrupted exports of DATASET and remove hidden staging/backup dirs.",
    ),
    "recover": (
        "eva.cli.recover_command",
        "recover_command",
        "Recover episodes a crash cut short in DATASET (a raw v2.1 dataset being recorded).",
    ),
    "console": (
        "eva.cli.console_command",
        "console_command",
        "Serve the operator console: COLLECT, QUALITY CHECK, EXPORT and UPLOAD in a browser.",
    ),
}


def _version_message() -> str:
    info = build_info()
    core = info["backend"]
    if core == "broken":
        core = f"broken ({info['error']})"
    elif core == "native":
        core = f"native ({info.get('compiler')}, C++{info.get('cxx_standard')})"
    return f"eva {__version__}, core: {core}"


class EvaGroup(click.Group):
    """The command group. Commands load lazily (see COMMANDS); a filesystem error no command
    words itself (EACCES, EROFS, ENOSPC, ELOOP... while reading or writing a dataset) becomes
    one line naming the path, exit 1; a usage error click finds (a missing path, argument or
    option, a bad value) becomes one line too, exit 2, as eva's own refusals are."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        command = getattr(importlib.import_module(entry[0]), entry[1])
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        RAN.append(name or "")
        return name, command, rest

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:  # eva's own options (eva --bogus): one line too
            if isinstance(e, click.exceptions.NoArgsIsHelpError):
                raise
            fail(usage_line(e), EXIT_USAGE)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, summary) for name, (_, _, summary) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            if isinstance(e, click.exceptions.NoArgsIsHelpError):
                raise
            fail(usage_line(e), EXIT_USAGE)
        except KeyboardInterrupt:
            # The work is stopped and cleaned up; a second SIGINT now (a repeated Ctrl-C) must
            # not kill the process on its way out and turn exit 130 into death by signal.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            note = ctx.meta.get("eva.interrupt_note", "nothing was changed")
            say(f"eva: interrupted: {note}", err=True)
            raise SystemExit(EXIT_INTERRUPTED) from None
        except NativeCoreError as e:
            fail(str(e))
        except OSError as e:
            from eva.dataset.fsafe import os_error

            fail(str(os_error(e)))


@click.group(
    cls=EvaGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, message=_version_message())
def main() -> None:
    """eva: record, review, split, export and upload robot-learning datasets.

    \b
    Example (make demo records this dataset):
      eva info demo-data/logs/pick_cube/raw
    """


# Commands after which `run` may end the process at once (see there); the commands they run
# (RAN, the last one counts).
FAST_EXIT_COMMANDS = frozenset({"export", "validate", "verify", "info", "qc", "edit", "cleanup"})
RAN: list[str] = []


def run() -> None:
    """The ``eva`` executable (and ``python -m eva.cli``): ``main``, then, after a command of
    ``FAST_EXIT_COMMANDS`` that left nothing running, ``os._exit`` with its status instead of
    the interpreter's teardown. After an export that teardown (freeing every module and object,
    NumPy's, Arrow's and FFmpeg's included) took 50-100 ms: a tenth of a 40-episode v3 export,
    a quarter of a one-episode one, for memory the kernel frees anyway. Its files are closed and
    synced before the command returns; the streams are flushed here."""
    try:
        main()
    except SystemExit as e:
        if (e.code is None or isinstance(e.code, int)) and _nothing_left_running():
            _exit_now(e.code or 0)
        raise


def _nothing_left_running() -> bool:
    """Whether the interpreter's exit would only free memory: a fast-exit command ran, no thread
    or child process is left to join, no Ray driver to stop, no tracer or profiler (coverage,
    cProfile) waits to write what it saw."""
    if not RAN or RAN[-1] not in FAST_EXIT_COMMANDS:
        return False
    if sys.gettrace() is not None or sys.getprofile() is not None or "ray" in sys.modules:
        return False
    if threading.active_count() > 1:
        return False
    multiprocessing = sys.modules.get("multiprocessing")
    return multiprocessing is None or not multiprocessing.active_children()


def _exit_now(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # a closed pipe: the normal exit reports it
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code)
