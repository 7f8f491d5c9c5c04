"""The zarr format (diffusion_policy's ReplayBuffer layout), end to end with the zarr library of
eva's venv: every frame and row of the store equals the source's, edits (trim, task) applied,
the options, the write past the page cache giving the same bytes, ``eva verify`` finding a
damaged store, and the format reported unavailable without its extra.

The trainers' own readers (diffusion_policy's ReplayBuffer, zarr 3) read the same stores in
tests/test_zarr_oracles.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr", reason="the zarr extra (make build installs it)")

from eva.capture.synthetic import write_synthetic_dataset  # noqa: E402
from eva.dataset.reader import DatasetReader  # noqa: E402
from eva.export.pipeline import export_dataset  # noqa: E402
from eva.export.verify import verify_export  # noqa: E402
from eva.formats.base import ExportOptions, OptionError  # noqa: E402
from eva.formats.options import ZarrOptions  # noqa: E402
from eva.quality.edits import EditRequest, edit_episodes  # noqa: E402

CAMERAS = ("observation.images.front", "observation.images.wrist")
TRIM = (5, 25)  # of source episode 2 (30 frames)
STORE = "replay_buffer.zarr"


def make_source(root: Path) -> Path:
    """4 episodes (20, 25, 30, 12 frames), 2 cameras: 1 judged fail, 2 trimmed, 3 re-tasked."""
    source = write_synthetic_dataset(
        root / "raw",
        episodes=4,
        frames=[20, 25, 30, 12],
        cameras=CAMERAS,
        qc_verdicts=[None, "fail", None, "pass"],
        qc_notes=[None, "gripper slipped", None, None],
        tasks=["pick", "place", "pick", "place"],
    )
    edit_episodes(source, [2], EditRequest(trim=TRIM))
    edit_episodes(source, [3], EditRequest(task="stack the cups"))
    return source


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("zarr"))


@pytest.fixture(scope="module")
def exported(source: Path) -> Path:
    export_dataset(source, "zarr")
    return source.parent / "export" / "zarr"


def expected_subset(source: Path, indices: list[int], trims: dict[int, tuple[int, int]]) -> dict:
    """The source's rows and frames of ``indices``, concatenated, each cut to its trim."""
    reader = DatasetReader(source)
    columns: dict[str, list[np.ndarray]] = {"observation.state": [], "action": []}
    frames: dict[str, list[np.ndarray]] = {key: [] for key in CAMERAS}
    for src in indices:
        start, end = trims.get(src, (0, reader.length(src)))
        table = reader.read_table(src)
        for name in columns:
            columns[name].append(np.stack(table.column(name).to_pylist())[start:end])
        for key in CAMERAS:
            every = np.concatenate([b.copy() for b in reader.iter_frames(src, key)])
            frames[key].append(every[start:end])
    return {name: np.concatenate(parts) for name, parts in {**columns, **frames}.items()}


def test_store_holds_the_source_frames_and_rows(source: Path, exported: Path) -> None:
    root = zarr.open_group(str(exported / "accepted" / STORE), mode="r")
    assert root["meta/episode_ends"][:].tolist() == [20, 40, 52]
    assert root["meta/episode_ends"].dtype == np.int64
    expected = expected_subset(source, [0, 2, 3], {2: TRIM})
    for name, values in expected.items():
        array = root["data"][name]
        assert array.shape == values.shape and np.array_equal(array[:], values), name
    for key in CAMERAS:
        camera = root["data"][key]
        assert camera.dtype == np.uint8 and camera.chunks == (1, *camera.shape[1:])
        assert camera.compressor is None
    assert root["data/observation.state"].dtype == np.float32
    assert root["data/episode_index"][:].tolist() == [0] * 20 + [1] * 20 + [2] * 12
    timestamps = root["data/timestamp"][:]
    assert timestamps[20] == 0.0 and timestamps[39] == pytest.approx(19 / 30)
    # provenance: source indices, verdicts, notes, tasks (the edited one included)
    eva = root.attrs["eva"]
    assert eva["subset"] == "accepted" and eva["source_episode_indices"] == [0, 2, 3]
    assert [row["length"] for row in eva["episodes"]] == [20, 20, 12]
    tasks = eva["tasks"]
    task_rows = root["data/task_index"][:]
    assert tasks[str(task_rows[-1])] == "stack the cups" and tasks[str(task_rows[0])] == "pick"
    assert eva["episodes"][2]["qc_verdict"] == "pass"
    rejected = zarr.open_group(str(exported / "rejected" / STORE), mode="r")
    assert rejected.attrs["eva"]["episodes"][0]["qc_note"] == "gripper slipped"
    assert rejected["meta/episode_ends"][:].tolist() == [25]
    info = json.loads((exported / "accepted" / "meta" / "info.json").read_text())
    assert info["dataset_format"] == "zarr" and info["data_path"] == STORE
    assert info["total_frames"] == 52 and info["embedded_images"] is True
    assert (exported / "accepted" / "meta" / "quality_split.json").is_file()


def test_verify_passes_and_finds_a_damaged_store(exported: Path, tmp_path: Path) -> None:
    for subset in ("accepted", "rejected"):
        assert verify_export(exported / subset) == []
    copy = tmp_path / "export" / "zarr"
    shutil.copytree(exported, copy)
    accepted = copy / "accepted"
    ends = accepted / STORE / "meta" / "episode_ends" / "0"
    ends.write_bytes(np.asarray([20, 41, 52], np.int64).tobytes())
    problems = verify_export(accepted, fmt="zarr")
    assert any(p.code == "episode_ends" for p in problems), problems
    shutil.rmtree(accepted / STORE / "data" / "action")
    ends.write_bytes(np.asarray([20, 40, 52], np.int64).tobytes())
    problems = verify_export(accepted, fmt="zarr")
    assert any("data/action missing" in p.message for p in problems), problems


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "quality_split.json"
    }


def test_zstd_chunks_read_back_and_the_page_cache_path_writes_the_same_bytes(
    tmp_path: Path,
) -> None:
    """Blosc/zstd chunks are what zarr itself would store (read back equal to the raw export),
    and an export with EVA_DIRECT_IO=0 writes the same bytes as one past the page cache."""
    source = make_source(tmp_path / "a")
    options = ExportOptions(format=ZarrOptions(image_compressor="zstd", compression_level=5))
    export_dataset(source, "zarr", options=options)
    raw_root = source.parent / "export" / "zarr"
    packed = zarr.open_group(str(raw_root / "accepted" / STORE), mode="r")
    camera = packed["data"][CAMERAS[0]]
    assert camera.compressor.cname == "zstd" and camera.compressor.clevel == 5
    expected = expected_subset(source, [0, 2, 3], {2: TRIM})
    assert np.array_equal(camera[:], expected[CAMERAS[0]])
    # zarr itself stores the same chunk bytes for that frame
    mine = (raw_root / "accepted" / STORE / "data" / CAMERAS[0] / "7.0.0.0").read_bytes()
    theirs = zarr.open_array(
        str(tmp_path / "theirs.zarr"),
        mode="w",
        shape=camera.shape,
        chunks=camera.chunks,
        dtype=np.uint8,
        compressor=camera.compressor,
    )
    theirs[7] = camera[7]
    assert (tmp_path / "theirs.zarr" / "7.0.0.0").read_bytes() == mine
    # an uncompressed export, with and without O_DIRECT
    export_dataset(source, "zarr")
    first = tree_digest(raw_root / "accepted" / STORE)
    env = {**os.environ, "EVA_DIRECT_IO": "0"}
    code = "import sys; from eva.export.pipeline import export_dataset; export_dataset(sys.argv[1], 'zarr')"
    subprocess.run([sys.executable, "-c", code, str(source)], env=env, check=True)
    assert tree_digest(raw_root / "accepted" / STORE) == first


def test_options_are_bounded_and_the_cli_takes_them(source: Path) -> None:
    with pytest.raises(OptionError, match="zarr_compression_level"):
        ZarrOptions(compression_level=0)
    with pytest.raises(OptionError, match="zarr_image_compressor"):
        ZarrOptions(image_compressor="gzip")
    eva = Path(sys.executable).with_name("eva")
    bad = subprocess.run(
        [str(eva), "export", str(source), "--format", "zarr", "--zarr-compression-level", "10"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--zarr-compression-level" in bad.stderr


def test_eva_info_describes_the_export(exported: Path) -> None:
    eva = Path(sys.executable).with_name("eva")
    result = subprocess.run(
        [str(eva), "info", str(exported / "accepted")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "zarr export, accepted subset" in result.stdout
    assert "(decoded frames embedded)" in result.stdout


def test_unavailable_without_the_extra() -> None:
    """Without zarr the format is listed but reported unavailable, naming the extra."""
    code = (
        "import sys; sys.modules['zarr'] = None\n"
        "from eva.formats import catalog\n"
        "entry = catalog.parse('zarr')\n"
        "try:\n    entry.load()\nexcept catalog.FormatUnavailable as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "format zarr: exporter cannot be imported" in result.stdout, result.stderr
    assert "eva[zarr]" in result.stdout


def test_an_empty_subset_gets_an_empty_store_that_verifies(tmp_path: Path) -> None:
    source = write_synthetic_dataset(tmp_path / "raw", episodes=2, frames=10)
    export_dataset(source, "zarr")
    rejected = tmp_path / "export" / "zarr" / "rejected"
    root = zarr.open_group(str(rejected / STORE), mode="r")
    assert root["meta/episode_ends"].shape == (0,)
    assert root["data/observation.images.front"].shape == (0, 48, 64, 3)
    assert verify_export(rejected) == []
