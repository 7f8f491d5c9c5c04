"""The ``jsonl`` format's catalogue entry and options: what ``catalog.register`` or the
``eva.formats`` entry point is given."""

from __future__ import annotations

from dataclasses import dataclass

from eva.formats.base import Options, option
from eva.formats.catalog import FormatEntry


@dataclass(frozen=True)
class JsonlOptions(Options):
    sort_keys: bool = option(False, name="jsonl_sort_keys", help="each row's keys in sorted order.")


ENTRY = FormatEntry(
    "jsonl",
    "jsonl_format.writer",
    JsonlOptions,
    "JSON lines: each episode's rows, one object a line",
    aliases=("json_lines",),
)
