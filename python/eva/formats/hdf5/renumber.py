"""Renumbered reuse of a published HDF5 episode file (``eva.formats._renumber``).

An episode's file depends on its numbering through the values of a few items only: the
``columns`` ``episode_index``, ``index`` and ``task_index`` arrays and the ``metadata``
``episode_index`` scalar. With uncompressed items (``hdf5_compression`` none, the default) each
value is one contiguous block of raw bytes at a fixed file offset, and HDF5 (superblock 0, no
metadata checksums, no times) keeps nothing else that depends on the values: rewriting the
blocks gives the bytes a new export writes (tests/test_export_renumber.py compares the trees).

The items that differ between the two numberings are found by encoding both, as the writer
would, from the source table; each must be a contiguous, unfiltered dataset of the same dtype
and shape in the published file, holding the old numbering's values. Anything else (compressed
or chunked items, another layout, a file h5py cannot read) returns None: the episode is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa

from eva.dataset.columns import column_values
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import rewrite_index_columns
from eva.dataset.subset_edits import trim_table
from eva.formats._renumber import Patch, copy_and_patch
from eva.formats.hdf5.items import encode_value, iter_items
from eva.formats.tasks import EpisodeResult, EpisodeTask


class NotPatchable(Exception):
    """The published file cannot be patched to the new numbering (the episode is written)."""


def _columns(table: pa.Table, task: EpisodeTask) -> dict[str, Any]:
    """The ``columns`` group's values of ``task`` from its source ``table``."""
    table = rewrite_index_columns(table, task.index, task.index_offset, dict(task.task_remap))
    return {name: column_values(table.column(name)) for name in table.column_names}


def _encoded(value: Any) -> tuple[str, bytes, str, tuple[int, ...], dict[str, str]]:
    kind, data, attrs = encode_value(value)
    if isinstance(data, str):
        return kind, data.encode("utf-8"), "str", (), attrs
    array = np.asarray(data)
    return kind, array.tobytes(), array.dtype.str, array.shape, attrs


def _group_patches(
    group: h5py.Group, old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[Patch]:
    if list(old) != list(new):
        raise NotPatchable("keys")
    items = dict(iter_items(group))
    if list(items) != list(old):
        raise NotPatchable("items")
    patches = []
    for key in old:
        before, after = _encoded(old[key]), _encoded(new[key])
        if before == after:
            continue
        kind, old_bytes, dtype, shape, attrs = before
        if kind != "array" or (after[0], after[2], after[3], after[4]) != (
            kind,
            dtype,
            shape,
            attrs,
        ):
            raise NotPatchable(key)
        dataset = items[key]["value"]
        contiguous = dataset.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS
        offset = dataset.id.get_offset()
        if (
            not contiguous
            or dataset.id.get_create_plist().get_nfilters()
            or offset is None
            or dataset.dtype.str != dtype
            or dataset.shape != shape
            or dataset.id.get_storage_size() != len(old_bytes)
        ):
            raise NotPatchable(key)
        patches.append(Patch(int(offset), old_bytes, after[1]))
    return patches


def renumber_episode(
    reader: DatasetReader, task: EpisodeTask, previous: EpisodeTask, published: Path
) -> EpisodeResult | None:
    """``task``'s file, from ``published`` (``previous``'s file, the same episode numbered
    otherwise): copied into the staging directory and patched; None when it cannot be."""
    from eva.formats.hdf5.writer import episode_metadata

    table = reader.read_table(task.source_index)
    try:
        table = trim_table(table, task.trim, task.fps, task.label)
    except DatasetError:
        return None
    if table.num_rows != task.length:
        return None
    try:
        with h5py.File(published, "r") as h5:
            patches = [
                *_group_patches(h5["columns"], _columns(table, previous), _columns(table, task)),
                *_group_patches(
                    h5["metadata"],
                    episode_metadata(reader, previous),
                    episode_metadata(reader, task),
                ),
            ]
    except (NotPatchable, OSError, KeyError, ValueError, TypeError, RuntimeError):
        return None  # not this layout, or not a readable HDF5 file: written anew
    size = copy_and_patch(published, task.subset_dir / task.path, patches)
    if size is None:
        return None
    return EpisodeResult(task.subset, task.index, task.path, size, f"{task.subset}/{task.path}")
