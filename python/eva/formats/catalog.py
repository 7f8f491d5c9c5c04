"""The export formats eva knows: one :class:`FormatEntry` per format, and the one place a
format's name is read.

An entry names the format (``name``, the directory of its exports, and ``aliases``, other
spellings accepted in any case), its options dataclass (``eva.formats.options``), the module
that writes and verifies it (a :class:`Format`, imported only when used: ``FormatEntry.load``)
and its help line. A name from outside (``eva --format``, the console's request, a job.json or
marker being read) is parsed once, where it comes in (:func:`parse`, or :func:`find` for a
name read from a file), and the entry is passed down from there; nothing below handles the
string. Everything an export root's path needs is here too (``FormatEntry.export_root``).

This module imports no format: a format whose module is missing or broken is reported by
``load`` (``FormatUnavailable``) without breaking the others.

A format from outside eva is one package satisfying :class:`Format` plus one entry, added by
:func:`register` (in the process that exports), or by an entry point in the group
``eva.formats`` whose name is the format's name and whose object is its ``FormatEntry``
(every eva process, the CLI and the console included, finds it when it first lists the formats).
"""

from __future__ import annotations

import importlib
import inspect
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from eva._native import NativeCoreError
from eva.dataset.errors import DatasetError
from eva.dataset.layout import SUBSETS
from eva.formats.base import ExportOptions, OptionError, OptionField, Options
from eva.formats.options import (
    Hdf5Options,
    LeRobotV3Options,
    LeRobotV21Options,
    McapOptions,
    ZarrOptions,
)

if TYPE_CHECKING:
    from eva.dataset.reader import DatasetReader
    from eva.dataset.subset import SubsetMeta
    from eva.dataset.validate import Problem
    from eva.formats.tasks import TaskFormat
    from eva.progress import ProgressSink

ENTRY_POINT_GROUP = "eva.formats"
# A format's name is a directory of every export root: lower case, digits and '_'.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_ALIAS = re.compile(r"[a-z0-9][a-z0-9._]{0,63}")


class FormatUnavailable(DatasetError):
    """The format is known but its module cannot be used (not written yet, or an import failed)."""


class UnknownFormat(ValueError):
    """A name that is no format's name nor alias (the message lists the formats)."""


@runtime_checkable
class Format(Protocol):
    """What a format's module (``FormatEntry.module``) provides.

    ``write_subset``: one complete subset (data, meta, images) of the v2.1 source ``reader``
    described by ``meta``, into the empty directory ``staging_dir``: everything except
    ``meta/quality_split.json`` (the pipeline writes that); ``progress`` is called with
    increments; bad input raises ``DatasetError`` (one line naming file/episode/field).
    ``verify``: totals against the physical files plus a real read of one state, one action
    and one image frame per episode with the format's own reader (shared checks:
    ``eva.formats._verify``). ``TASKS``: how the format's subsets are cut into tasks any
    executor runs (``eva.formats.tasks``), or None for a format written by ``write_subset``
    alone. Its task type is the format's own (the driver hands a format's tasks back to it
    only), hence ``Any`` here."""

    @property
    def TASKS(self) -> TaskFormat[Any] | None: ...  # noqa: N802 - a module's constant

    def write_subset(
        self,
        reader: DatasetReader,
        meta: SubsetMeta,
        staging_dir: Path,
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None: ...

    def verify(self, export_dir: Path) -> list[Problem]: ...


# The parameters of Format's functions, in order (checked by name: a module whose function
# takes other arguments would be called wrongly).
_PARAMETERS = {
    "write_subset": ("reader", "meta", "staging_dir", "progress", "options"),
    "verify": ("export_dir",),
}


@dataclass(frozen=True)
class FormatEntry:
    """One export format: see the module docstring. ``codebase_version``: the info.json
    ``codebase_version`` that names this format's exports when their info.json has no
    ``dataset_format`` (LeRobot's own layouts); ``source``: the layout of eva's raw datasets
    (the one entry a source's ``dataset_format`` may name)."""

    name: str
    module: str
    options: type[Options]
    help: str
    aliases: tuple[str, ...] = ()
    codebase_version: str | None = None
    source: bool = False

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"format name {self.name!r}: 1-64 of a-z, 0-9 and '_', from a letter")
        for alias in self.aliases:
            if not _ALIAS.fullmatch(alias):
                raise ValueError(f"format {self.name}: alias {alias!r}: lower case, 0-9, '.', '_'")
        if not (isinstance(self.options, type) and issubclass(self.options, Options)):
            raise ValueError(f"format {self.name}: options {self.options!r} is no Options class")

    def __str__(self) -> str:
        return self.name

    def load(self) -> Format:
        """The format's module, imported now (``FormatUnavailable`` when it cannot be, or when
        it lacks what :class:`Format` asks)."""
        try:
            module = importlib.import_module(self.module)
        except NativeCoreError:
            raise  # a broken build, not a format this build lacks: its own message says what to do
        except ModuleNotFoundError as e:
            if e.name == self.module:
                raise FormatUnavailable(
                    f"format {self.name}: exporter is not available in this build"
                ) from None
            raise FormatUnavailable(
                f"format {self.name}: exporter cannot be imported ({e})"
            ) from None
        except ImportError as e:
            raise FormatUnavailable(
                f"format {self.name}: exporter cannot be imported ({e})"
            ) from None
        return check_format_module(self.name, module)

    def export_root(self, source_dir: Path) -> Path:
        """``<parent>/export/<name>`` for a source named ``raw``, else
        ``<parent>/<source name>_export/<name>``."""
        source_dir = Path(source_dir).resolve()
        if source_dir.name == "raw":
            return source_dir.parent / "export" / self.name
        return source_dir.parent / f"{source_dir.name}_export" / self.name

    def export_paths(self, source_dir: Path) -> dict[str, Path]:
        """Each subset's directory of ``source_dir``'s export in this format."""
        root = self.export_root(source_dir)
        return {subset: root / subset for subset in SUBSETS}

    def option_fields(self) -> tuple[OptionField, ...]:
        """The format's options, then the ones every format takes."""
        return (*self.options.option_fields(), *ExportOptions.option_fields())

    def parse_options(self, values: Mapping[str, object] | None) -> ExportOptions:
        """``ExportOptions`` from a mapping of option names (unknown names are refused; a
        missing one keeps its default). Errors name the option: ``options.<name>: ...``."""
        values = dict(values or {})
        common = {f.name for f in ExportOptions.option_fields()}
        known = [f.name for f in self.option_fields()]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise OptionError(
                unknown[0], f"not an option of {self.name} (options: {', '.join(known)})"
            )
        own = {k: v for k, v in values.items() if k not in common}
        shared = ExportOptions.from_values({k: v for k, v in values.items() if k in common})
        return replace(shared, format=self.options.from_values(own))


def check_format_module(name: str, module: object) -> Format:
    """``module`` as a :class:`Format`, or a ``FormatUnavailable`` naming what it lacks."""
    problems: list[str] = []
    for function, expected in _PARAMETERS.items():
        fn = getattr(module, function, None)
        if not callable(fn):
            problems.append(f"lacks {function}")
            continue
        params = tuple(inspect.signature(fn).parameters)
        if params != expected:
            problems.append(
                f"{function}({', '.join(params)}) is not {function}({', '.join(expected)})"
            )
    if not hasattr(module, "TASKS"):
        problems.append("lacks TASKS (None for a format without tasks)")
    if problems or not isinstance(module, Format):
        raise FormatUnavailable(f"format {name}: exporter module {'; '.join(problems)}")
    return module


BUILTIN = (
    FormatEntry(
        "lerobot_v21",
        "eva.formats.lerobot_v21",
        LeRobotV21Options,
        "LeRobot v2.1: the raw layout, renumbered; MP4s linked or copied",
        aliases=("v21", "v2.1", "native"),
        codebase_version="v2.1",
        source=True,
    ),
    FormatEntry(
        "lerobot_v3",
        "eva.formats.lerobot_v3",
        LeRobotV3Options,
        "LeRobot v3.0: sharded parquet and MP4 files",
        aliases=("lerobot_v30", "v3", "v3.0"),
        codebase_version="v3.0",
    ),
    FormatEntry(
        "hdf5",
        "eva.formats.hdf5",
        Hdf5Options,
        "HDF5: one file per episode, decoded rgb frames",
        aliases=("h5",),
    ),
    FormatEntry(
        "mcap",
        "eva.formats.mcap",
        McapOptions,
        "MCAP: one file per episode, EVA messages or the foxglove profile",
    ),
    FormatEntry(
        "zarr",
        "eva.formats.zarr",
        ZarrOptions,
        "Zarr: one store per subset, diffusion_policy's ReplayBuffer layout (the zarr extra)",
    ),
)


class _Catalogue:
    """The entries: the built-in ones, then the entry points' (found once, on first use), then
    the registered ones. A broken entry point is reported when its name is asked for."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, FormatEntry] = {e.name: e for e in BUILTIN}
        self.broken: dict[str, str] = {}  # entry point name -> why it cannot be used
        self.discovered = False

    def all(self) -> dict[str, FormatEntry]:
        with self.lock:
            if not self.discovered:
                self.discovered = True
                self._discover()
            return dict(self.entries)

    def _discover(self) -> None:
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                entry = point.load()
                if not isinstance(entry, FormatEntry) or entry.name != point.name:
                    raise TypeError(f"{point.value} is not the FormatEntry of {point.name!r}")
                self.add(entry)
            except Exception as e:  # noqa: BLE001 - any failure: that format is unavailable
                self.broken[point.name] = f"format {point.name}: plugin {point.value}: {e}"

    def add(self, entry: FormatEntry) -> None:
        taken = {n for e in self.entries.values() for n in (e.name, *e.aliases)}
        clash = sorted({entry.name, *entry.aliases} & taken)
        if clash:
            raise ValueError(f"format {entry.name}: {clash[0]!r} is another format's name")
        self.entries[entry.name] = entry


_CATALOGUE = _Catalogue()


def register(entry: FormatEntry) -> FormatEntry:
    """Add ``entry`` to this process's catalogue (``ValueError`` when its name or an alias is
    taken). The CLI generates its options when its export command is imported: a format
    registered later is exported by its name, with its default options."""
    _CATALOGUE.all()
    with _CATALOGUE.lock:
        _CATALOGUE.add(entry)
    return entry


def unregister(name: str) -> None:
    """Remove a registered format (the built-in ones stay)."""
    if name in {e.name for e in BUILTIN}:
        raise ValueError(f"format {name}: built in, cannot be removed")
    _CATALOGUE.all()
    with _CATALOGUE.lock:
        _CATALOGUE.entries.pop(name, None)


def entries() -> tuple[FormatEntry, ...]:
    """Every format, built-in first."""
    return tuple(_CATALOGUE.all().values())


def names() -> tuple[str, ...]:
    return tuple(_CATALOGUE.all())


def spellings() -> list[str]:
    """Every accepted spelling: each name, then its aliases."""
    return [n for e in entries() for n in (e.name, *e.aliases)]


def find(name: object) -> FormatEntry | None:
    """The entry ``name`` (a format's name or alias, any case, spaces around ignored) names,
    None when it names none (a string read from a file: any value)."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower()
    for entry in _CATALOGUE.all().values():
        if key == entry.name or key in entry.aliases:
            return entry
    return None


def named(name: object) -> FormatEntry | None:
    """The entry whose name is exactly ``name`` (a record eva wrote names its format so: a
    marker's ``dataset_format``), None for any other value."""
    return _CATALOGUE.all().get(name) if isinstance(name, str) else None


def parse(name: str) -> FormatEntry:
    """The entry ``name`` names; ``UnknownFormat`` (a ``ValueError``) listing the formats, or
    ``FormatUnavailable`` for a plugin that cannot be loaded."""
    entry = find(name)
    if entry is not None:
        return entry
    broken = _CATALOGUE.broken.get(str(name).strip().lower())
    if broken is not None:
        raise FormatUnavailable(broken)
    raise UnknownFormat(f"unknown format {name!r}: choose one of {help_line()}")


def as_entry(fmt: FormatEntry | str) -> FormatEntry:
    """``fmt`` parsed unless it is an entry already: for the public functions a Python caller
    may give a name (``export_dataset(source, "hdf5")``), the edge of the library."""
    return fmt if isinstance(fmt, FormatEntry) else parse(fmt)


def source_entry() -> FormatEntry:
    """The format of eva's raw datasets (the layout an export reads)."""
    return next(e for e in BUILTIN if e.source)


def format_of_info(info: Mapping[str, object]) -> str:
    """The format a dataset's or export's info.json says it is: its ``dataset_format``, else the
    format whose ``codebase_version`` it has, else the raw layout's (text as found)."""
    tagged = info.get("dataset_format")
    if tagged:
        return str(tagged)
    version = info.get("codebase_version")
    found = next((e for e in entries() if version and e.codebase_version == version), None)
    return (found or source_entry()).name


def help_line() -> str:
    """``lerobot_v21, lerobot_v3, hdf5 or mcap (aliases: v21, v3, h5; any case)``: each
    format's name, and its shortest alias."""
    every = names()
    listed = ", ".join(every[:-1]) + (" or " if len(every) > 1 else "") + every[-1]
    short = [min(e.aliases, key=len) for e in entries() if e.aliases]
    return f"{listed} (aliases: {', '.join(short)}; any case)" if short else listed


if TYPE_CHECKING:  # mypy checks each built-in format's module against Format
    from eva.formats import hdf5, lerobot_v3, lerobot_v21, mcap, zarr

    _LEROBOT_V21: Format = lerobot_v21
    _LEROBOT_V3: Format = lerobot_v3
    _HDF5: Format = hdf5
    _MCAP: Format = mcap
    _ZARR: Format = zarr
