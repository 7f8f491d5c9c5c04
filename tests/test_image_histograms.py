"""eva's recorded image histograms (meta/eva_image_histograms.jsonl): written by the raw writer,
read back, validated, carried into subsets, and turned into exact v3 image quantiles.

The histograms count the frames as given to the writer (before encoding), like the image
mean/std; so the reference here is ``np.quantile`` over the frames that were written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from eva.dataset import atomic, layout
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta, build_subset_meta
from eva.dataset.validate import validate_dataset
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec
from eva.export.source import complete_episode_stats
from eva.formats import lerobot_v3, lerobot_v21
from eva.formats.base import ExportOptions
from eva.formats.options import LeRobotV3Options
from eva.progress import Progress

CAMS = ["observation.images.front", "observation.images.wrist"]
LENGTHS = [12, 9, 14]
H, W = 48, 64
QS = (0.01, 0.10, 0.50, 0.90, 0.99)


def _frames(seed: int, n: int) -> np.ndarray:
    """Smooth gradients plus noise: a spread of values, different per channel."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    base = np.stack([x * 3, y * 4, (x + y) * 2], axis=-1).astype(np.int64)
    frames = base[None] + rng.integers(-40, 40, (n, H, W, 3)) + np.arange(n)[:, None, None, None]
    return np.clip(frames, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    """A raw dataset and the frames given to the writer: {episode: {camera: (n, H, W, 3)}}."""
    root = tmp_path_factory.mktemp("hist") / "raw"
    given: dict[int, dict[str, np.ndarray]] = {}
    with DatasetWriter.create_or_open(
        root,
        fps=30,
        cameras=[CameraSpec(k, H, W) for k in CAMS],
        vectors=[VectorSpec("observation.state", 2), VectorSpec("action", 2)],
        durable=False,
    ) as writer:
        for ep, n in enumerate(LENGTHS):
            images = {k: _frames(10 * ep + i, n) for i, k in enumerate(CAMS)}
            vec = np.random.default_rng(ep).normal(size=(n, 2)).astype(np.float32)
            with writer.begin_episode("pick") as episode:
                half = n // 2  # two add_frames calls: the histogram spans batches
                for part in (slice(0, half), slice(half, n)):
                    episode.add_frames(
                        {k: v[part] for k, v in images.items()},
                        {"observation.state": vec[part], "action": vec[part]},
                    )
                assert episode.commit() == ep
            given[ep] = images
    return root, given


def _bincount(frames: np.ndarray) -> np.ndarray:
    return np.stack(
        [np.bincount(frames[..., c].reshape(-1), minlength=256) for c in range(3)]
    ).astype(np.uint64)


def test_writer_records_histograms_of_the_given_frames(written: tuple[Path, Any]) -> None:
    root, given = written
    reader = DatasetReader(root)
    for ep, images in given.items():
        hists = reader.image_histograms(ep)
        assert hists is not None and set(hists) == set(CAMS)
        for key, frames in images.items():
            assert hists[key].dtype == np.uint64 and hists[key].shape == (3, 256)
            np.testing.assert_array_equal(hists[key], _bincount(frames))
    assert reader.image_histograms(99) is None
    # Kept out of episodes_stats.jsonl: LeRobot wants image stats of shape (3, 1, 1) there.
    for row in atomic.read_jsonl(root / layout.EPISODES_STATS):
        assert set(row) == {"episode_index", "stats"}
        assert np.asarray(row["stats"][CAMS[0]]["mean"]).shape == (3, 1, 1)
    assert validate_dataset(root) == []


def test_reopen_prunes_orphan_and_superseded_rows(
    written: tuple[Path, Any], tmp_path: Path
) -> None:
    src, _ = written
    root = tmp_path / "raw"
    shutil.copytree(src, root)
    path = root / layout.IMAGE_HISTOGRAMS
    rows = atomic.read_jsonl(path)
    # A crash after the sidecar append but before the commit point (episode 3 never committed),
    # an earlier superseded row of episode 1, and a torn fragment.
    orphan = {"episode_index": 3, "histograms": rows[0]["histograms"]}
    stale = {"episode_index": 1, "histograms": rows[0]["histograms"]}
    data = b"".join(atomic.jsonl_line(r) for r in [rows[0], stale, rows[1], rows[2], orphan])
    path.write_bytes(data + b'{"episode_index": 4, "histo')
    assert DatasetReader(root).image_histograms(3) is None  # not an episode: ignored
    DatasetWriter.create_or_open(
        root,
        fps=30,
        cameras=[CameraSpec(k, H, W) for k in CAMS],
        vectors=[VectorSpec("observation.state", 2), VectorSpec("action", 2)],
        durable=False,
    ).close()
    assert atomic.read_jsonl(path) == rows
    assert path.read_bytes().endswith(b"\n")


def test_validator_tolerates_absence_and_reports_malformed(
    written: tuple[Path, Any], tmp_path: Path
) -> None:
    root = tmp_path / "raw"
    shutil.copytree(written[0], root)
    path = root / layout.IMAGE_HISTOGRAMS
    good = path.read_bytes()
    path.unlink()  # LeRobot-written datasets have no sidecar
    assert validate_dataset(root) == []
    assert DatasetReader(root).image_histograms(0) is None

    rows = [json.loads(line) for line in good.splitlines()]
    bad_shape = json.loads(json.dumps(rows[0]))
    bad_shape["histograms"][CAMS[0]] = [[1] * 255] * 3
    for broken in (
        [bad_shape],
        [
            {
                "episode_index": 0,
                "histograms": {"observation.images.nope": rows[0]["histograms"][CAMS[0]]},
            }
        ],
        [{"episode_index": "0", "histograms": {}}],
    ):
        path.write_bytes(b"".join(atomic.jsonl_line(r) for r in broken))
        problems = validate_dataset(root)
        assert [p.code for p in problems] == ["invalid_image_histograms"], problems
        assert str(path) in problems[0].message

    # Well-formed, but not counting the episode's pixels (here: episode 1's counts for episode 0).
    wrong = [dict(rows[0], histograms=rows[1]["histograms"])] + rows[1:]
    path.write_bytes(b"".join(atomic.jsonl_line(r) for r in wrong))
    problems = validate_dataset(root)
    assert {(p.code, p.episode) for p in problems} == {("invalid_image_histograms", 0)}
    assert f"{LENGTHS[0]} frames of {W}x{H}" in problems[0].message


def _meta(reader: DatasetReader, indices: list[int], histograms: Any) -> SubsetMeta:
    rows = {row["episode_index"]: row for row in reader.episodes}
    return build_subset_meta(
        "accepted",
        source_info=reader.info,
        source_episodes=rows,
        source_tasks=reader.tasks,
        source_episodes_stats={ep: complete_episode_stats(reader, ep) for ep in rows},
        source_indices=indices,
        task_index_values={
            ep: reader.read_table(ep, ["task_index"]).column("task_index").to_numpy() for ep in rows
        },
        source_image_histograms=histograms,
    )


def _np_quantiles(frames: list[np.ndarray]) -> dict[str, np.ndarray]:
    pixels = np.concatenate([f.reshape(-1, 3) for f in frames]).astype(np.float64) / 255.0
    table = np.quantile(pixels, QS, axis=0)
    return {f"q{round(q * 100):02d}": table[i] for i, q in enumerate(QS)}


@pytest.mark.parametrize("verify_decode", [False, True])
def test_v3_image_quantiles_are_exact_from_recorded_histograms(
    written: tuple[Path, Any], tmp_path: Path, verify_decode: bool
) -> None:
    root, given = written
    reader = DatasetReader(root)
    indices = [2, 0]  # a subset, renumbered: output 0 is source 2
    meta = _meta(reader, indices, reader.all_image_histograms)
    assert meta.has_all_image_histograms()
    dest = tmp_path / "v3"
    options = ExportOptions(format=LeRobotV3Options(verify_decode=verify_decode))
    lerobot_v3.write_subset(reader, meta, dest, Progress(), options)
    assert lerobot_v3.verify(dest) == []

    stats = json.loads((dest / layout.STATS).read_text())
    episodes = pq.read_table(dest / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for key in CAMS:
        want = _np_quantiles([given[src][key] for src in indices])
        for name, value in want.items():
            got = np.asarray(stats[key][name]).reshape(3)
            np.testing.assert_allclose(got, value, rtol=0, atol=1e-12)
        for out, src in enumerate(indices):
            per_episode = _np_quantiles([given[src][key]])
            for name, value in per_episode.items():
                got = np.asarray(episodes[out][f"stats/{key}/{name}"]).reshape(3)
                np.testing.assert_allclose(got, value, rtol=0, atol=1e-12)
    # The subset carries the sidecar, renumbered.
    carried = DatasetReader(dest).all_image_histograms
    assert sorted(carried) == [0, 1]
    np.testing.assert_array_equal(carried[0][CAMS[1]], _bincount(given[2][CAMS[1]]))


def test_v3_falls_back_to_the_keyframe_sample_without_complete_histograms(
    written: tuple[Path, Any], tmp_path: Path
) -> None:
    root, _ = written
    reader = DatasetReader(root)
    partial = {ep: h for ep, h in reader.all_image_histograms.items() if ep != 1}
    with_partial, without = tmp_path / "partial", tmp_path / "none"
    for dest, hists in ((with_partial, partial), (without, None)):
        meta = _meta(reader, [0, 1, 2], hists)
        lerobot_v3.write_subset(reader, meta, dest, Progress(), ExportOptions())
    a = json.loads((with_partial / layout.STATS).read_text())
    b = json.loads((without / layout.STATS).read_text())
    assert a[CAMS[0]]["q50"] == b[CAMS[0]]["q50"]
    exact = _np_quantiles([g[CAMS[0]] for g in written[1].values()])
    # the sample (one keyframe per episode) is not the all-frames value here
    assert not np.allclose(np.asarray(a[CAMS[0]]["q01"]).reshape(3), exact["q01"], atol=1e-12)


def test_v21_export_carries_the_sidecar_renumbered(
    written: tuple[Path, Any], tmp_path: Path
) -> None:
    root, given = written
    reader = DatasetReader(root)
    meta = _meta(reader, [1, 2], reader.all_image_histograms)
    dest = tmp_path / "v21"
    lerobot_v21.write_subset(reader, meta, dest, Progress(), ExportOptions())
    out = DatasetReader(dest)
    assert sorted(out.all_image_histograms) == [0, 1]
    for new, src in enumerate([1, 2]):
        for key in CAMS:
            np.testing.assert_array_equal(
                out.image_histograms(new)[key], _bincount(given[src][key])
            )
    assert validate_dataset(dest) == []
