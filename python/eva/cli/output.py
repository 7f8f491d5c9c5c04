"""What every eva command prints: one-line errors, JSON lines, exit codes, sizes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from eva.textsafe import json_line, printable, text_problem

EXIT_INVALID = 1
EXIT_USAGE = 2


def emit_json(obj: Any) -> None:
    click.echo(json_line(obj))


def event_printer() -> Callable[[dict[str, Any]], None]:
    """``--json`` progress events: each printed once; an event equal to the one printed before
    it (the last progress before and after the export's publication, an upload's unchanged
    counts polled again) is left out."""
    last: list[str] = [""]

    def emit(event: dict[str, Any]) -> None:
        line = json_line(event)
        if line != last[0]:
            last[0] = line
            click.echo(line)

    return emit


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


def usage_line(error: click.UsageError) -> str:
    """Click's usage error as the one line every refusal is: ``info: Invalid value for
    'DATASET': Directory 'x' does not exist. Try 'eva info --help' for help.`` (click's own
    block spans four lines: usage, hint, blank, error)."""
    message = " ".join(line.strip() for line in error.format_message().splitlines())
    ctx = error.ctx
    if ctx is None or ctx.parent is None:  # the group's own (an unknown command)
        return message
    return f"{ctx.info_name}: {message} Try 'eva {ctx.info_name} --help' for help."


def typed_text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback of an option whose text eva stores (a task prompt, a note, a dataset
    name): the one rule for typed text (``eva.textsafe.text_problem``); a refusal is one line
    naming the command and the option, exit 2. A byte that is not UTF-8 reaches Python as a lone
    surrogate and is refused here, not by ``eva validate`` after the episode is saved."""
    if value is not None:
        problem = text_problem(value)
        if problem is not None:
            option = param.opts[0] if param.opts else param.name
            fail(f"{ctx.info_name}: {option}: {problem}", EXIT_USAGE)
    return value


def human_bytes(n: float) -> str:
    """Decimal units, as progress lines show them: ``512 B``, ``3.0 MB``."""
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


class FormatChoice(click.Choice[str]):
    """``--format``: a format name or alias (case-insensitive), parsed into its catalogue entry
    (``eva.formats.catalog``): the one place the CLI reads a format's name. Help and shell
    completion list every accepted spelling, of the formats known when they are shown."""

    name = "format"

    def __init__(self) -> None:
        super().__init__(self._spellings(), case_sensitive=False)

    @staticmethod
    def _spellings() -> tuple[str, ...]:
        from eva.formats import catalog

        return tuple(catalog.spellings())

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        self.choices = self._spellings()
        return super().get_metavar(param, ctx)

    def get_missing_message(self, param: click.Parameter, ctx: click.Context | None) -> str:
        """The format names on one line (click lists every spelling, one per line)."""
        from eva.formats import catalog

        return "Choose " + catalog.help_line() + "."

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:  # a FormatEntry (click's Choice is typed for the str it gives back)
        from eva.formats import catalog

        if isinstance(value, catalog.FormatEntry):
            return value
        self.choices = self._spellings()
        return catalog.parse(str(super().convert(value, param, ctx)))


def format_help() -> str:
    """What ``--format`` accepts, from the catalogue (``eva.formats.catalog.help_line``)."""
    from eva.formats import catalog

    return catalog.help_line() + "."


def on_interrupt(note: str) -> None:
    """What the running command keeps if the operator presses Ctrl-C now: the line printed
    before eva exits 130 (the default says nothing was changed)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.find_root().meta["eva.interrupt_note"] = note


# ---- verbosity: -q/--quiet and -v/--verbose on every command ---------------------------------

_VERBOSITY = "eva.verbosity"


def _store_verbosity(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    root = ctx.find_root().meta
    if param.name == "quiet" and value:
        root[_VERBOSITY] = -1
    elif param.name == "verbose" and value:
        root[_VERBOSITY] = max(root.get(_VERBOSITY, 0), 0) + int(value)


Command = TypeVar("Command", bound=Callable[..., Any])


def verbosity_options(*, quiet: bool = True) -> Callable[[Command], Command]:
    """Add ``-v/--verbose`` (repeatable) and, unless the command has its own, ``-q/--quiet``."""

    def decorate(command: Command) -> Command:
        command = click.option(
            "-v",
            "--verbose",
            count=True,
            expose_value=False,
            callback=_store_verbosity,
            help="More detail (repeatable).",
        )(command)
        if quiet:
            command = click.option(
                "-q",
                "--quiet",
                is_flag=True,
                expose_value=False,
                callback=_store_verbosity,
                help="No progress bar or notes; errors and results still print.",
            )(command)
        return command

    return decorate


def verbosity() -> int:
    """-1 quiet, 0 normal, 1+ verbose (the current command's -q/-v)."""
    ctx = click.get_current_context(silent=True)
    return int(ctx.find_root().meta.get(_VERBOSITY, 0)) if ctx is not None else 0


def note(text: object, *, err: bool = True) -> None:
    """An informational line (stderr by default), left out with --quiet."""
    if verbosity() >= 0:
        say(text, err=err)


def detail(text: object, *, err: bool = False) -> None:
    """A line shown only with --verbose."""
    if verbosity() > 0:
        say(text, err=err)
