"""Export format registry: format name -> the module that writes and verifies that format.

A format is a module ``eva.formats.<name>`` satisfying ``eva.formats.base.FormatModule``: its
options dataclass ``OPTIONS`` (the one ``eva.formats.options.FORMAT_OPTIONS`` names for it),
``write_subset(reader, meta, staging_dir, progress, options)`` and ``verify(export_dir)``
(docs/design.md, "Export interfaces").

Modules are imported lazily by name, so a format whose module is not written yet (or whose optional
dependency is missing) is reported as unavailable instead of breaking ``import eva.export``.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

from eva._native import NativeCoreError
from eva.dataset.errors import DatasetError
from eva.dataset.layout import FORMATS, normalize_format
from eva.formats.base import ExportOptions, FormatModule, Options
from eva.formats.options import FORMAT_OPTIONS, McapOptions

if TYPE_CHECKING:
    from eva.dataset.reader import DatasetReader
    from eva.dataset.subset import SubsetMeta
    from eva.dataset.validate import Problem
    from eva.progress import ProgressSink

__all__ = ["ExportOptions", "FormatModule", "FormatUnavailable", "load_format"]

# The parameters of FormatModule.write_subset, in order (checked by name: a module whose
# function takes other arguments would be called wrongly).
WRITE_SUBSET_PARAMETERS = ("reader", "meta", "staging_dir", "progress", "options")
VERIFY_PARAMETERS = ("export_dir",)


class FormatUnavailable(DatasetError):
    """The format is known but its module cannot be used (not written yet, or an import failed)."""


def module_name(normalized: str) -> str:
    return f"eva.formats.{normalized}"


def load_format(fmt: str) -> FormatModule:
    """Import and return the module of ``fmt`` (aliases accepted), checked against
    ``FormatModule``."""
    name = normalize_format(fmt)
    try:
        module = importlib.import_module(module_name(name))
    except NativeCoreError:
        raise  # a broken build, not a format this build lacks: its own message says what to do
    except ModuleNotFoundError as e:
        if e.name == module_name(name):
            raise FormatUnavailable(
                f"format {name}: exporter is not available in this build"
            ) from None
        raise FormatUnavailable(f"format {name}: exporter cannot be imported ({e})") from None
    except ImportError as e:
        raise FormatUnavailable(f"format {name}: exporter cannot be imported ({e})") from None
    if name == "mcap" and not hasattr(module, "OPTIONS"):
        module = cast(ModuleType, LegacyMcapModule(module))
    check_format_module(name, module)
    return cast(FormatModule, module)


def check_format_module(name: str, module: object) -> None:
    """Refuse a module that does not satisfy ``FormatModule`` (a ``FormatUnavailable`` naming
    what it lacks)."""
    problems: list[str] = []
    for function, expected in (
        ("write_subset", WRITE_SUBSET_PARAMETERS),
        ("verify", VERIFY_PARAMETERS),
    ):
        fn = getattr(module, function, None)
        if not callable(fn):
            problems.append(f"lacks {function}")
            continue
        params = tuple(inspect.signature(fn).parameters)
        if params != expected:
            problems.append(
                f"{function}({', '.join(params)}) is not {function}({', '.join(expected)})"
            )
    options = getattr(module, "OPTIONS", None)
    if options is not FORMAT_OPTIONS[name]:
        problems.append(f"OPTIONS is {options!r}, not {FORMAT_OPTIONS[name].__name__}")
    if problems:
        raise FormatUnavailable(f"format {name}: exporter module {'; '.join(problems)}")


@dataclass(frozen=True)
class LegacyMcapSettings:
    """What the mcap module of before the typed options reads: ``extra`` and ``batch_size``."""

    extra: dict[str, object] = field(default_factory=dict)
    batch_size: int = 32


class LegacyMcapModule:
    """Temporary adapter: the mcap module that still reads ``options.extra`` behind the typed
    interface (its ``McapOptions`` become the ``mcap_*`` keys it parses). Goes when that module
    takes ``McapOptions`` itself."""

    OPTIONS: type[Options] = McapOptions

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def write_subset(
        self,
        reader: DatasetReader,
        meta: SubsetMeta,
        staging_dir: Path,
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None:
        mcap = options.format_options(McapOptions)
        extra = {"mcap_compression": mcap.compression, "mcap_chunk_size": mcap.chunk_size}
        legacy = LegacyMcapSettings({**extra, **options.extra}, mcap.batch_size)
        self.module.write_subset(reader, meta, staging_dir, progress, legacy)

    def verify(self, export_dir: Path) -> list[Problem]:
        return cast("list[Problem]", self.module.verify(export_dir))


def availability() -> dict[str, str | None]:
    """Every registered format -> None when usable, else the reason it is not."""
    result: dict[str, str | None] = {}
    for name in FORMATS:
        try:
            load_format(name)
            result[name] = None
        except FormatUnavailable as e:
            result[name] = str(e)
    return result


def available_formats() -> list[str]:
    return [name for name, reason in availability().items() if reason is None]
