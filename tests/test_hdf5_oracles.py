"""eva's HDF5 trainer layouts read by the trainers' own code: ACT's ``get_norm_stats`` and
``EpisodicDataset`` over the aloha episode files, robomimic 0.3.0's
``FileUtils.get_shape_metadata_from_dataset`` and ``SequenceDataset`` (every demo, then each
filter key) over the robomimic ``data.hdf5``, each in the trainer oracle venv. Every frame and
row they return equals the source's (a trimmed episode's kept frames, an edited task), in both
subsets.

ACT is not on PyPI: its ``utils.py`` is copied at test time out of a snapshot of its repository
(``ACT_REPO``, a git directory, brought with the ``fetch`` tool) into a temp dir; nothing of it is
kept. The venv is the trainer oracles' (``TRAINER_ORACLES``, default /tmp/trainer-oracles; built
by the oracle's setup_trainer_oracles.sh, which ``make compat`` runs; robomimic needs the
oracle's torchvision shim, from ``EVA_ORACLE_DIR``). Without them these tests skip, saying what
is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_hdf5_layouts import CAMERAS, SUBSETS, expected_episode, export, make_source

ORACLES = Path(os.environ.get("TRAINER_ORACLES", "/tmp/trainer-oracles"))
PYTHON = ORACLES / "venv" / "bin" / "python"
ACT_REPO = Path(os.environ.get("ACT_REPO", "/work/.mirror/tonyzhaozh+act/repo"))
ORACLE_DIR = Path(
    os.environ.get("EVA_ORACLE_DIR", Path(__file__).resolve().parents[2] / "shared" / "oracle")
)
READER = Path(__file__).with_name("hdf5_oracle_read.py")
NAMES = [key.rsplit(".", 1)[1] for key in CAMERAS]


def _skip_without_venv() -> None:
    if not PYTHON.exists():
        pytest.skip(f"no trainer oracle venv at {PYTHON} (make compat builds it)")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("hdf5-oracles"))


def _read(args: list[str], out: Path) -> dict[str, np.ndarray]:
    result = subprocess.run(
        [str(PYTHON), str(READER), *args, str(out)], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out) as loaded:
        return {name: loaded[name] for name in loaded.files}


@pytest.mark.parametrize("subset", sorted(SUBSETS))
def test_act_loads_every_episode(source: Path, subset: str, tmp_path: Path) -> None:
    _skip_without_venv()
    if not ACT_REPO.exists():
        pytest.skip(f"no ACT snapshot at {ACT_REPO} (set ACT_REPO)")
    code = subprocess.run(
        ["git", "-C", str(ACT_REPO), "show", "HEAD:utils.py"], capture_output=True, check=True
    ).stdout
    (tmp_path / "utils.py").write_bytes(code)
    root = export(source, "aloha")
    indices = SUBSETS[subset]
    args = ["act", str(tmp_path), str(root / subset), str(len(indices)), ",".join(NAMES)]
    arrays = _read(args, tmp_path / "out.npz")
    states, actions = [], []
    for episode, src in enumerate(indices):
        expected = expected_episode(source, src)
        np.testing.assert_array_equal(arrays[f"e{episode}/qpos"], expected["observation.state"])
        rows = len(expected["action"])
        shifted = expected["action"][[max(0, t - 1) for t in range(rows)]]  # ACT's real-robot shift
        np.testing.assert_array_equal(arrays[f"e{episode}/action"], shifted)
        for key, name in zip(CAMERAS, NAMES, strict=True):
            np.testing.assert_array_equal(arrays[f"e{episode}/{name}"], expected[key])
        states.append(expected["observation.state"])
        actions.append(expected["action"])
    # get_norm_stats stacks every episode (all of a subset are 20 frames here)
    np.testing.assert_allclose(arrays["stats/qpos_mean"], np.mean(states, axis=(0, 1)), rtol=1e-5)
    np.testing.assert_allclose(
        arrays["stats/action_mean"], np.mean(actions, axis=(0, 1)), rtol=1e-5
    )


@pytest.mark.parametrize("subset", sorted(SUBSETS))
def test_robomimic_loads_every_demo(source: Path, subset: str, tmp_path: Path) -> None:
    _skip_without_venv()
    if not (ORACLE_DIR / "_tv_cpu_shim.py").exists():
        pytest.skip(f"no oracle directory with _tv_cpu_shim.py at {ORACLE_DIR} (EVA_ORACLE_DIR)")
    root = export(source, "robomimic", valid_fraction=0.5)
    indices = SUBSETS[subset]
    data = root / subset / "data.hdf5"
    args = ["robomimic", str(ORACLE_DIR), str(data), "state", ",".join(NAMES)]
    arrays = _read(args, tmp_path / "out.npz")
    assert int(arrays["ac_dim"]) == 14
    assert arrays["shape/state"].tolist() == [14]
    for name in NAMES:
        assert arrays[f"shape/{name}"].tolist() == [3, 48, 64]  # robomimic's CHW
    for demo, src in enumerate(indices):
        expected = expected_episode(source, src)
        rows = len(expected["action"])
        np.testing.assert_array_equal(arrays[f"e{demo}/actions"], expected["action"])
        np.testing.assert_array_equal(arrays[f"e{demo}/state"], expected["observation.state"])
        for key, name in zip(CAMERAS, NAMES, strict=True):
            np.testing.assert_array_equal(arrays[f"e{demo}/{name}"], expected[key])
        assert arrays[f"e{demo}/dones"].tolist() == [0] * (rows - 1) + [1]
        reward = 1.0 if subset == "accepted" else 0.0
        assert arrays[f"e{demo}/rewards"].tolist() == [0.0] * (rows - 1) + [reward]
    # the filter keys at --valid-fraction 0.5: odd source episode indices are valid
    valid = [demo for demo, src in enumerate(indices) if src % 2 == 1]
    assert arrays["mask/valid"].tolist() == valid
    assert arrays["mask/train"].tolist() == [d for d in range(len(indices)) if d not in valid]
