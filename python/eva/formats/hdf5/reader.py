"""Reading an HDF5 episode file back: its groups decoded by kind, images lazy or loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py

from eva.dataset.errors import DatasetError, error_line
from eva.formats.hdf5.items import GROUPS, iter_items, read_mapping

# ---- reading ------------------------------------------------------------------------------------


@dataclass
class Hdf5Episode:
    """One episode file: decoded ``columns`` and ``metadata``; ``images`` are h5py datasets
    (lazy, valid while the episode is open) or arrays when read with ``load_images=True``."""

    path: Path
    columns: dict[str, Any]
    images: dict[str, Any]
    metadata: dict[str, Any]
    file: h5py.File | None = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self) -> Hdf5Episode:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_episode(path: Path | str, *, load_images: bool = False) -> Hdf5Episode:
    """Open an episode file and decode its groups by kind.

    Images stay lazy (h5py datasets: slice the frames you need) unless ``load_images``; use the
    result as a context manager (or call ``close()``) to close the file.
    """
    path = Path(path)
    try:
        h5 = h5py.File(path, "r")
    except Exception as e:  # noqa: BLE001 - h5py's error for a file it cannot open names none
        raise DatasetError(f"{path}: not a readable HDF5 file ({error_line(e)})") from None
    try:
        missing = [g for g in GROUPS if g not in h5]
        if missing:
            raise DatasetError(f"{path}: missing group(s) {', '.join(missing)}")
        columns = read_mapping(h5["columns"])
        metadata = read_mapping(h5["metadata"])
        images: dict[str, Any] = {}
        for key, item in iter_items(h5["images"]):
            images[key] = item["value"][()] if load_images else item["value"]
    except DatasetError:
        h5.close()
        raise
    except Exception as e:  # noqa: BLE001 - a damaged object header or B-tree, met on a lookup
        h5.close()
        raise DatasetError(f"{path}: damaged HDF5 file ({error_line(e)})") from None
    except BaseException:
        h5.close()
        raise
    if load_images:
        h5.close()
        return Hdf5Episode(path, columns, images, metadata, None)
    return Hdf5Episode(path, columns, images, metadata, h5)
