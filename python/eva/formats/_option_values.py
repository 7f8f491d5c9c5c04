"""An option's value checked against its declaration (``eva.formats.base.option``): its type,
its choices and its bounds. Every number is finite and within its minimum and maximum, checked
before it is converted (``1e300`` or ``10**400`` is refused as given, never overflows later)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from eva.dataset.errors import DatasetError

if TYPE_CHECKING:
    from eva.formats.base import OptionField, OptionValue


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
    }[f.type]
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
