"""eva.dataset.columns' list and set helpers (numpy on the Arrow buffers) against
pyarrow.compute, which they replace on the export path (its import costs 50-60 ms a process)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eva.dataset.columns import (
    distinct_scalars,
    distinct_values,
    list_lengths,
    list_parent_indices,
    list_values,
)

ROWS = st.lists(st.lists(st.floats(allow_nan=False, width=32), max_size=5), max_size=30)


def _sliced(array: pa.Array, data: st.DataObject) -> pa.Array:
    start = data.draw(st.integers(0, len(array)))
    stop = data.draw(st.integers(start, len(array)))
    return array.slice(start, stop - start)


@pytest.mark.kernel_independent
@settings(max_examples=200, deadline=None)
@given(rows=ROWS, large=st.booleans(), data=st.data())
def test_list_helpers_agree_with_pyarrow_compute(rows, large, data) -> None:
    type_ = pa.large_list(pa.float32()) if large else pa.list_(pa.float32())
    array = _sliced(pa.array(rows, type=type_), data)
    assert list_lengths(array).tolist() == pc.list_value_length(array).to_pylist()
    assert list_values(array).equals(array.flatten())
    assert list_parent_indices(array).tolist() == pc.list_parent_indices(array).to_pylist()
    chunked = pa.chunked_array([array, array], type=type_)
    assert list_lengths(chunked).tolist() == pc.list_value_length(chunked).to_pylist()


@pytest.mark.kernel_independent
@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 4), rows=st.integers(0, 20), data=st.data())
def test_fixed_size_lists(size, rows, data) -> None:
    values = pa.array(np.arange(size * rows, dtype=np.float64))
    array = _sliced(pa.FixedSizeListArray.from_arrays(values, size), data)
    assert list_lengths(array).tolist() == [size] * len(array)
    assert list_values(array).equals(array.flatten())


@pytest.mark.kernel_independent
def test_null_rows_left_to_arrow() -> None:
    array = pa.array([[1.0], None, [2.0, 3.0]])
    assert list_values(array).to_pylist() == [1.0, 2.0, 3.0]


@pytest.mark.kernel_independent
@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(-5, 5) | st.none(), max_size=40), chunks=st.integers(1, 3))
def test_distinct_scalars_agree_with_unique(values, chunks) -> None:
    parts = [values[i::chunks] for i in range(chunks)]
    column = pa.chunked_array([pa.array(p, type=pa.int64()) for p in parts], type=pa.int64())
    expected = sorted(v for v in pc.unique(column).to_pylist() if v is not None)
    assert distinct_scalars(column) == expected
    plain = np.array([v for v in values if v is not None], dtype=np.int64)
    assert distinct_values(plain).tolist() == np.unique(plain).tolist()


@pytest.mark.parametrize("fmt", ["v3", "v21"])
def test_export_path_does_not_import_pyarrow_compute_or_numpy_ma(small_dataset, fmt) -> None:
    """The helpers exist to keep that import off the export path: prove it stays so. The same
    for numpy.ma (15 ms), which ``np.quantile`` would import through ``np.unique``."""
    src = small_dataset
    code = (
        "import sys\n"
        "from eva.export.pipeline import export_dataset\n"
        f"export_dataset({str(src)!r}, {fmt!r})\n"
        "print('pyarrow.compute' in sys.modules, 'numpy.ma' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
