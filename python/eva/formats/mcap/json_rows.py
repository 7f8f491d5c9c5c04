"""JSON objects of many rows at once, byte for byte as ``json.dumps`` writes them.

The foxglove profile writes one JSON object per frame and vector column (``{"name": value,
...}``). ``json.dumps`` spends about a microsecond on each float: a float32 reading, widened to
a double, needs 17 significant digits, the slow path of Python's shortest-repr algorithm. The
native ``float_repr`` kernel writes the same digits (C++17 ``std::to_chars``, shortest
round-trip) in Python's layout in about a tenth of that; ``float_reprs_reference`` is Python's
own ``repr``, used under ``EVA_PUREPYTHON=1`` and compared with the kernel in the tests. The
objects are then put together for every row at once (one gather of keys and values).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from eva._native import load
from eva.formats.mcap.foxglove import json_payload
from eva.formats.mcap.wire import Ragged, gather

_native = load("float_repr")


def float_reprs_reference(values: np.ndarray) -> Ragged:
    """``repr(float(v))`` of each value (what ``json.dumps`` writes for a finite float)."""
    return Ragged.of([repr(v).encode() for v in np.asarray(values, np.float64).tolist()])


def float_reprs(values: np.ndarray) -> Ragged:
    """``float_reprs_reference``, by the native kernel unless ``EVA_PUREPYTHON=1``."""
    values = np.ascontiguousarray(values, np.float64)
    if _native is None:
        return float_reprs_reference(values)
    flat, lengths = _native.reprs(values)
    return Ragged(flat, lengths)


def _values(column: np.ndarray) -> Ragged | None:
    """Each value as JSON; None for a column ``json_payload`` must write."""
    kind = column.dtype.kind
    if kind == "b":
        return Ragged.of([b"true" if v else b"false" for v in column.tolist()])
    if kind in "iu":
        return Ragged.of([b"%d" % v for v in column.tolist()])
    if _is_double(column):
        return float_reprs(column)
    return None


def _is_double(column: np.ndarray) -> bool:
    return column.dtype.kind == "f" and column.dtype.itemsize <= 8  # tolist() makes a double


def _value_table(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every value's JSON: (bytes back to back, start and length of value (i, j) as (rows,
    columns) arrays); ValueError for a column ``json_payload`` must write."""
    rows = len(columns[0])
    if all(_is_double(c) for c in columns):  # one kernel call for the whole table
        values = float_reprs(np.stack(columns, axis=1).ravel())
        shape = (rows, len(columns))
        return values.flat, values.starts.reshape(shape), values.lengths.reshape(shape)
    flats, starts, lengths = [], [], []
    base = 0
    for column in columns:
        each = _values(column)
        if each is None:
            raise ValueError(column.dtype)
        flats.append(each.flat)
        starts.append(each.starts + base)
        lengths.append(each.lengths)
        base += len(each.flat)
    return np.concatenate(flats), np.stack(starts, axis=1), np.stack(lengths, axis=1)


def json_rows(names: Sequence[str], columns: Sequence[np.ndarray]) -> Ragged:
    """``json_payload({names[j]: columns[j][i].item() for j})`` of every row *i*. A row with
    NaN or infinity (null in ``json_payload``), and every row when a column is not bool,
    integer or float, go through ``json_payload``."""
    rows = len(columns[0]) if columns else 0
    if not columns:
        return Ragged.constant(b"{}", rows)
    if _native is not None and all(_is_double(c) for c in columns):
        # The whole object in the kernel; it writes NaN and infinity as null, as json_payload.
        keys = _keys(names)
        values = np.ascontiguousarray(np.stack(columns, axis=1), np.float64)
        flat, lengths = _native.objects(values, keys.flat, np.cumsum(keys.lengths))
        return Ragged(flat, lengths)
    plain = np.ones(rows, bool)  # rows written here as json.dumps writes them
    for column in columns:
        if column.dtype.kind == "f":
            plain &= np.isfinite(column)
    try:
        values, value_starts, value_lengths = _value_table(columns)
    except ValueError:
        plain[:] = False
    if plain.all():
        return _objects(names, values, value_starts, value_lengths)
    out = _objects(names, values, value_starts, value_lengths).to_list() if plain.any() else []
    if not out:
        out = [b""] * rows
    listed = [column.tolist() for column in columns]
    for i in np.flatnonzero(~plain).tolist():
        out[i] = json_payload({n: v[i] for n, v in zip(names, listed, strict=True)})
    return Ragged.of(out)


_CLOSE = np.frombuffer(b"}", np.uint8)


def _keys(names: Sequence[str]) -> Ragged:
    """What comes before each value: ``{"name 0": ``, ``, "name 1": ``, ..."""
    return Ragged.of([_key(j, name) for j, name in enumerate(names)])


def _key(j: int, name: str) -> bytes:
    return (("{" if j == 0 else ", ") + json.dumps(name) + ": ").encode()


def _objects(
    names: Sequence[str], values: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> Ragged:
    """Row *i*: ``{"name 0": value (i, 0), "name 1": value (i, 1), ...}``, every row put
    together by one gather from the keys and the values."""
    rows, count = starts.shape
    keys = _keys(names)
    texts = Ragged(np.concatenate([keys.flat, _CLOSE]), np.append(keys.lengths, 1))
    source = np.concatenate([texts.flat, values])
    segment_starts = np.empty((rows, 2 * count + 1), np.int64)
    segment_lengths = np.empty_like(segment_starts)
    segment_starts[:, 0:-1:2] = texts.starts[:-1]
    segment_lengths[:, 0:-1:2] = texts.lengths[:-1]
    segment_starts[:, 1::2] = starts + len(texts.flat)
    segment_lengths[:, 1::2] = lengths
    segment_starts[:, -1] = texts.starts[-1]
    segment_lengths[:, -1] = 1
    flat = gather(source, segment_starts.ravel(), segment_lengths.ravel())
    return Ragged(flat, segment_lengths.sum(axis=1))
