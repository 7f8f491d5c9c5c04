"""The typed options every export format is given.

A format's options are a dataclass (a subclass of :class:`Options`, in ``eva.formats.options``)
named by its catalogue entry (``eva.formats.catalog``). This module imports nothing heavy: the
CLI builds its per-format options from the dataclasses without importing a single format.

An option is a dataclass field made with :func:`option`: its default is stated there once, with
its help text, its allowed values and its request name (the console's key, and the CLI flag
``--<name with dashes>`` unless ``flag`` says otherwise). A field made with a plain ``field`` is
a knob for Python callers only (tests, benches), never shown to a user. Every value is checked
once, in ``__post_init__``; a bad one is an :class:`OptionError` naming the option.

An option whose default is a tuple of pairs (``()``) is a mapping (``FEATURE=NAME``): the CLI
takes its flag once per pair, the console a text ``A=B, C=D`` (or a JSON object); each key at
most once (``eva.formats._option_values.parse_pairs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from eva.dataset.errors import DatasetError
from eva.formats._option_values import OptionError as OptionError
from eva.formats._option_values import check_range as check_range
from eva.formats._option_values import check_value, coerce, is_pairs, pairs_text
from eva.formats._option_values import parse_pairs as parse_pairs

OptionType = Literal["bool", "int", "float", "choice", "text", "mapping"]
# A mapping option's value: (key, value) pairs in the order given, each key once.
Pairs = tuple[tuple[str, str], ...]
OptionValue = bool | int | float | str | Pairs
METADATA_KEY = "eva.option"

T = TypeVar("T")
OptionsT = TypeVar("OptionsT", bound="Options")


@dataclass(frozen=True)
class OptionInfo:
    """How one option is named and described to users (CLI and console)."""

    help: str
    name: str = ""  # request name; "" = the field's name
    flag: str | None = None  # CLI flag; None = --<name with dashes>
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    minimum_open: bool = False  # the minimum itself is not allowed
    maximum: float | None = None  # required of a number: no option is unbounded
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
    maximum: float | None = None,
    text: bool = False,
    metavar: str | None = None,
) -> T:
    """A dataclass field that is a user-facing option (see the module doc); a number needs its
    ``minimum`` and ``maximum`` (the limits the format's writer works within)."""
    info = OptionInfo(help, name, flag, choices, minimum, minimum_open, maximum, text, metavar)
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
        """The option as the console's format panel takes it (a mapping's default as the text
        the panel's input holds)."""
        default = pairs_text(self.default) if isinstance(self.default, tuple) else self.default
        return {
            "name": self.name,
            "type": self.type,
            "default": default,
            "help": self.info.help,
            "choices": list(self.info.choices),
            "minimum": self.info.minimum,
            "minimum_open": self.info.minimum_open,
            "maximum": self.info.maximum,
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
    if isinstance(default, tuple):
        return "mapping"
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
            if not isinstance(default, bool | int | float | str) and not is_pairs(default):
                raise TypeError(
                    f"{cls.__name__}.{f.name}: an option's default is a plain value or pairs"
                )
            name = info.name or f.name
            flag = info.flag or "--" + name.replace("_", "-")
            kind = _option_type(default, info)
            if kind in ("int", "float") and (info.minimum is None or info.maximum is None):
                raise TypeError(f"{cls.__name__}.{f.name}: a number option needs both bounds")
            found.append(OptionField(f.name, name, flag, kind, default, info))
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
