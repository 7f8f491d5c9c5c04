"""docs/formats.md's read examples, run as written against a dataset laid out as `make demo`'s
(3 episodes, 3 cameras, episode 1 judged "fail", exported in every format), so that the page
cannot drift from the files eva writes. A block that reads the foxglove MCAP profile (it imports
``mcap_protobuf``) runs against the same dataset exported with ``--mcap-profile foxglove``, at the
path ``eva export`` gives it (the default profile's example reads that path too). The block fenced as ```python lerobot runs in LeRobot's
own environment, which ``make compat`` sets up and points to (EVA_ORACLE_DIR: the oracle's
directory, whose torchvision shim the CPU-only venv needs; LEROBOT_V3_PYTHON). A block that says
it was exported ``--hdf5-layout aloha`` or ``robomimic`` runs against the dataset exported so; the
blocks fenced ```python act and ```python robomimic run in the trainer oracle venv
(TRAINER_ORACLES), ACT's with its ``utils.py`` copied out of a snapshot of its repository
(ACT_REPO) into ``act/`` beside ``demo-data``; without them they skip, saying what is missing."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from eva.capture.synthetic import write_synthetic_dataset
from eva.export.pipeline import export_dataset
from eva.formats.base import ExportOptions
from eva.formats.options import Hdf5Options, McapOptions

DOC = Path(__file__).resolve().parents[1] / "docs" / "formats.md"
BLOCK = re.compile(r"^```(python[^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_V3_PYTHON", "/tmp/lerobot-v3-venv/bin/python"))
ORACLE_DIR = os.environ.get("EVA_ORACLE_DIR")
FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap", "zarr")
TRAINER_PYTHON = Path(os.environ.get("TRAINER_ORACLES", "/tmp/trainer-oracles")) / "venv/bin/python"
ACT_REPO = Path(os.environ.get("ACT_REPO", "/work/.mirror/tonyzhaozh+act/repo"))
SHIM_DIR = Path(ORACLE_DIR or Path(__file__).resolve().parents[2] / "shared" / "oracle")
LAYOUTS = ("aloha", "robomimic")


def _blocks(kind: str) -> list[str]:
    return [code for info, code in BLOCK.findall(DOC.read_text()) if info.strip() == kind]


def _demo_dataset(root: Path) -> Path:
    return write_synthetic_dataset(
        root / "demo-data/logs/pick_cube/raw",
        episodes=3,
        frames=[24, 20, 22],
        cameras=["observation.images.front", "observation.images.wrist", "observation.images.side"],
        qc_verdicts=[None, "fail", "pass"],
        tasks=["pick up the red cube and place it in the bin"],
        action_dim=14,
    )


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    raw = _demo_dataset(root)
    for fmt in FORMATS:
        export_dataset(raw, fmt)
    return root


@pytest.fixture(scope="module")
def foxglove_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-foxglove")
    options = ExportOptions(format=McapOptions(profile="foxglove"))
    export_dataset(_demo_dataset(root), "mcap", options=options)
    return root


def _layout_root(root: Path, layout: str) -> Path:
    options = ExportOptions(format=Hdf5Options(layout=layout))
    export_dataset(_demo_dataset(root), "hdf5", options=options)
    return root


@pytest.fixture(scope="module")
def aloha_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _layout_root(tmp_path_factory.mktemp("docs-aloha"), "aloha")


@pytest.fixture(scope="module")
def robomimic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _layout_root(tmp_path_factory.mktemp("docs-robomimic"), "robomimic")


def _root_of(code: str) -> str:
    """The fixture a block runs against: the export its comment says it was made with."""
    for layout in LAYOUTS:
        if f"--hdf5-layout {layout}" in code:
            return f"{layout}_root"
    return "foxglove_root" if "mcap_protobuf" in code else "demo_root"


def test_the_page_has_an_example_per_format() -> None:
    code = "\n".join(_blocks("python"))
    needles = (
        "raw = Path(",
        "lerobot_v3",
        "h5py",
        "make_reader",
        "quality_split.json",
        "mcap_protobuf",
        "episode_ends",
        "--hdf5-layout aloha",
    )
    for needle in needles:
        assert needle in code
    assert _blocks("python lerobot")
    assert _blocks("python act") and _blocks("python robomimic")


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_example_runs_as_written(request: pytest.FixtureRequest, index: int) -> None:
    code = _blocks("python")[index]
    root = request.getfixturevalue(_root_of(code))
    # The examples' relative paths are make demo's: run them from the directory holding demo-data.
    cwd = os.getcwd()
    os.chdir(root)
    try:
        exec(compile(code, f"{DOC.name} block {index}", "exec"), {"__name__": "docs_example"})
    finally:
        os.chdir(cwd)


@pytest.mark.skipif(
    ORACLE_DIR is None or not LEROBOT_PYTHON.exists(), reason="run by make compat (LeRobot's venv)"
)
def test_lerobot_example_runs_in_lerobot(demo_root: Path) -> None:
    shim = f"import sys\nsys.path.insert(0, {ORACLE_DIR!r})\nimport _tv_cpu_shim\n"
    check = "\nassert len(ds) > 0 and 'observation.state' in item\n"
    code = shim + _blocks("python lerobot")[0] + check
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [str(LEROBOT_PYTHON), "-c", code], cwd=demo_root, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("trainer", ["act", "robomimic"])
def test_trainer_example_runs_with_the_trainers_code(
    request: pytest.FixtureRequest, trainer: str
) -> None:
    if not TRAINER_PYTHON.exists():
        pytest.skip(f"no trainer oracle venv at {TRAINER_PYTHON} (make compat builds it)")
    code = _blocks(f"python {trainer}")[0]
    root = request.getfixturevalue(_root_of(code))
    if trainer == "act":
        if not ACT_REPO.exists():
            pytest.skip(f"no ACT snapshot at {ACT_REPO} (set ACT_REPO)")
        (root / "act").mkdir(exist_ok=True)
        utils = subprocess.run(
            ["git", "-C", str(ACT_REPO), "show", "HEAD:utils.py"], capture_output=True, check=True
        ).stdout
        (root / "act" / "utils.py").write_bytes(utils)
    else:
        if not (SHIM_DIR / "_tv_cpu_shim.py").exists():
            pytest.skip(f"no oracle directory with _tv_cpu_shim.py at {SHIM_DIR} (EVA_ORACLE_DIR)")
        code = f"import sys\nsys.path.insert(0, {str(SHIM_DIR)!r})\nimport _tv_cpu_shim\n" + code
    result = subprocess.run(
        [str(TRAINER_PYTHON), "-c", code], cwd=root, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
