"""The trainer layouts of the HDF5 format (``--hdf5-layout aloha|robomimic``), read back with h5py:
every key where ALOHA/ACT and robomimic read it, the frames and rows equal to the source's (a
trimmed episode's kept frames, an edited task), eva's provenance, the same bytes from every
executor and from an incremental re-export, verify under the layout's own keys, and bad input
refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.reader import DatasetReader
from eva.export.pipeline import export_dataset
from eva.export.verify import verify_export
from eva.formats.base import ExportOptions, OptionError
from eva.formats.options import Hdf5Options
from eva.quality.edits import EditRequest, edit_episodes

CAMERAS = ("observation.images.front", "observation.images.wrist")
TRIM = (5, 25)  # of source episode 2 (30 frames): 20 kept, as long as the others accepted
# accepted: source episodes 0, 2 (trimmed) and 3 (re-tasked), all 20 frames; rejected: 1
SUBSETS = {"accepted": [0, 2, 3], "rejected": [1]}
TRIMS = {2: TRIM}


def make_source(root: Path) -> Path:
    """4 episodes (20, 25, 30, 20 frames), 2 cameras: 1 judged fail, 2 trimmed, 3 re-tasked."""
    source = write_synthetic_dataset(
        root / "raw",
        episodes=4,
        frames=[20, 25, 30, 20],
        cameras=CAMERAS,
        qc_verdicts=[None, "fail", None, "pass"],
        qc_notes=[None, "gripper slipped", None, None],
        tasks=["pick", "place", "pick", "place"],
    )
    edit_episodes(source, [2], EditRequest(trim=TRIM))
    edit_episodes(source, [3], EditRequest(task="stack the cups"))
    return source


def expected_episode(source: Path, src: int) -> dict[str, np.ndarray]:
    """The source's state and action rows and camera frames of ``src``, cut to its trim."""
    reader = DatasetReader(source)
    start, end = TRIMS.get(src, (0, reader.length(src)))
    table = reader.read_table(src)
    out = {
        name: np.stack(table.column(name).to_pylist())[start:end].astype(np.float32)
        for name in ("observation.state", "action")
    }
    for key in CAMERAS:
        every = np.concatenate([b.copy() for b in reader.iter_frames(src, key)])
        out[key] = every[start:end]
    return out


def export(source: Path, layout: str, **options: object) -> Path:
    hdf5 = Hdf5Options(layout=layout, **options)  # type: ignore[arg-type]
    export_dataset(source, "hdf5", options=ExportOptions(format=hdf5))
    return source.parent / "export" / "hdf5"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("layouts"))


RUN_RECORDS = (
    "job.json",
    "fingerprints.json",
    "video_checks.json",
    "quality_split.json",
    ".eva-complete",
)


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        # the run records and the export id differ from run to run
        if p.is_file() and p.name not in RUN_RECORDS
    }


def test_aloha_files_hold_the_source_frames_and_rows(source: Path) -> None:
    root = export(source, "aloha")
    for subset, indices in SUBSETS.items():
        names = sorted(p.name for p in (root / subset).glob("*.hdf5"))
        assert names == [f"episode_{i}.hdf5" for i in range(len(indices))]
        info = json.loads((root / subset / "meta" / "info.json").read_text())
        assert info["data_path"] == "episode_{episode_index}.hdf5"
        for new, src in enumerate(indices):
            expected = expected_episode(source, src)
            with h5py.File(root / subset / f"episode_{new}.hdf5", "r") as h5:
                assert h5.attrs["sim"] == False and h5.attrs["compress"] == False  # noqa: E712
                qpos, action = h5["/observations/qpos"], h5["/action"]
                np.testing.assert_array_equal(qpos[()], expected["observation.state"])
                np.testing.assert_array_equal(action[()], expected["action"])
                for name in ("qvel", "effort"):  # the source has neither: zeros, said so
                    filled = h5[f"/observations/{name}"]
                    assert filled.shape == qpos.shape and not filled[()].any()
                    assert "no " + name in filled.attrs["eva_zeros"]
                for key in CAMERAS:
                    images = h5[f"/observations/images/{key.rsplit('.', 1)[1]}"]
                    assert images.dtype == np.uint8 and images.chunks == (1, 48, 64, 3)
                    np.testing.assert_array_equal(images[()], expected[key])
                extra = h5["/observations/extra"]
                assert {"timestamp", "frame_index", "episode_index", "index"} <= set(extra)
                assert (extra["episode_index"][()] == new).all()
                assert h5.attrs["eva_source_episode_index"] == src
                assert h5.attrs["eva_subset"] == subset
        assert verify_export(root / subset) == []
    with h5py.File(root / "accepted" / "episode_2.hdf5", "r") as h5:
        assert json.loads(h5.attrs["eva_tasks"]) == ["stack the cups"]
    with h5py.File(root / "rejected" / "episode_0.hdf5", "r") as h5:
        assert h5.attrs["eva_verdict"] == "fail" and h5.attrs["eva_note"] == "gripper slipped"


def test_robomimic_file_holds_every_demo_with_its_provenance(source: Path) -> None:
    root = export(source, "robomimic", valid_fraction=0.5)
    for subset, indices in SUBSETS.items():
        assert sorted(p.name for p in (root / subset).iterdir()) == ["data.hdf5", "meta"]
        with h5py.File(root / subset / "data.hdf5", "r") as h5:
            data = h5["data"]
            assert sorted(data) == [f"demo_{i}" for i in range(len(indices))]
            assert data.attrs["total"] == 20 * len(indices) + (5 if subset == "rejected" else 0)
            assert json.loads(data.attrs["env_args"])["type"] == 2
            for new, src in enumerate(indices):
                expected = expected_episode(source, src)
                demo = data[f"demo_{new}"]
                rows = len(expected["action"])
                assert demo.attrs["num_samples"] == rows
                np.testing.assert_array_equal(demo["actions"][()], expected["action"])
                np.testing.assert_array_equal(demo["obs/state"][()], expected["observation.state"])
                for key in CAMERAS:
                    np.testing.assert_array_equal(
                        demo[f"obs/{key.rsplit('.', 1)[1]}"][()], expected[key]
                    )
                dones = demo["dones"][()]
                assert dones.tolist() == [0] * (rows - 1) + [1]
                assert demo["rewards"][()].tolist() == ([0.0] * (rows - 1)) + [
                    1.0 if subset == "accepted" else 0.0
                ]
                assert demo.attrs["eva_source_episode_index"] == src
            # valid: floor((s + 1) / 2) > floor(s / 2), i.e. odd source indices at 0.5
            valid = [f"demo_{i}" for i, s in enumerate(indices) if s % 2 == 1]
            assert [n.decode() for n in h5["mask/valid"][()]] == valid
            train = [f"demo_{i}" for i in range(len(indices)) if f"demo_{i}" not in valid]
            assert [n.decode() for n in h5["mask/train"][()]] == train
        assert verify_export(root / subset) == []
    with h5py.File(root / "rejected" / "data.hdf5", "r") as h5:
        demo = h5["data/demo_0"]
        assert demo.attrs["eva_verdict"] == "fail" and demo.attrs["eva_note"] == "gripper slipped"


@pytest.mark.parametrize("layout", ["aloha", "robomimic"])
def test_every_executor_and_an_incremental_export_write_the_same_bytes(
    source: Path, layout: str, tmp_path: Path
) -> None:
    copy = shutil.copytree(source, tmp_path / "raw", symlinks=True)
    options = ExportOptions(format=Hdf5Options(layout=layout))
    trees = []
    for executor, incremental in [("serial", False), ("processes", False), ("serial", True)]:
        result = export_dataset(
            copy, "hdf5", options=options, executor=executor, workers=2, incremental=incremental
        )
        trees.append(tree_digest(result.export_root))
        if incremental and layout == "aloha":  # the episode files are linked, not written
            assert result.job.episodes_reused == 4
    assert trees[0] == trees[1] == trees[2]
    assert not list((copy.parent / "export" / "hdf5").rglob(".eva-demos"))


def test_a_map_renames_and_verify_finds_damage(source: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(source, tmp_path / "raw", symlinks=True)
    root = export(
        copy,
        "aloha",
        feature_map=(("observation.images.front", "cam_high"), ("timestamp", "t")),
    )
    with h5py.File(root / "accepted" / "episode_0.hdf5", "r") as h5:
        assert set(h5["/observations/images"]) == {"cam_high", "wrist"}
        assert "t" in h5["/observations/extra"] and "timestamp" not in h5["/observations/extra"]
    # the state mapped away from qpos: then no feature is qpos, refused naming it
    with pytest.raises(OptionError, match="qpos: no feature"):
        export(copy, "aloha", feature_map=(("observation.state", "state"),))
    root = export(copy, "aloha")
    with h5py.File(root / "accepted" / "episode_1.hdf5", "a") as h5:
        del h5["/observations/qvel"]
    codes = {p.code for p in verify_export(root / "accepted")}
    assert codes == {"missing_dataset"}
    root = export(copy, "robomimic")
    with h5py.File(root / "accepted" / "data.hdf5", "a") as h5:
        del h5["data/demo_2"]
        h5["data/demo_0"].attrs["num_samples"] = 3
    codes = {p.code for p in verify_export(root / "accepted")}
    assert {"missing_demo", "length_mismatch", "total", "demo_count"} <= codes


def _eva(*args: str) -> subprocess.CompletedProcess[str]:
    eva = Path(sys.executable).with_name("eva")
    return subprocess.run([str(eva), *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hdf5-map", "observation.nope=qpos"], "--hdf5-map: observation.nope: not a feature"),
        (
            ["--hdf5-map", "observation.images.wrist=front"],
            "observation.images.front: named by default 'front', which is already "
            "observation.images.wrist's name",
        ),
    ],
)
def test_bad_maps_are_refused_before_anything_is_written(
    source: Path, tmp_path: Path, args: list[str], needle: str
) -> None:
    copy = shutil.copytree(source, tmp_path / "pick" / "raw", symlinks=True)
    result = _eva("export", str(copy), "--format", "hdf5", "--hdf5-layout", "aloha", *args)
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr.strip().splitlines() == [f"eva: error: {needle}"] or needle in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (copy.parent / "export").exists()


def test_a_camera_whose_shape_varies_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    from video_helpers import encode_video

    raw = write_synthetic_dataset(
        tmp_path / "pick" / "raw", episodes=2, frames=[10, 10], cameras=list(CAMERAS)
    )
    reader = DatasetReader(raw)
    target = reader.video_path(1, CAMERAS[1])
    frames = np.zeros((10, 32, 48, 3), dtype=np.uint8)
    target.chmod(0o644)
    target.unlink()  # replaced, as a re-recorded file would be
    encode_video(target, frames)
    options = ExportOptions(format=Hdf5Options(layout="aloha"))
    with pytest.raises(OptionError, match="images.wrist: source episode 1 frames are 48x32"):
        export_dataset(raw, "hdf5", options=options)
    assert not (raw.parent / "export").exists()
