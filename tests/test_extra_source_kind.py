"""A source kind added from the test suite alone (``tests/extra_source_kind.py``: one registry
entry and its worker): the config loads with it, ``eva collect --list`` and ``--check`` show it
(the ``eva`` command finds it through an ``eva.source_kinds`` entry point), and a real recording
with it (a Recorder fed by its real source process) is a valid dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from eva.capture.recorder import Recorder
from eva.capture.rig import SourceRig
from eva.config import ConfigError, config_from_dict, load_config
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset
from eva.source_kinds import register_source_kind, unregister_source_kind

HERE = Path(__file__).parent

CONFIG = """
[collection]
log_dir = "logs"
fps = 10
min_episode_frames = 3

[collection.tasks]
demo = ["count"]

[[collection.cameras]]
key = "observation.images.front"
width = 64
height = 48
source = { kind = "counter", start = 100, color = [200, 40, 120]REFUSE }

[[collection.vectors]]
name = "observation.state"
dim = 3
source = { kind = "counter", start = 100, color = [200, 40, 120]REFUSE }

[collection.encoder]
preset = "ultrafast"
"""


@pytest.fixture(autouse=True)
def counter_kind() -> Iterator[None]:
    """The kind registered in this process for one test (other tests see eva's own kinds)."""
    import extra_source_kind  # registers it on first import

    register_source_kind(extra_source_kind.COUNTER, replace=True)
    yield
    unregister_source_kind("counter")


def write_config(tmp_path: Path, refuse: bool = False) -> Path:
    path = tmp_path / "rig.toml"
    path.write_text(CONFIG.replace("REFUSE", ", refuse = true" if refuse else ""))
    return path


def collection(source: str) -> dict:
    return {
        "collection": {
            "tasks": {"demo": ["count"]},
            "vectors": [{"name": "s", "dim": 2, "source": source}],
        }
    }


@pytest.mark.kernel_independent
def test_the_config_loads_with_the_extra_kind(tmp_path: Path) -> None:
    cfg = load_config(write_config(tmp_path)).collection
    (camera,), (state,) = cfg.cameras, cfg.vectors
    assert camera.source is not None and state.source is not None
    assert camera.source.kind == "counter"
    assert camera.source.settings == {"start": 100, "color": [200, 40, 120], "refuse": False}
    assert state.source.describe() == "counter from 100, colour 200,40,120"
    # its schema's one-line errors, like eva's own kinds'
    for source, error in [
        ({"kind": "counter", "colour": [1, 2, 3]}, "unknown key of a counter source"),
        ({"kind": "counter", "color": [1, 2]}, "source.color: expected [r, g, b] in 0..255"),
        ({"kind": "counter", "start": -1}, "source.start: must be >= 0"),
        ({"kind": "countr"}, "unknown source kind 'countr': use ffmpeg, zmq, python, sim, counter"),
    ]:
        with pytest.raises(ConfigError, match=r"^config: collection\.vectors\[0\]\.") as e:
            config_from_dict(collection(source))  # type: ignore[arg-type]
        assert error in str(e.value) and "\n" not in str(e.value)


def eva(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``eva`` in a process of its own, which knows the kind only through its entry point (a
    ``.dist-info`` on its path) and imports the worker from this directory."""
    plugins = tmp_path / "plugins"
    info = plugins / "eva_counter_kind-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eva-counter-kind\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[eva.source_kinds]\ncounter = extra_source_kind\n")
    path = os.pathsep.join([str(plugins), str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "eva.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )


@pytest.mark.realtime
def test_collect_list_and_check_show_the_extra_kind(tmp_path: Path) -> None:
    import extra_source_kind

    config = write_config(tmp_path)
    listed = eva(tmp_path, "collect", str(config), "--list", "--json")
    assert listed.returncode == 0, listed.stderr
    obj = json.loads(listed.stdout)
    assert obj["recording"] == "configured" and "2 counter" in obj["summary"]
    for stream in (obj["cameras"][0], obj["vectors"][0]):
        assert stream["source"] == {
            "kind": "counter",
            "description": "counter from 100, colour 200,40,120",
        }
    checked = eva(tmp_path, "collect", str(config), "--check")
    assert checked.returncode == 0 and checked.stdout.startswith("check: ok"), checked.stderr
    assert "camera observation.images.front 64x48: counter from 100" in checked.stderr
    # its --check probe: one line per stream it refuses, exit 2
    refused = eva(tmp_path, "collect", str(write_config(tmp_path, refuse=True)), "--check")
    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("eva: error:")]
    assert len(errors) == 2 and all(extra_source_kind.REFUSAL in e for e in errors), errors


@pytest.mark.realtime
def test_a_recording_from_the_extra_kind_is_a_valid_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the source process imports the worker by its path: from this directory
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    cfg = load_config(write_config(tmp_path)).collection
    rig = SourceRig(cfg)
    assert len(rig.groups) == 1  # the camera and the vector share one source process
    try:
        with Recorder(cfg, durable=False, rings=rig.rings) as recorder:
            rig.attach(recorder)
            rig.start()
            assert rig.check() == []
            recorder.start("demo")
            time.sleep(1.5)
            job = recorder.stop()
            assert job.wait(60) and job.state == "saved", job.error
    finally:
        rig.close()
    raw = Path(job.dataset_dir)
    assert validate_dataset(raw, decode=True) == []
    reader = DatasetReader(raw)
    (episode,) = reader.episodes
    assert episode["length"] >= 5
    counts = reader.read_vector(0, "observation.state")
    # the counter on the frame grid: every dimension equal, rising by one count per frame
    assert np.all(counts == counts[:, :1]) and np.all(counts >= 100)
    assert np.allclose(np.diff(counts[:, 0]), 1.0, atol=0.3)
    for batch in reader.iter_frames(0, "observation.images.front", batch_size=16):
        assert np.abs(batch.astype(int) - [200, 40, 120]).max() <= 8  # solid colour, lossy codec
