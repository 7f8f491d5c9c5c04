"""The kept frames' pixel histograms a trim records (``eva.dataset.kept_histograms``): equal to a
full decode of the kept frames, exactly (histograms, frame counts, and the min/max/mean/std/count
derived from them); an export that uses them writes the same bytes as one that decodes; a row
that no longer describes the same frames (another trim, another MP4, a damaged row or file) is
not used; a cleared trim's row goes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from eva.dataset import layout
from eva.dataset.kept_histograms import kept_histograms, record_kept_histograms
from eva.dataset.reader import DatasetReader
from eva.dataset.stats import ImageStats
from eva.dataset.subset_edits import kept_frames
from eva.export.pipeline import export_dataset
from eva.export.source import kept_frame_stats
from eva.quality.edits import EditRequest, edit_episodes

CAMERAS = ["observation.images.front", "observation.images.wrist"]
TRIMS = {0: (5, 25), 1: (0, 31), 2: (19, 20)}  # start, end, one frame


@pytest.fixture()
def trimmed(tmp_path: Path) -> Path:
    from eva.capture.synthetic import write_synthetic_dataset

    root = write_synthetic_dataset(
        tmp_path / "raw", episodes=4, frames=[30, 32, 20, 12], cameras=CAMERAS, fps=30
    )
    for ep, trim in TRIMS.items():
        edit_episodes(root, [ep], EditRequest(trim=trim))
    return root


def decoded(root: Path, ep: int, key: str, trim: tuple[int, int]) -> ImageStats:
    """What the export computed before the cache: the kept frames decoded, in the driver."""
    reader = DatasetReader(root)
    image = ImageStats()
    for batch in kept_frames(reader.iter_frames(ep, key), trim):
        image.update(batch)
    return image


def cache_rows(root: Path) -> list[dict[str, object]]:
    path = root / layout.KEPT_HISTOGRAMS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_recorded_histograms_equal_a_full_decode_of_the_kept_frames(trimmed: Path) -> None:
    assert sorted(r["episode_index"] for r in cache_rows(trimmed)) == sorted(TRIMS)
    reader = DatasetReader(trimmed)
    for ep, trim in TRIMS.items():
        stats, histograms = kept_frame_stats(reader, ep, trim)
        for key in CAMERAS:
            image = decoded(trimmed, ep, key, trim)
            assert np.array_equal(histograms[key], image.histogram())
            assert stats[key] == image.result()  # min/max/mean/std/count, exact equality
            assert stats[key]["count"] == [trim[1] - trim[0]]


def test_export_with_the_cache_writes_what_a_decoding_export_writes(trimmed: Path) -> None:
    def exported(root: Path) -> dict[str, bytes]:
        out = export_dataset(root, "lerobot_v3").export_root
        return {
            p.relative_to(out).as_posix(): p.read_bytes()
            for p in sorted(out.rglob("*"))
            if p.is_file()
            and "/meta/quality_split.json" not in f"/{p.relative_to(out)}"
            and p.parent != out  # job.json, fingerprints.json, .eva-complete: ids and times
        }

    uncached = trimmed.parent / "uncached"
    shutil.copytree(trimmed, uncached, symlinks=True)
    (uncached / layout.KEPT_HISTOGRAMS).unlink()
    with_cache, without = exported(trimmed), exported(uncached)
    assert any(name.endswith("stats.json") for name in with_cache)
    assert with_cache == without


def test_a_row_that_no_longer_describes_the_kept_frames_is_decoded_again(trimmed: Path) -> None:
    reader = DatasetReader(trimmed)
    key = CAMERAS[0]
    truth = decoded(trimmed, 0, key, (6, 25)).histogram()
    assert not np.array_equal(truth, kept_histograms(reader, 0, (5, 25))[key].histogram)
    # another trim than the row's: decoded
    assert np.array_equal(kept_histograms(reader, 0, (6, 25))[key].histogram, truth)

    # damaged counts (the channel sums no longer make frames x H x W pixels): decoded
    rows = cache_rows(trimmed)
    rows[0]["videos"][key]["histogram"][0][0] += 1  # type: ignore[index]
    (trimmed / layout.KEPT_HISTOGRAMS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    fresh = DatasetReader(trimmed)
    assert np.array_equal(
        kept_histograms(fresh, 0, (5, 25))[key].histogram,
        decoded(trimmed, 0, key, (5, 25)).histogram(),
    )

    # another MP4 at the same path (an index re-recorded after a crash): decoded
    video = DatasetReader(trimmed).video_path(1, key)
    st = video.stat()
    os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    stale = DatasetReader(trimmed)
    assert _cached_keys(stale, 1, TRIMS[1]) == {CAMERAS[1]}

    # a file that is not JSON: every camera decoded, the export as without it
    (trimmed / layout.KEPT_HISTOGRAMS).write_text("{not json\n")
    broken = DatasetReader(trimmed)
    got = kept_histograms(broken, 2, TRIMS[2])
    assert np.array_equal(got[key].histogram, decoded(trimmed, 2, key, TRIMS[2]).histogram())


def _cached_keys(reader: DatasetReader, ep: int, trim: tuple[int, int]) -> set[str]:
    from eva.dataset import kept_histograms as module

    return set(module._cached(reader, ep, trim))


def test_cleared_and_changed_trims_rewrite_the_cache(trimmed: Path) -> None:
    edit_episodes(trimmed, [0], EditRequest(clear_trim=True))
    assert sorted(r["episode_index"] for r in cache_rows(trimmed)) == [1, 2]
    edit_episodes(trimmed, [1], EditRequest(trim=(3, 9)))
    assert {r["episode_index"]: r["trim"] for r in cache_rows(trimmed)} == {1: [3, 9], 2: [19, 20]}
    # a trim written by another tool (episodes.jsonl by hand): no row until eva records one
    path = trimmed / layout.EPISODES
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[3]["edit_trim"] = [2, 10]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert 3 not in {r["episode_index"] for r in cache_rows(trimmed)}
    assert record_kept_histograms(trimmed, [3]) == 1
    assert {r["episode_index"]: r["trim"] for r in cache_rows(trimmed)}[3] == [2, 10]
    assert record_kept_histograms(trimmed, [3]) == 0  # held already: nothing decoded
    edit_episodes(trimmed, [1, 2, 3], EditRequest(clear_trim=True))
    assert not (trimmed / layout.KEPT_HISTOGRAMS).exists()


def test_a_trim_is_stored_even_when_its_video_does_not_decode(trimmed: Path) -> None:
    video = DatasetReader(trimmed).video_path(3, CAMERAS[1])
    video.chmod(0o644)
    video.write_bytes(b"not an mp4")
    edit_episodes(trimmed, [3], EditRequest(trim=(1, 4)))
    row = {r["episode_index"]: r for r in cache_rows(trimmed)}[3]
    assert set(row["videos"]) == {CAMERAS[0]}  # type: ignore[arg-type]
