"""What every eva command prints: one-line errors, JSON lines, exit codes, sizes."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

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


def human_bytes(n: float) -> str:
    """Decimal units, as progress lines show them: ``512 B``, ``3.0 MB``."""
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
