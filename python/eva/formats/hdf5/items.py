"""HDF5 mapping items: a value <-> its ``kind`` and ``value`` dataset (layout in ``eva.formats.hdf5``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import h5py
import numpy as np

from eva.dataset.errors import DatasetError
from eva.dataset.msgpack_codec import packb, unpackb

FORMAT_NAME = "hdf5"
EPISODE_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.hdf5"
GROUPS = ("columns", "images", "metadata")
KINDS = ("array", "string", "bytes", "none", "msgpack")
ITEM_NAME = "item_{:06d}"
# dtype kinds HDF5 stores natively as an ``array`` item (bool, signed, unsigned, float).
_ARRAY_DTYPE_KINDS = "biuf"

# ---- items: value <-> (kind, dataset) -----------------------------------------------------------


def _python_type(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def encode_value(value: Any) -> tuple[str, Any, dict[str, str]]:
    """(kind, data for the ``value`` dataset, extra attributes) of one mapping value."""
    if value is None:
        return "none", np.empty(0, dtype=np.uint8), {}
    if isinstance(value, str):  # also np.str_
        return "string", str(value), {}
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes", np.frombuffer(bytes(value), dtype=np.uint8), {}
    python_type = _python_type(value)
    if python_type is not None and not isinstance(value, np.generic):
        as_array = np.asarray(value)
        if as_array.dtype.kind in _ARRAY_DTYPE_KINDS:
            return "array", as_array, {"python_type": python_type}
        return "msgpack", np.frombuffer(packb(value), dtype=np.uint8), {}  # int beyond int64
    if isinstance(value, np.ndarray | np.generic):
        as_array = np.asarray(value)
        if as_array.dtype.kind in _ARRAY_DTYPE_KINDS:
            return "array", as_array, {}
        if as_array.dtype.hasobject:
            value = as_array.tolist()
        return "msgpack", np.frombuffer(packb(value), dtype=np.uint8), {}
    if isinstance(value, Mapping | list | tuple):
        return "msgpack", np.frombuffer(packb(value), dtype=np.uint8), {}
    raise TypeError(f"cannot store a {type(value).__name__} in HDF5")


def write_item(
    group: h5py.Group,
    index: int,
    key: str,
    value: Any,
    *,
    compression: str | None = None,
    compression_level: int | None = None,
) -> h5py.Group:
    """Store ``value`` as ``group/item_<index>`` with its ``key`` and ``kind`` attributes."""
    try:
        kind, data, extra_attrs = encode_value(value)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{group.name}: key {key!r}: {e}") from None
    item = group.create_group(ITEM_NAME.format(index))
    item.attrs["key"] = key
    item.attrs["kind"] = kind
    for name, attr in extra_attrs.items():
        item.attrs[name] = attr
    if kind == "string":
        item.create_dataset("value", data=data, dtype=h5py.string_dtype("utf-8"))
    elif kind == "array" and data.ndim >= 1 and data.size and compression is not None:
        item.create_dataset(
            "value", data=data, compression=compression, compression_opts=compression_level
        )
    else:
        item.create_dataset("value", data=data)
    return item


def write_mapping(group: h5py.Group, mapping: Mapping[str, Any], **compression: Any) -> None:
    for index, (key, value) in enumerate(mapping.items()):
        write_item(group, index, str(key), value, **compression)


def attr_text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def decode_item(item: h5py.Group) -> Any:
    """The Python value of one ``item_NNNNNN`` group (images stay lazy only via read_episode)."""
    kind = attr_text(item.attrs["kind"])
    dataset = item["value"]
    if kind == "none":
        return None
    if kind == "string":
        return dataset.asstr()[()]
    if kind == "bytes":
        return dataset[()].tobytes()
    if kind == "msgpack":
        return unpackb(dataset[()].tobytes())
    if kind == "array":
        value = dataset[()]
        python_type = item.attrs.get("python_type")
        if python_type is not None:
            return {"bool": bool, "int": int, "float": float}[attr_text(python_type)](value)
        return value
    raise DatasetError(f"{item.name}: unknown kind {kind!r}")


def iter_items(group: h5py.Group) -> Iterator[tuple[str, h5py.Group]]:
    """(original key, item group) in item order."""
    for name in sorted(group):
        item = group[name]
        yield attr_text(item.attrs["key"]), item


def read_mapping(group: h5py.Group) -> dict[str, Any]:
    return {key: decode_item(item) for key, item in iter_items(group)}
