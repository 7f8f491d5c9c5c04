"""Each format's export options as data, for the console: description and parsing.

The options are the dataclasses of ``eva.formats.options`` (plus ``ExportOptions``' own, which
every format takes); the console builds its format panel from :data:`FORMAT_OPTIONS` and turns a
request's options into the ``ExportOptions`` the pipeline takes with :func:`parse_options` (the
same names ``eva export``'s ``--<format>-*`` options set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from eva.dataset.layout import normalize_format
from eva.formats.base import ExportOptions, OptionError, OptionField
from eva.formats.options import FORMAT_OPTIONS as FORMAT_OPTION_CLASSES

# Format -> its options, then the ones every format takes.
FORMAT_OPTIONS: dict[str, tuple[OptionField, ...]] = {
    fmt: (*cls.option_fields(), *ExportOptions.option_fields())
    for fmt, cls in FORMAT_OPTION_CLASSES.items()
}


def describe_options() -> dict[str, list[dict[str, object]]]:
    """Format -> its options' name, type, default, help, choices and minimum (``/api/formats``)."""
    return {fmt: [f.as_dict() for f in fields] for fmt, fields in FORMAT_OPTIONS.items()}


def parse_options(fmt: str, values: Mapping[str, object] | None) -> ExportOptions:
    """``ExportOptions`` for ``fmt`` from a mapping of option names (unknown names are refused;
    a missing one keeps the format's default). Errors name the option: ``options.<name>: ...``."""
    fmt = normalize_format(fmt)
    values = dict(values or {})
    common = {f.name for f in ExportOptions.option_fields()}
    known = [f.name for f in FORMAT_OPTIONS[fmt]]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise OptionError(unknown[0], f"not an option of {fmt} (options: {', '.join(known)})")
    own = {k: v for k, v in values.items() if k not in common}
    shared = ExportOptions.from_values({k: v for k, v in values.items() if k in common})
    return replace(shared, format=FORMAT_OPTION_CLASSES[fmt].from_values(own))
