"""eva's zarr stores read by the trainers' own code: diffusion_policy's ``ReplayBuffer``
(``copy_from_path`` into numpy and into a zarr MemoryStore, ``get_episode`` of every episode),
run unmodified in the trainer oracle venv with zarr 2.x, and zarr 3 reading the v2 store. Every
frame and row they return equals the source's (a trimmed episode's kept frames, an edited task).

diffusion_policy is not on PyPI: ``replay_buffer.py`` is copied at test time out of a snapshot of
its repository (``DIFFUSION_POLICY_REPO``, a git directory) into a temp dir; nothing of it is
kept. The venvs are the trainer oracles' (``TRAINER_ORACLES``, default /tmp/trainer-oracles;
built by the oracle's setup_trainer_oracles.sh, which ``make compat`` runs). Without them these
tests skip, saying what is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zarr", reason="the zarr extra (make build installs it)")

from test_zarr_export import CAMERAS, STORE, TRIM, expected_subset, make_source  # noqa: E402

from eva.export.pipeline import export_dataset  # noqa: E402
from eva.formats.base import ExportOptions  # noqa: E402
from eva.formats.options import ZarrOptions  # noqa: E402

ORACLES = Path(os.environ.get("TRAINER_ORACLES", "/tmp/trainer-oracles"))
ZARR2_PYTHON = ORACLES / "venv" / "bin" / "python"
ZARR3_PYTHON = ORACLES / "zarr3" / "bin" / "python"
REPO = Path(
    os.environ.get("DIFFUSION_POLICY_REPO", "/work/.mirror/real-stanford+diffusion_policy/repo")
)
REPLAY_BUFFER = "diffusion_policy/common/replay_buffer.py"
READER = Path(__file__).with_name("zarr_oracle_read.py")
# accepted: source episodes 0, 2 (trimmed) and 3 (re-tasked); rejected: 1
SUBSETS = {"accepted": ([0, 2, 3], [20, 40, 52]), "rejected": ([1], [25])}


def _missing(python: Path) -> str | None:
    if not python.exists():
        return f"no trainer oracle venv at {python} (make compat builds it)"
    return None


@pytest.fixture(scope="module", params=["none", "zstd"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = make_source(tmp_path_factory.mktemp(f"zarr-{request.param}"))
    options = ExportOptions(format=ZarrOptions(image_compressor=request.param))
    export_dataset(source, "zarr", options=options)
    return source


def _check(source: Path, arrays: dict[str, np.ndarray], subset: str) -> None:
    indices, ends = SUBSETS[subset]
    assert arrays["episode_ends"].tolist() == ends
    expected = expected_subset(source, indices, {2: TRIM})
    for name, values in expected.items():
        assert np.array_equal(arrays[name], values), (subset, name)
    for key in CAMERAS:
        assert arrays[key].dtype == np.uint8 and arrays[key].shape[-1] == 3
    starts = [0, *ends[:-1]]
    for episode, (start, end) in enumerate(zip(starts, ends, strict=True)):
        assert (arrays["episode_index"][start:end] == episode).all()


def _read(python: Path, args: list[str], out: Path) -> dict[str, np.ndarray]:
    result = subprocess.run(
        [str(python), str(READER), *args, str(out)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out) as loaded:
        return {name: loaded[name] for name in loaded.files}


@pytest.mark.parametrize("subset", sorted(SUBSETS))
def test_diffusion_policy_replay_buffer_reads_every_episode(
    exported: Path, subset: str, tmp_path: Path
) -> None:
    missing = _missing(ZARR2_PYTHON)
    if missing:
        pytest.skip(missing)
    if not REPO.exists():
        pytest.skip(f"no diffusion_policy snapshot at {REPO} (set DIFFUSION_POLICY_REPO)")
    code = subprocess.run(
        ["git", "-C", str(REPO), "show", f"HEAD:{REPLAY_BUFFER}"],
        capture_output=True,
        check=True,
    ).stdout
    (tmp_path / "replay_buffer.py").write_bytes(code)
    store = exported.parent / "export" / "zarr" / subset / STORE
    arrays = _read(ZARR2_PYTHON, ["replay_buffer", str(tmp_path), str(store)], tmp_path / "out.npz")
    _check(exported, arrays, subset)


@pytest.mark.parametrize("subset", sorted(SUBSETS))
def test_zarr3_reads_the_v2_store(exported: Path, subset: str, tmp_path: Path) -> None:
    missing = _missing(ZARR3_PYTHON)
    if missing:
        pytest.skip(missing)
    store = exported.parent / "export" / "zarr" / subset / STORE
    arrays = _read(ZARR3_PYTHON, ["zarr3", str(store)], tmp_path / "out.npz")
    _check(exported, arrays, subset)
