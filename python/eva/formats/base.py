"""What every export format provides, and the typed options it is given.

A format is a module ``eva.formats.<name>`` that satisfies :class:`FormatModule`: its options
dataclass (``OPTIONS``, a subclass of :class:`Options`), ``write_subset`` and ``verify``
(docs/design.md, "Export interfaces"). ``eva.export.registry.load_format`` checks a module
against it. This module imports nothing heavy: the CLI builds its per-format options from the
dataclasses without importing a single format.

An option is a dataclass field made with :func:`option`: its default is stated there once, with
its help text, its allowed values and its request name (the console's key, and the CLI flag
``--<name with dashes>`` unless ``flag`` says otherwise). A field made with a plain ``field`` is
a knob for Python callers only (tests, benches), never shown to a user. Every value is checked
once, in ``__post_init__``; a bad one is an :class:`OptionError` naming the option.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from eva.dataset.errors import DatasetError

if TYPE_CHECKING:
    from eva.dataset.reader import DatasetReader
    from eva.dataset.subset import SubsetMeta
    from eva.dataset.validate import Problem
    from eva.progress import ProgressSink

OptionType = Literal["bool", "int", "float", "choice", "text"]
OptionValue = bool | int | float | str
METADATA_KEY = "eva.option"

T = TypeVar("T")
OptionsT = TypeVar("OptionsT", bound="Options")


class OptionError(DatasetError):
    """A bad option value: ``options.<name>: <reason>`` (the console's wording; the CLI shows
    ``reason`` under the option's flag)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"options.{name}: {reason}")
        self.option = name
        self.reason = reason


@dataclass(frozen=True)
class OptionInfo:
    """How one option is named and described to users (CLI and console)."""

    help: str
    name: str = ""  # request name; "" = the field's name
    flag: str | None = None  # CLI flag; None = --<name with dashes>
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    minimum_open: bool = False  # the minimum itself is not allowed
    text: bool = False  # a free-text value checked by the dataclass (not a choice)
    metavar: str | None = None


def option(
    default: T,
    *,
    help: str,
    name: str = "",
    flag: str | None = None,
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
    minimum_open: bool = False,
    text: bool = False,
    metavar: str | None = None,
) -> T:
    """A dataclass field that is a user-facing option (see the module doc)."""
    info = OptionInfo(help, name, flag, choices, minimum, minimum_open, text, metavar)
    return field(default=default, metadata={METADATA_KEY: info})


@dataclass(frozen=True)
class OptionField:
    """One option of an options dataclass, resolved: its field, names, type and default."""

    field_name: str
    name: str
    flag: str
    type: OptionType
    default: OptionValue
    info: OptionInfo

    def as_dict(self) -> dict[str, object]:
        """The option as the console's format panel takes it."""
        return {
            "name": self.name,
            "type": self.type,
            "default": self.default,
            "help": self.info.help,
            "choices": list(self.info.choices),
            "minimum": self.info.minimum,
            "minimum_open": self.info.minimum_open,
        }


# A default's Python type -> the option's type (bool before int: a bool is an int).
_DEFAULT_TYPES: tuple[tuple[type, OptionType], ...] = (
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
)


def _option_type(default: object, info: OptionInfo) -> OptionType:
    if info.choices:
        return "choice"
    return next((name for kind, name in _DEFAULT_TYPES if isinstance(default, kind)), "text")


@dataclass(frozen=True)
class Options:
    """Base of every options dataclass: finds its options, checks and builds them."""

    @classmethod
    def option_fields(cls) -> tuple[OptionField, ...]:
        found = []
        for f in dataclasses.fields(cls):
            info = f.metadata.get(METADATA_KEY)
            if not isinstance(info, OptionInfo):
                continue
            default = f.default
            if not isinstance(default, bool | int | float | str):
                raise TypeError(f"{cls.__name__}.{f.name}: an option's default is a plain value")
            name = info.name or f.name
            flag = info.flag or "--" + name.replace("_", "-")
            found.append(
                OptionField(f.name, name, flag, _option_type(default, info), default, info)
            )
        return tuple(found)

    @classmethod
    def from_values(cls: type[OptionsT], values: Mapping[str, object]) -> OptionsT:
        """The options from request names -> plain values (JSON); a missing name keeps its
        default, an unknown one is refused. Errors name the option."""
        fields = {f.name: f for f in cls.option_fields()}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise OptionError(unknown[0], f"not an option (options: {', '.join(fields) or 'none'})")
        kwargs = {fields[n].field_name: coerce(fields[n], v) for n, v in values.items()}
        return cls(**kwargs)

    def __post_init__(self) -> None:
        for f in self.option_fields():
            check_value(f, getattr(self, f.field_name))


def coerce(f: OptionField, value: object) -> OptionValue:
    """A plain (JSON) value as the option's Python type, or an ``OptionError``."""
    if f.type == "bool":
        if not isinstance(value, bool):
            raise OptionError(f.name, f"{value!r} is not true or false")
        return value
    if f.type in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OptionError(f.name, f"{value!r} is not a number")
        if f.type == "int":
            if not float(value).is_integer():
                raise OptionError(f.name, f"{value!r} is not an integer")
            return int(value)
        return float(value)
    if not isinstance(value, str):
        raise OptionError(f.name, f"{value!r} is not a string")
    return value


def check_value(f: OptionField, value: object) -> None:
    """The checks the field's metadata states (type, choices, minimum)."""
    expected: tuple[type, ...] = {
        "bool": (bool,),
        "int": (int,),
        "float": (int, float),
        "choice": (str,),
        "text": (str,),
    }[f.type]
    if not isinstance(value, expected) or (f.type != "bool" and isinstance(value, bool)):
        raise OptionError(f.name, f"{value!r} is not a {f.type} value")
    if f.info.choices and value not in f.info.choices:
        raise OptionError(f.name, f"{value!r}: use one of {', '.join(f.info.choices)}")
    minimum = f.info.minimum
    if minimum is None or not isinstance(value, int | float):
        return
    if math.isnan(value) or value < minimum or (f.info.minimum_open and value == minimum):
        bound = ">" if f.info.minimum_open else ">="
        raise OptionError(f.name, f"{value!r} must be {bound} {minimum:g}")


@dataclass(frozen=True)
class ExportOptions(Options):
    """What one export is given: the options every format takes, and the format's own.

    ``format``: the format's options dataclass (``eva.formats.options``), None for its defaults.
    ``durable``: flush the staged pair to disk (one ``syncfs``) before it is published, so a power
    loss cannot publish unwritten files; a process crash is safe either way.
    """

    allow_non_finite: bool = option(
        False,
        help="Export NaN/inf values in vector columns as they are (every format; by default a "
        "source holding any is refused, naming file, episode, column and first row).",
    )
    durable: bool = True
    format: Options | None = None
    # Settings of a format module that takes no typed options yet (mcap, until its options
    # move to McapOptions); no other format reads it.
    extra: Mapping[str, object] = field(default_factory=dict)

    def format_options(self, cls: type[OptionsT]) -> OptionsT:
        """The format's options (its defaults when none were given); options made for another
        format are a caller's mistake."""
        if self.format is None:
            return cls()
        if not isinstance(self.format, cls):
            raise DatasetError(
                f"options: {type(self.format).__name__} given to an export that takes "
                f"{cls.__name__}"
            )
        return self.format


class FormatModule(Protocol):
    """An export format module (``eva.formats.<name>``)."""

    OPTIONS: type[Options]

    def write_subset(
        self,
        reader: DatasetReader,
        meta: SubsetMeta,
        staging_dir: Path,
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None:
        """Write one complete subset (data, meta, images) of the v2.1 source ``reader``
        described by ``meta`` into the empty directory ``staging_dir``: everything except
        ``meta/quality_split.json`` (the pipeline writes that). Call ``progress`` with
        increments. Bad input raises ``DatasetError`` (one line naming file/episode/field)."""

    def verify(self, export_dir: Path) -> list[Problem]:
        """Totals against the physical files plus a real read of one state, one action and one
        image frame per episode with the format's own reader (shared checks:
        ``eva.formats._verify``)."""
