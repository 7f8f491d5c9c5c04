"""The ``eva`` command line: the only module that talks to terminals.

Exit codes: 0 ok, 1 invalid data or a failed operation, 2 usage error.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from eva import __version__
from eva._native import build_info

EXIT_INVALID = 1
EXIT_USAGE = 2


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, ensure_ascii=False, default=str))


def fail(message: str, code: int = EXIT_INVALID) -> None:
    """One-line error on stderr and a non-zero exit."""
    click.echo(f"eva: error: {message}", err=True)
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

# [capture commands: collect]

# [quality and export commands: qc, export, verify, cleanup]

# [upload commands: upload]


if __name__ == "__main__":
    main()
