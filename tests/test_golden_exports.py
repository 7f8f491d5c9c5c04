"""Every format's output on a fixed input, byte for byte, against a recorded manifest.

Restructuring (module splits, typed options, the MCAP writer path) must not change a single
output byte. The input is the committed LeRobot v2.1 fixture with episode 1 judged "fail" (so
both subsets hold an episode); every file of every export is hashed, except the records that
name the run (locks, the completion marker, job.json) and, in quality_split.json, the fields
that do (created_at, export_id, source_dir).

The bytes depend on the writing libraries too (Parquet's footer names pyarrow's version, HDF5
and MCAP their own layouts): the manifest records the versions it was made with, and the test
is skipped, naming the difference, when they differ. Regenerate after an intended change:
``EVA_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden_exports.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from importlib.metadata import version
from pathlib import Path

import pytest

from eva.export.pipeline import export_dataset

MANIFEST = Path(__file__).parent / "fixtures" / "golden_exports.json"
FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap", "zarr")
LIBRARIES = ("pyarrow", "h5py", "mcap", "av", "numpy", "msgpack", "zstandard", "zarr", "numcodecs")
RUN_RECORDS = {"job.json", ".eva-complete", "fingerprints.json", "video_checks.json"}
RUN_FIELDS = {"created_at", "export_id", "source_dir"}


def _versions() -> dict[str, str]:
    return {name: version(name) for name in LIBRARIES}


def _digest(path: Path) -> str:
    if path.name == "quality_split.json":
        record = json.loads(path.read_text(encoding="utf-8"))
        kept = {k: v for k, v in record.items() if k not in RUN_FIELDS}
        data = json.dumps(kept, sort_keys=True).encode()
    else:
        data = path.read_bytes()
    return hashlib.sha256(data).hexdigest()


def export_manifest(export_root: Path) -> dict[str, str]:
    """Every output file of the export roots below ``export_root`` -> its digest (run records
    and run fields left out; also used by tests/test_export_executors.py)."""
    files: dict[str, str] = {}
    for path in sorted(export_root.rglob("*")):
        if not path.is_file() or path.name in RUN_RECORDS or path.name.endswith(".lock"):
            continue
        files[path.relative_to(export_root).as_posix()] = _digest(path)
    return files


def judged_fixture_copy(tmp_path: Path, fixture: Path) -> Path:
    """A copy of the LeRobot fixture at ``tmp_path/raw`` with episode 1 judged "fail" (so both
    subsets hold an episode)."""
    source = tmp_path / "raw"
    shutil.copytree(fixture, source)
    episodes = source / "meta" / "episodes.jsonl"
    rows = [json.loads(line) for line in episodes.read_text(encoding="utf-8").splitlines()]
    rows[1]["qc_verdict"] = "fail"
    episodes.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return source


def test_outputs_match_the_recorded_manifest(tmp_path: Path, lerobot_fixture_dir: Path) -> None:
    source = judged_fixture_copy(tmp_path, lerobot_fixture_dir)
    for fmt in FORMATS:
        export_dataset(source, fmt)
    files = export_manifest(tmp_path / "export")
    assert {p.split("/")[0] for p in files} == set(FORMATS)
    assert any(p.startswith("lerobot_v3/rejected/") for p in files)

    if os.environ.get("EVA_UPDATE_GOLDEN") == "1":
        MANIFEST.write_text(
            json.dumps({"versions": _versions(), "files": files}, indent=1, sort_keys=True) + "\n",
            encoding="utf-8",
        )
        return
    recorded = json.loads(MANIFEST.read_text(encoding="utf-8"))
    changed = {k: v for k, v in _versions().items() if recorded["versions"].get(k) != v}
    if changed:
        pytest.skip(f"golden manifest made with other library versions: {changed}")
    assert sorted(files) == sorted(recorded["files"]), "the set of output files changed"
    different = [p for p, d in files.items() if recorded["files"][p] != d]
    assert not different, f"output bytes changed: {different}"
