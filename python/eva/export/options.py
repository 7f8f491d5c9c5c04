"""Each format's export options as data, for the console: description and parsing.

The options are each catalogue entry's dataclass (``eva.formats.options``) plus ``ExportOptions``'
own, which every format takes (``FormatEntry.option_fields``); the console builds its format
panel from :func:`format_options` and turns a request's options into the ``ExportOptions`` the
pipeline takes with :func:`parse_options` (the same names ``eva export``'s ``--<format>-*``
options set).
"""

from __future__ import annotations

from collections.abc import Mapping

from eva.formats import catalog
from eva.formats.base import ExportOptions, OptionField
from eva.formats.catalog import FormatEntry


def format_options() -> dict[str, tuple[OptionField, ...]]:
    """Format name -> its options, then the ones every format takes."""
    return {entry.name: entry.option_fields() for entry in catalog.entries()}


def describe_options() -> dict[str, list[dict[str, object]]]:
    """Format -> its options' name, type, default, help, choices and minimum (``/api/formats``)."""
    return {fmt: [f.as_dict() for f in fields] for fmt, fields in format_options().items()}


def parse_options(fmt: FormatEntry | str, values: Mapping[str, object] | None) -> ExportOptions:
    """``ExportOptions`` for ``fmt`` (an entry, or a name a Python caller gives) from a mapping of
    option names (unknown names are refused; a missing one keeps the format's default). Errors
    name the option: ``options.<name>: ...``."""
    return catalog.as_entry(fmt).parse_options(values)
