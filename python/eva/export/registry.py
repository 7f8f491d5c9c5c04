"""Export format registry: format name -> the module that writes and verifies that format.

A format is a plain module ``eva.formats.<name>`` that provides (see docs/design.md, "Export
interfaces"):

- ``write_subset(reader, meta, staging_dir, progress, options) -> None``: write one complete subset
  (data, meta, images) of the source ``reader`` (an ``eva.dataset.reader.DatasetReader``) described
  by ``meta`` (an ``eva.dataset.subset.SubsetMeta``) into the empty directory ``staging_dir``.
  ``progress`` is an ``eva.progress.ProgressSink`` (call it with increments); ``options`` is an
  ``ExportOptions``. Everything except ``meta/quality_split.json`` (the pipeline writes that).
  Raise ``eva.dataset.errors.DatasetError`` (one line naming file/episode/field) on bad input.
- ``verify(export_dir) -> list[Problem]``: totals against the physical files plus a real read of
  one state, one action and one image frame per episode with the format's own reader.

Modules are imported lazily by name, so a format whose module is not written yet (or whose optional
dependency is missing) is reported as unavailable instead of breaking ``import eva.export``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from eva._native import NativeCoreError
from eva.dataset.errors import DatasetError
from eva.dataset.layout import FORMATS, normalize_format

REQUIRED_FUNCTIONS = ("write_subset", "verify")


@dataclass(frozen=True)
class ExportOptions:
    """Knobs a format may honour; unknown formats ignore what they do not need.

    ``link_videos``: the native v2.1 exporter hard-links source MP4s when the filesystem allows
    (falls back to a copy). ``durable``: flush the staged pair to disk (one ``syncfs``) before it
    is published, so a power loss cannot publish unwritten files; a process crash is safe either
    way. ``extra`` carries format-specific settings (e.g. HDF5 compression).
    """

    link_videos: bool = True
    batch_size: int = 32
    durable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class FormatUnavailable(DatasetError):
    """The format is known but its module cannot be used (not written yet, or an import failed)."""


def module_name(normalized: str) -> str:
    return f"eva.formats.{normalized}"


def load_format(fmt: str) -> ModuleType:
    """Import and return the module of ``fmt`` (aliases accepted), checking the interface."""
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
    missing = [fn for fn in REQUIRED_FUNCTIONS if not callable(getattr(module, fn, None))]
    if missing:
        raise FormatUnavailable(f"format {name}: exporter module lacks {', '.join(missing)}")
    return module


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
