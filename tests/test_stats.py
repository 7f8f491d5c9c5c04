"""eva.dataset.stats: native kernel == numpy reference == direct numpy over the concatenated data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eva.dataset import stats

pytestmark = pytest.mark.kernels

FIXTURE = Path(__file__).parent / "fixtures" / "lerobot_v21_fixture"
QS = (0.0, 0.01, 0.10, 0.25, 0.50, 0.90, 0.99, 1.0)

HYPOTHESIS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(params=["native", "reference"])
def impl(request: pytest.FixtureRequest) -> tuple[type, type]:
    """(VectorStats class, ImageStats class) of one backend."""
    if request.param == "native":
        return stats.VectorStats, stats.ImageStats
    return stats.ReferenceVectorStats, stats.ReferenceImageStats


def _split(array: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    points = sorted({min(c, len(array)) for c in cuts})
    return np.split(array, points)


def _feed(accumulator: Any, batches: list[np.ndarray]) -> Any:
    for batch in batches:
        accumulator.update(batch)
    return accumulator


def _flat(nested: Any) -> np.ndarray:
    return np.asarray(nested, dtype=np.float64).reshape(-1)


# --------------------------------------------------------------------------------------------------
# Vectors
# --------------------------------------------------------------------------------------------------

vector_dtypes = st.sampled_from([np.float32, np.float64, np.int64])


@st.composite
def vector_batches(draw: st.DrawFn) -> tuple[np.ndarray, list[int]]:
    dtype = draw(vector_dtypes)
    n = draw(st.integers(1, 80))
    dim = draw(st.integers(1, 7))
    if dtype is np.int64:
        elements = st.integers(-(10**9), 10**9)
    else:
        width = 32 if dtype is np.float32 else 64
        elements = st.floats(-1e6, 1e6, allow_nan=False, width=width)
    values = draw(hnp.arrays(dtype, (n, dim), elements=elements))
    cuts = draw(st.lists(st.integers(0, n), max_size=4))
    return values, cuts


def _check_vector_against_numpy(result: dict, values: np.ndarray) -> None:
    exact = values.astype(np.float64)
    scale = float(np.abs(exact).max()) + 1.0
    assert result["count"] == [len(values)]
    np.testing.assert_array_equal(result["min"], exact.min(axis=0))
    np.testing.assert_array_equal(result["max"], exact.max(axis=0))
    np.testing.assert_allclose(result["mean"], exact.mean(axis=0), rtol=1e-12, atol=1e-13 * scale)
    np.testing.assert_allclose(result["std"], exact.std(axis=0), rtol=1e-9, atol=1e-12 * scale)


@HYPOTHESIS
@given(data=vector_batches())
def test_vector_stats_batch_fed_equals_numpy_on_concatenation(
    impl: tuple[type, type], data: tuple[np.ndarray, list[int]]
) -> None:
    values, cuts = data
    vector_cls, _ = impl
    batched = _feed(vector_cls(values.shape[1]), _split(values, cuts)).result()
    whole = _feed(vector_cls(values.shape[1]), [values]).result()
    _check_vector_against_numpy(batched, values)
    for key in ("min", "max", "count"):
        assert batched[key] == whole[key]
    scale = float(np.abs(values.astype(np.float64)).max()) + 1.0
    np.testing.assert_allclose(batched["mean"], whole["mean"], rtol=1e-12, atol=1e-13 * scale)
    np.testing.assert_allclose(batched["std"], whole["std"], rtol=1e-9, atol=1e-12 * scale)


@pytest.mark.native
@HYPOTHESIS
@given(data=vector_batches())
def test_vector_native_equals_reference(data: tuple[np.ndarray, list[int]]) -> None:
    values, cuts = data
    dim = values.shape[1]
    native = _feed(stats.VectorStats(dim), _split(values, cuts)).result()
    reference = _feed(stats.ReferenceVectorStats(dim), _split(values, cuts)).result()
    assert native["min"] == reference["min"]
    assert native["max"] == reference["max"]
    assert native["count"] == reference["count"]
    scale = float(np.abs(values.astype(np.float64)).max()) + 1.0
    np.testing.assert_allclose(native["mean"], reference["mean"], rtol=1e-12, atol=1e-13 * scale)
    np.testing.assert_allclose(native["std"], reference["std"], rtol=1e-10, atol=1e-12 * scale)


def test_vector_std_is_stable_under_a_large_offset(impl: tuple[type, type]) -> None:
    # A naive E[x^2] - E[x]^2 in float64 loses every digit here (offset^2 ~ 1e18 vs var ~ 1e-2).
    rng = np.random.default_rng(7)
    values = 1e9 + rng.normal(0.0, 0.1, size=(3000, 2))
    vector_cls, _ = impl
    result = _feed(vector_cls(2), np.array_split(values, 17)).result()
    np.testing.assert_allclose(result["std"], values.std(axis=0), rtol=1e-6)


def test_vector_float32_input_is_accumulated_in_float64(impl: tuple[type, type]) -> None:
    rng = np.random.default_rng(3)
    values = (0.45 + rng.random((200_000, 1))).astype(np.float32)
    vector_cls, _ = impl
    result = _feed(vector_cls(1), np.array_split(values, 9)).result()
    np.testing.assert_allclose(result["mean"], values.astype(np.float64).mean(axis=0), rtol=1e-12)


def test_vector_one_dimensional_input_is_one_column(impl: tuple[type, type]) -> None:
    vector_cls, _ = impl
    result = _feed(vector_cls(1), [np.arange(5, dtype=np.int64), np.array([10.0])]).result()
    assert result["count"] == [6]
    assert result["min"] == [0.0] and result["max"] == [10.0]
    assert result["mean"] == pytest.approx([20.0 / 6.0], rel=1e-15)
    assert result["std"] == pytest.approx([float(np.std([0, 1, 2, 3, 4, 10]))], rel=1e-14)
    json.dumps(result)


def test_vector_nan_propagates_like_numpy(impl: tuple[type, type]) -> None:
    vector_cls, _ = impl
    values = np.array([[1.0, 2.0], [np.nan, 3.0], [0.5, -1.0]])
    result = _feed(vector_cls(2), [values[:1], values[1:]]).result()
    assert np.isnan(result["min"][0]) and np.isnan(result["max"][0])
    assert np.isnan(result["mean"][0]) and np.isnan(result["std"][0])
    assert result["min"][1] == -1.0 and result["max"][1] == 3.0


def test_vector_rejects_bad_input(impl: tuple[type, type]) -> None:
    vector_cls, _ = impl
    accumulator = vector_cls(3)
    with pytest.raises(ValueError, match=r"\(n, 3\)"):
        accumulator.update(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="numeric"):
        accumulator.update(np.array([["a", "b", "c"]]))
    with pytest.raises(ValueError, match="no samples"):
        accumulator.result()
    accumulator.update(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="no samples"):
        accumulator.result()


def test_vector_stats_match_lerobot_on_its_own_fixture(impl: tuple[type, type]) -> None:
    """LeRobot 0.3.3 computed the fixture's episodes_stats; our numbers must agree."""
    vector_cls, _ = impl
    rows = [
        json.loads(line)
        for line in (FIXTURE / "meta" / "episodes_stats.jsonl").read_text().splitlines()
    ]
    for row in rows:
        episode = row["episode_index"]
        table = pq.read_table(FIXTURE / "data" / "chunk-000" / f"episode_{episode:06d}.parquet")
        for feature in ("observation.state", "action"):
            values = np.stack(table.column(feature).to_numpy(zero_copy_only=False))
            ours = _feed(vector_cls(values.shape[1]), np.array_split(values, 3)).result()
            theirs = row["stats"][feature]
            assert ours["count"] == theirs["count"]
            for key in ("min", "max", "mean", "std"):
                np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------------


@st.composite
def frame_batches(draw: st.DrawFn) -> tuple[np.ndarray, list[int]]:
    n = draw(st.integers(1, 5))
    height = draw(st.integers(1, 9))
    width = draw(st.integers(1, 11))
    # Narrow value ranges too, so min/max and quantiles land on interesting bins.
    low = draw(st.integers(0, 255))
    high = draw(st.integers(low, 255))
    frames = draw(hnp.arrays(np.uint8, (n, height, width, 3), elements=st.integers(low, high)))
    cuts = draw(st.lists(st.integers(0, n), max_size=3))
    return frames, cuts


def _direct_image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    scaled = frames.astype(np.float64) / 255.0
    return {
        "min": scaled.min(axis=(0, 1, 2)),
        "max": scaled.max(axis=(0, 1, 2)),
        "mean": scaled.mean(axis=(0, 1, 2)),
        "std": scaled.std(axis=(0, 1, 2)),
    }


def _check_image_shape(result: dict) -> None:
    for key in ("min", "max", "mean", "std"):
        assert np.asarray(result[key]).shape == (3, 1, 1)
        assert all(isinstance(v[0][0], float) for v in result[key])


@HYPOTHESIS
@given(data=frame_batches())
def test_image_stats_batch_fed_equals_numpy_on_concatenation(
    impl: tuple[type, type], data: tuple[np.ndarray, list[int]]
) -> None:
    frames, cuts = data
    _, image_cls = impl
    accumulator = _feed(image_cls(), _split(frames, cuts))
    result = accumulator.result()
    _check_image_shape(result)
    assert result["count"] == [len(frames)]
    direct = _direct_image_stats(frames)
    np.testing.assert_array_equal(_flat(result["min"]), direct["min"])
    np.testing.assert_array_equal(_flat(result["max"]), direct["max"])
    np.testing.assert_allclose(_flat(result["mean"]), direct["mean"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_flat(result["std"]), direct["std"], rtol=1e-9, atol=1e-12)
    expected_histogram = np.stack(
        [np.bincount(frames[..., c].ravel(), minlength=256) for c in range(3)]
    )
    histogram = accumulator.histogram()
    assert histogram.dtype == np.uint64 and histogram.shape == (3, 256)
    np.testing.assert_array_equal(histogram, expected_histogram)


@pytest.mark.native
@HYPOTHESIS
@given(data=frame_batches())
def test_image_native_equals_reference(data: tuple[np.ndarray, list[int]]) -> None:
    frames, cuts = data
    native = _feed(stats.ImageStats(), _split(frames, cuts))
    reference = _feed(stats.ReferenceImageStats(), _split(frames, cuts))
    np.testing.assert_array_equal(native.histogram(), reference.histogram())
    assert native.result() == reference.result()


@pytest.mark.native
def test_image_native_large_frames_equal_reference() -> None:
    """Full-size frames exercise the 4-pixel unrolled path and the channel phase of the tail."""
    rng = np.random.default_rng(11)
    frames = rng.integers(0, 256, size=(3, 97, 131, 3), dtype=np.uint8)
    frames[1, :40] = 200  # long runs of one value (flat regions)
    native = _feed(stats.ImageStats(), [frames[:2], frames[2:]])
    reference = _feed(stats.ReferenceImageStats(), [frames])
    np.testing.assert_array_equal(native.histogram(), reference.histogram())
    assert native.result() == reference.result()


def test_image_accepts_single_frame_and_non_contiguous_input(impl: tuple[type, type]) -> None:
    _, image_cls = impl
    rng = np.random.default_rng(5)
    big = rng.integers(0, 256, size=(2, 10, 12, 3), dtype=np.uint8)
    view = big[:, ::2, 1::3]  # strided view
    accumulator = _feed(image_cls(), [view[0], view[1:]])
    result = accumulator.result()
    assert result["count"] == [2]
    np.testing.assert_allclose(_flat(result["mean"]), _direct_image_stats(view)["mean"], rtol=1e-12)


def test_read_only_buffers_are_accepted(impl: tuple[type, type]) -> None:
    vector_cls, image_cls = impl
    frames = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
    frames.flags.writeable = False
    assert image_cls().update(frames) is None
    values = np.linspace(0, 1, 12, dtype=np.float32).reshape(4, 3)
    values.flags.writeable = False
    accumulator = vector_cls(3)
    accumulator.update(values)
    assert accumulator.result()["max"] == pytest.approx(values.max(axis=0).tolist())


def test_image_rejects_bad_input(impl: tuple[type, type]) -> None:
    _, image_cls = impl
    accumulator = image_cls()
    with pytest.raises(ValueError, match="uint8"):
        accumulator.update(np.zeros((1, 4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"\(n, H, W, 3\)"):
        accumulator.update(np.zeros((1, 4, 4, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="no frames"):
        accumulator.result()


@HYPOTHESIS
@given(data=frame_batches(), qs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5))
def test_quantiles_from_histogram_equal_np_quantile(
    data: tuple[np.ndarray, list[int]], qs: list[float]
) -> None:
    frames, _ = data
    accumulator = _feed(stats.ImageStats(), [frames])
    qs = sorted(set(qs) | {0.01, 0.5, 0.99})
    keys = {stats.quantile_key(q) for q in qs}
    if len(keys) != len(qs):
        return  # two drawn quantiles round to the same key name; nothing to compare
    quantiles = stats.quantiles_from_histogram(accumulator.histogram(), qs)
    pixels = frames.reshape(-1, 3)
    for q in qs:
        got = np.asarray(quantiles[stats.quantile_key(q)])
        assert got.shape == (3, 1, 1)
        expected = np.quantile(pixels, q, axis=0) / 255.0
        # Documented bound: equal to np.quantile (linear) up to 1e-12 on the 0..1 scale.
        np.testing.assert_allclose(got.reshape(-1), expected, rtol=0, atol=1e-12)


def test_quantile_keys_follow_lerobot_names() -> None:
    assert [stats.quantile_key(q) for q in stats.DEFAULT_QUANTILES] == [
        "q01",
        "q10",
        "q50",
        "q90",
        "q99",
    ]
    assert stats.quantile_key(0.995) == "q99.5"
    with pytest.raises(ValueError):
        stats.quantile_key(1.5)


def test_vector_quantiles_equal_np_quantile() -> None:
    rng = np.random.default_rng(2)
    values = rng.normal(size=(301, 4)).astype(np.float32)
    result = stats.vector_quantiles(values)
    assert list(result) == ["q01", "q10", "q50", "q90", "q99"]
    for q in stats.DEFAULT_QUANTILES:
        np.testing.assert_allclose(
            result[stats.quantile_key(q)],
            np.quantile(values.astype(np.float64), q, axis=0),
            rtol=1e-15,
        )
    assert stats.vector_quantiles(np.arange(4.0), qs=(0.5,)) == {"q50": [1.5]}
    json.dumps(result)


# --------------------------------------------------------------------------------------------------
# Merging
# --------------------------------------------------------------------------------------------------


def _episodes(seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """Per-episode raw data; episode 2 lacks the wrist camera, lengths differ."""
    rng = np.random.default_rng(seed)
    episodes = []
    for index in range(count):
        length = int(rng.integers(1, 40))
        episode = {
            "observation.state": rng.normal(index, 1.0 + index, size=(length, 5)),
            "action": rng.normal(-index, 0.5, size=(length, 2)).astype(np.float32),
            "timestamp": np.arange(length, dtype=np.float32) / 30.0,
            "observation.images.front": rng.integers(
                index * 10, 256, size=(length, 6, 8, 3), dtype=np.uint8
            ),
        }
        if index != 2:
            episode["observation.images.wrist"] = rng.integers(
                0, 256 - index * 20, size=(length, 4, 4, 3), dtype=np.uint8
            )
        episodes.append(episode)
    return episodes


def _episode_stats(episode: dict[str, np.ndarray]) -> dict[str, dict]:
    result = {}
    for feature, data in episode.items():
        if data.dtype == np.uint8:
            accumulator = stats.ImageStats()
        else:
            accumulator = stats.VectorStats(1 if data.ndim == 1 else data.shape[1])
        accumulator.update(data)
        # Round-trip through JSON, like episodes_stats.jsonl.
        result[feature] = json.loads(json.dumps(accumulator.result()))
    return result


def _assert_stats_close(got: dict, expected: dict, rtol: float = 1e-10) -> None:
    assert got.keys() == expected.keys()
    for feature in expected:
        assert got[feature]["count"] == expected[feature]["count"], feature
        for key in ("min", "max", "mean", "std"):
            g = np.asarray(got[feature][key])
            e = np.asarray(expected[feature][key])
            assert g.shape == e.shape, (feature, key)
            np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-12, err_msg=f"{feature}.{key}")


def test_merge_stats_equals_direct_stats_of_concatenated_episodes() -> None:
    episodes = _episodes(seed=1, count=5)
    merged = stats.merge_stats([_episode_stats(e) for e in episodes])
    direct = {}
    for feature in episodes[0]:
        concatenated = np.concatenate([e[feature] for e in episodes if feature in e])
        direct.update(_episode_stats({feature: concatenated}))
    _assert_stats_close(merged, direct)
    # The wrist camera is missing from episode 2: only the other episodes' frames count.
    lengths = [len(e["timestamp"]) for e in episodes]
    assert merged["observation.images.wrist"]["count"] == [sum(lengths) - lengths[2]]
    assert np.asarray(merged["observation.images.front"]["mean"]).shape == (3, 1, 1)
    json.dumps(merged)


def test_merge_stats_accepts_numpy_values_and_skips_empty() -> None:
    a = {"x": {"min": np.array([1.0]), "max": np.array([3.0]), "mean": np.array([2.0]),
               "std": np.array([1.0]), "count": np.array([2])}}  # fmt: skip
    empty = {"x": {"min": [0.0], "max": [0.0], "mean": [0.0], "std": [0.0], "count": [0]}}
    assert stats.merge_stats([a, empty]) == {
        "x": {"min": [1.0], "max": [3.0], "mean": [2.0], "std": [1.0], "count": [2]}
    }
    assert stats.merge_stats([]) == {}


def test_merge_stats_rejects_inconsistent_shapes() -> None:
    a = {"x": {"min": [1.0], "max": [3.0], "mean": [2.0], "std": [1.0], "count": [2]}}
    b = {"x": {"min": [1.0, 2.0], "max": [3.0, 4.0], "mean": [2.0, 3.0], "std": [1.0, 1.0],
               "count": [2]}}  # fmt: skip
    with pytest.raises(ValueError, match="'x'"):
        stats.merge_stats([a, b])
    with pytest.raises(ValueError, match="count"):
        stats.merge_stats([{"x": {"min": [1.0], "max": [1.0], "mean": [1.0], "std": [0.0]}}])


@pytest.mark.parametrize("seed_episodes", [0, 1, 3, 6])
def test_running_merge_seeded_from_stats_json_equals_full_merge(seed_episodes: int) -> None:
    per_episode = [_episode_stats(e) for e in _episodes(seed=4, count=6)]
    full = stats.merge_stats(per_episode)
    if seed_episodes:
        # What the writer does: stats.json on disk holds the merge of the episodes so far.
        stats_json = json.loads(json.dumps(stats.merge_stats(per_episode[:seed_episodes])))
        running = stats.RunningMerge.from_stats(stats_json)
    else:
        running = stats.RunningMerge()
    for episode in per_episode[seed_episodes:]:
        running.add(episode)
    _assert_stats_close(running.result(), full, rtol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    values=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=40),
        elements=st.floats(allow_nan=False, allow_infinity=False, width=64)
        | st.sampled_from([0.0, -0.0, 1.0, -1.0]),
    ),
    qs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12),
)
def test_linear_quantiles_are_np_quantile_bit_for_bit(values: np.ndarray, qs: list[float]) -> None:
    """The v3 export's vector quantiles without ``np.quantile`` (it imports numpy.ma): the
    same floats, signed zeros included, for any finite values and quantiles."""
    q = np.asarray(qs + list(stats.DEFAULT_QUANTILES), dtype=np.float64)
    want = np.quantile(values, q, axis=0)
    got = stats._linear_quantiles(values, q)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
