"""Typed reading of one config table, with errors that name ``<file>: <dotted key>``.

Every number is range-checked where it is read (finite, within its minimum and its maximum:
no numeric setting is unbounded), and every string of the ``[collection]`` table, key or value,
passes the one rule for text a user types (``eva.textsafe.text_problem``), so nothing a config
holds is refused later by the writer, the validator or an export.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from eva.textsafe import text_problem

# The longest duration any config setting may give (timeouts, tolerances, ring and warning
# spans): a day. Larger values are typing mistakes, and would overflow the clocks they are
# added to.
MAX_DURATION_S = 86_400.0


class ConfigError(ValueError):
    """An invalid configuration; the message names the file and the key."""


class TableReader:
    """Typed access to one table, with errors that name ``<file>: <dotted key>``."""

    def __init__(self, where: str, table: Mapping[str, Any], prefix: str) -> None:
        self.where = where
        self.table = table
        self.prefix = prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.key(name)}: {message}")

    def get(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        if name not in self.table:
            return default
        value = self.table[name]
        if isinstance(value, bool) and kind is not bool and bool not in _as_tuple(kind):
            raise self.fail(name, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(name, f"expected {_kind_name(kind)}, got {type(value).__name__}")
        return value

    def number(
        self,
        name: str,
        default: float,
        *,
        minimum: float,
        maximum: float,
        integer: bool = False,
    ) -> Any:
        """The number ``name`` (``default`` when absent) in ``minimum..maximum``; NaN and inf
        (which TOML can write) are refused."""
        kind: tuple[type, ...] = (int,) if integer else (int, float)
        value = self.get(name, kind, default)
        if not math.isfinite(value):
            raise self.fail(name, f"must be a finite number, got {value!r}")
        if value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        if value > maximum:
            raise self.fail(name, f"must be <= {maximum}, got {value}")
        return int(value) if integer else float(value)

    def duration(self, name: str, default: float) -> float:
        """A span of seconds: 0..MAX_DURATION_S."""
        return float(self.number(name, default, minimum=0.0, maximum=MAX_DURATION_S))

    def refuse_unknown(self, known: set[str] | frozenset[str], what: str = "key") -> None:
        """A key of this table outside ``known`` is a mistake (a typo is otherwise silently
        ignored and its setting left at the default): refuse it, suggesting the closest one."""
        for name in self.table:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(name, f"unknown {what}{hint}; known: {', '.join(sorted(known))}")

    def sub(self, name: str) -> TableReader:
        return TableReader(self.where, self.get(name, dict, {}), self.key(name))

    def tables(self, name: str, fields: str) -> Iterator[tuple[dict[str, Any], TableReader]]:
        """Each table of the array ``name`` with a reader whose errors name ``name[i]``."""
        for i, item in enumerate(self.get(name, list, [])):
            prefix = f"{self.key(name)}[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(f"{self.where}: {prefix}: expected a table {{{fields}}}")
            yield item, TableReader(self.where, item, prefix)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "a table", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in _as_tuple(kind))


def check_strings(value: Any, key: str, where: str) -> None:
    """Every string in ``value`` (a parsed TOML table: keys and values, nested) passes
    ``text_problem``; ConfigError naming ``<where>: <dotted key>`` for the first that does not."""
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise ConfigError(f"{where}: {key}: {problem}")
    elif isinstance(value, Mapping):
        for name, item in value.items():
            problem = text_problem(name)
            if problem is not None:
                raise ConfigError(f"{where}: {key}: key {name!r}: {problem}")
            check_strings(item, f"{key}.{name}", where)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_strings(item, f"{key}[{i}]", where)
