"""An option's value checked against its declaration (``eva.formats.base.option``): its type,
its choices and its bounds. Every number is finite and within its minimum and maximum, checked
before it is converted (``1e300`` or ``10**400`` is refused as given, never overflows later).
A mapping's pairs come from ``KEY=VALUE`` texts (``parse_pairs``), each key once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeGuard

from eva.dataset.errors import DatasetError

if TYPE_CHECKING:
    from eva.formats.base import OptionField, OptionValue, Pairs

# Pairs one mapping option holds at most (a feature each: far above any dataset's features).
MAX_PAIRS = 1024


class OptionError(DatasetError):
    """A bad option value: ``options.<name>: <reason>`` (the console's wording; the CLI shows
    ``reason`` under the option's flag)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"options.{name}: {reason}")
        self.option = name
        self.reason = reason


def coerce(f: OptionField, value: object) -> OptionValue:
    """A plain (JSON) value as the option's Python type, or an ``OptionError``."""
    if f.type == "bool":
        if not isinstance(value, bool):
            raise OptionError(f.name, f"{value!r} is not true or false")
        return value
    if f.type == "mapping":
        return parse_pairs(f.name, value)
    if f.type in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OptionError(f.name, f"{value!r} is not a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise OptionError(f.name, f"{value!r} is not a finite number")
        check_range(f, value)  # before int() or float(): 1e300 or 10**400 is refused as is
        if f.type == "int":
            if isinstance(value, float) and not value.is_integer():
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
        "mapping": (tuple,),
    }[f.type]
    if f.type == "mapping":
        if not is_pairs(value):
            raise OptionError(f.name, f"{value!r} is not a tuple of (key, value) pairs")
        parse_pairs(f.name, value)  # each key once, none empty
        return
    if not isinstance(value, expected) or (f.type != "bool" and isinstance(value, bool)):
        raise OptionError(f.name, f"{value!r} is not a {f.type} value")
    if f.info.choices and value not in f.info.choices:
        raise OptionError(f.name, f"{value!r}: use one of {', '.join(f.info.choices)}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        check_range(f, value)


def check_range(f: OptionField, value: float) -> None:
    """``value`` is finite and within the option's minimum and maximum."""
    minimum, maximum = f.info.minimum, f.info.maximum
    if isinstance(value, float) and not math.isfinite(value):
        raise OptionError(f.name, f"{value!r} is not a finite number")
    if minimum is not None and (value < minimum or (f.info.minimum_open and value == minimum)):
        bound = ">" if f.info.minimum_open else ">="
        raise OptionError(f.name, f"{_shown(value)} must be {bound} {minimum:g}")
    if maximum is not None and value > maximum:
        raise OptionError(f.name, f"{_shown(value)} must be <= {maximum:g}")


def _shown(value: float) -> str:
    """A number for a message: a huge integer by its size (``str`` refuses over 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 1000:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def is_pairs(value: object) -> TypeGuard[Pairs]:
    """Whether ``value`` is a mapping option's value: a tuple of (str, str) pairs."""
    return isinstance(value, tuple) and all(
        isinstance(pair, tuple)
        and len(pair) == 2
        and isinstance(pair[0], str)
        and isinstance(pair[1], str)
        for pair in value
    )


def pairs_text(pairs: Pairs) -> str:
    """``A=B, C=D``: the pairs as the console's text input holds them."""
    return ", ".join(f"{key}={value}" for key, value in pairs)


def parse_pairs(name: str, value: object) -> Pairs:
    """A mapping option's pairs from what a user gives: ``KEY=VALUE`` texts (one, or several
    separated by commas), a JSON object, or a list of texts or [key, value] pairs. Each key at
    most once, neither side empty; an ``OptionError`` naming the option (and the key) else."""
    items: list[object]
    if isinstance(value, str):
        items = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, Mapping):
        items = [[k, v] for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise OptionError(name, f"{value!r} is not KEY=VALUE pairs")
    if len(items) > MAX_PAIRS:
        raise OptionError(name, f"{len(items)} pairs, at most {MAX_PAIRS}")
    pairs: dict[str, str] = {}
    for item in items:
        if isinstance(item, str):
            key, sep, target = item.partition("=")
        elif isinstance(item, list | tuple) and len(item) == 2:
            key, sep, target = item[0], "=", item[1]
        else:
            raise OptionError(name, f"{item!r} is not KEY=VALUE")
        if not isinstance(key, str) or not isinstance(target, str):
            raise OptionError(name, f"{item!r} is not KEY=VALUE (texts)")
        key, target = key.strip(), target.strip()
        if not sep or not key or not target:
            raise OptionError(name, f"{item!r} is not KEY=VALUE")
        if key in pairs:
            raise OptionError(name, f"{key}: given twice")
        pairs[key] = target
    return tuple(pairs.items())
