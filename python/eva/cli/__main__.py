"""``python -m eva.cli``: the ``eva`` command."""

from eva.cli import run

run()
