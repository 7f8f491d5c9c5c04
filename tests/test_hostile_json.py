"""Damaged JSON metadata gets one line naming the file (issue 27), whatever ``json.loads`` raises.

A hand-edited or damaged metadata file can hold more than a ``JSONDecodeError``: an integer of
5000 digits (Python's int conversion limit: a ValueError), nesting past the recursion limit (a
RecursionError), bytes that are not UTF-8, ``NaN``/``Infinity`` where eva writes the file back,
or a top level that is no object. Each is fed to every metadata file eva reads besides the
dataset's own (the reader's: tests/test_fuzz_readers.py): an export's quality_split.json and
info.json, the export root's job.json, fingerprints.json, video_checks.json and upload job
record, a crash spool's spool.json, committing.json and stopped.json. The commands that read
them (eva verify, eva info, eva export --incremental, the upload gate, eva cleanup, eva recover)
finish or exit 1 with one line naming the file, never a traceback.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import main
from eva.dataset import layout, spool
from eva.export.incremental import FINGERPRINTS, VIDEO_CHECKS
from eva.export.pipeline import export_dataset
from eva.formats import catalog
from eva.jobs import EXPORT_JOB, UPLOAD_JOB
from eva.upload.gate import UploadRefused, check_upload

sys.path.insert(0, str(Path(__file__).parent))
from test_crash_recovery import _record_then_kill  # noqa: E402

HOSTILE = {
    "digits": b'{"total_episodes": ' + b"7" * 5000 + b"}\n",
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "not_utf8": b'{"subset": "\xff\xfe"}\n',
    "nan": b'{"total_episodes": NaN, "state": "failed", "version": Infinity}\n',
    "not_object": b"[1, 2, 3]\n",
}
FORMATS = ["lerobot_v21", "lerobot_v3"]


def _run(*args: object) -> tuple[int, str]:
    """The CLI in-process: never a traceback, only a clean exit."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def _fails_naming(output: str, path: Path) -> None:
    """An ``eva: error:`` exit: exactly one such line, naming ``path``."""
    lines = [line for line in output.splitlines() if line.startswith("eva: error:")]
    assert len(lines) == 1 and str(path) in lines[0], output


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    """A tiny raw dataset exported as v2.1 and v3 (episode 0 accepted, episode 1 rejected)."""
    root = write_synthetic_dataset(
        tmp_path / "raw", episodes=2, frames=[8, 10], cameras=["observation.images.front"],
        width=32, height=24, state_dim=3, quality=["green", "red"], tasks=["pick", "place"],
    )  # fmt: skip
    for fmt in FORMATS:
        export_dataset(root, fmt)
    return root


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rel", [layout.QUALITY_SPLIT, layout.INFO])
def test_export_metadata(raw: Path, fmt: str, rel: str, kind: str) -> None:
    accepted = catalog.parse(fmt).export_paths(raw)["accepted"]
    path = accepted / rel
    path.write_bytes(HOSTILE[kind])
    code, output = _run("verify", accepted)
    assert code == 1 and str(path) in output, output  # NaN totals or fields: named problems
    code, output = _run("info", accepted)
    if code:
        _fails_naming(output, path)
    if rel == layout.QUALITY_SPLIT:  # the upload gate reads the marker, not info.json
        with pytest.raises(UploadRefused) as refused:
            check_upload(raw, fmt, backend_configured=True)
        assert str(path) in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("name", [EXPORT_JOB, FINGERPRINTS, VIDEO_CHECKS, UPLOAD_JOB])
def test_export_root_records(raw: Path, name: str, kind: str) -> None:
    """The records beside the pair are eva's bookkeeping: a damaged one is not reused (an
    incremental export redoes the work), and the upload gate names a damaged export job."""
    root = catalog.parse("lerobot_v3").export_root(raw)
    path = root / name
    path.write_bytes(HOSTILE[kind])
    if name == EXPORT_JOB:
        with pytest.raises(UploadRefused) as refused:
            check_upload(raw, "lerobot_v3", backend_configured=True)
        assert str(path) in str(refused.value) and "\n" not in str(refused.value)
    assert _run("cleanup", raw, "--format", "lerobot_v3")[0] == 0
    code, output = _run("export", raw, "--format", "lerobot_v3", "--incremental")
    assert code == 0, output
    assert _run("verify", catalog.parse("lerobot_v3").export_paths(raw)["accepted"])[0] == 0


@pytest.mark.parametrize(
    "fields", [{"state": "failed"}, {"pid": 10**30}, {"pid": "7"}, {"pid": [7]}]
)
def test_a_hand_edited_export_job_record(raw: Path, fields: dict[str, object]) -> None:
    """Fields missing or of the wrong type: no job, or one whose process is gone."""
    path = catalog.parse("lerobot_v3").export_root(raw) / EXPORT_JOB
    if "pid" in fields:  # a running job of a process that cannot exist
        fields = {**json.loads(path.read_bytes()), "state": "running", **fields}
    path.write_text(json.dumps(fields))
    code, output = _run("cleanup", raw, "--format", "lerobot_v3")
    assert code == 0 and "\n" not in output.strip(), output
    with pytest.raises(UploadRefused) as refused:
        check_upload(raw, "lerobot_v3", backend_configured=True)
    assert str(path) in str(refused.value)  # failed (interrupted), or not completed


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset whose recording was killed: its crash spool waits in the work dir."""
    root = tmp_path_factory.mktemp("killed") / "raw"
    _record_then_kill(root, 6)
    return root


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("name", [spool.MANIFEST, spool.COMMITTING, spool.STOPPED])
def test_spool_markers(killed: Path, tmp_path: Path, name: str, kind: str) -> None:
    root = tmp_path / "raw"
    shutil.copytree(killed, root)
    [work_dir] = [p for p in (root / layout.WORK_DIR).iterdir() if p.is_dir()]
    path = work_dir / name
    path.write_bytes(HOSTILE[kind])
    code, output = _run("recover", root)
    _fails_naming(output, path)
    assert code == 1 and work_dir.is_dir()  # the recording is kept for another try
    code, output = _run("cleanup", root)
    assert code == 0, output
