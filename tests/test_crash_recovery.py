"""A recording survives a kill at any instant: the crash spool, ``eva recover`` and the
automatic recovery of ``eva collect``, commits retried on a shortage, and a short fault
campaign (``make faults`` runs the long one: tests/fault_campaign.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eva.dataset import atomic, layout, spool
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.recover import RECOVERED_CODE, complete_fragments
from eva.dataset.validate import validate_dataset
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec
from eva.formats import catalog

sys.path.insert(0, str(Path(__file__).parent))
import fault_campaign  # noqa: E402

EVA = [sys.executable, "-m", "eva.cli"]
FRONT = "observation.images.front"
WRIST = "observation.images.wrist"
FPS = 30

# A writer fed in real time (8 frames per 8/30 s) from a child process that prints each batch.
FEED = """
import sys, time
import numpy as np
from eva.dataset.video import VideoOptions
from eva.dataset.writer import CameraSpec, DatasetWriter, VectorSpec
root, batches, codec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
video = VideoOptions(codec=codec, preset="12" if codec == "libsvtav1" else "veryfast")
w = DatasetWriter.create_or_open(root, fps=30, durable=False, video=video,
    cameras=[CameraSpec("observation.images.front", 48, 64),
             CameraSpec("observation.images.wrist", 48, 64)],
    vectors=[VectorSpec("observation.state", 7), VectorSpec("action", 7)])
ep = w.begin_episode("pick")
rng = np.random.default_rng(0)
for b in range(batches):
    images = {c.key: rng.integers(0, 255, (8, 48, 64, 3), dtype=np.uint8) for c in w.cameras}
    vectors = {v.name: np.full((8, 7), b, np.float32) for v in w.vectors}
    ep.add_frames(images, vectors)
    print(ep.length, flush=True)
    time.sleep(8 / 30)
time.sleep(60)  # killed before this ends
"""


def _open(root: Path, **kwargs: object) -> DatasetWriter:
    return DatasetWriter.create_or_open(
        root, fps=FPS, durable=False,
        cameras=[CameraSpec(FRONT, 48, 64), CameraSpec(WRIST, 48, 64)],
        vectors=[VectorSpec("observation.state", 7), VectorSpec("action", 7)],
        **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


def _add_black_frames(episode: Any, n: int) -> None:
    black = np.zeros((n, 48, 64, 3), np.uint8)
    zeros = np.zeros((n, 7))
    episode.add_frames({FRONT: black, WRIST: black}, {"observation.state": zeros, "action": zeros})


def _record_then_kill(root: Path, batches: int, codec: str = "libx264") -> int:
    """Feed ``batches`` batches of 8 frames in real time, SIGKILL the writer; frames fed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(FEED), str(root), str(batches), codec],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    fed = 0
    for line in proc.stdout:
        fed = int(line)
        if fed >= batches * 8:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return fed


def test_a_killed_recording_is_recovered_up_to_its_last_complete_fragment(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    fed = _record_then_kill(root, 12)  # 96 frames, 3.2 s
    work = [p for p in (root / layout.WORK_DIR).iterdir() if p.is_dir()]
    assert len(work) == 1 and spool.is_spool(work[0])
    with _open(root) as writer:
        [recovery] = writer.recovered
    assert recovery.episode_index == 0 and recovery.error is None
    # At most the last 2 s are lost (here: the last interval, the encoder's lookahead).
    assert fed - 2 * FPS <= recovery.frames <= fed
    reader = DatasetReader(root)
    row = reader.episode(0)
    assert row["length"] == recovery.frames and row["quality"] == "red"
    assert [i["code"] for i in row["quality_issues"]] == [RECOVERED_CODE]
    assert row["tasks"] == ["pick"] and row["started_at"]
    # The rows are the first frames, in order: batch b holds the value b.
    state = reader.read_table(0).column("observation.state").to_pylist()
    assert [s[0] for s in state] == [float(i // 8) for i in range(recovery.frames)]
    assert validate_dataset(root) == []
    assert not (root / layout.WORK_DIR / work[0].name).exists()


def test_an_av1_recording_is_recovered(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    fed = _record_then_kill(root, 12, "libsvtav1")
    out = subprocess.run([*EVA, "recover", "--json", str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    [recovered] = json.loads(out.stdout)["recovered"]
    assert fed - 2 * FPS <= recovered["frames"] <= fed
    assert validate_dataset(root) == []


def test_eva_recover_and_every_export_of_a_recovered_episode(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _record_then_kill(root, 6)
    with _open(root, recover=False) as writer:  # a normal episode after the crashed one
        ep = writer.begin_episode("place")
        _add_black_frames(ep, 5)
        assert ep.commit() == 0
    info = subprocess.run([*EVA, "info", str(root)], capture_output=True, text=True)
    assert "1 recording(s) cut short by a crash await recovery: eva recover" in info.stderr
    out = subprocess.run([*EVA, "recover", "--json", str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    [recovered] = json.loads(out.stdout)["recovered"]
    assert recovered["episode_index"] == 1 and recovered["frames"] > 0
    info = subprocess.run([*EVA, "info", "--json", str(root)], capture_output=True, text=True)
    assert json.loads(info.stdout)["awaiting_recovery"] == 0
    again = subprocess.run([*EVA, "recover", str(root)], capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to recover" in again.stderr + again.stdout
    subprocess.run([*EVA, "qc", str(root), "1", "--pass"], check=True, capture_output=True)
    for fmt in catalog.names():
        exported = subprocess.run([*EVA, "export", str(root), "--format", fmt, "-q"],
                                  capture_output=True, text=True)  # fmt: skip
        assert exported.returncode == 0, exported.stderr
        accepted = root.parent / "export" / fmt / "accepted"
        verified = subprocess.run([*EVA, "verify", str(accepted), "--full"],
                                  capture_output=True, text=True)  # fmt: skip
        assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_spool_already_committed_is_removed_not_recovered_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill after the commit point (the row is there) but before the work dir went away."""
    import shutil

    root = tmp_path / "raw"
    real_rmtree = shutil.rmtree
    with _open(root) as writer:
        ep = writer.begin_episode("pick")
        _add_black_frames(ep, 4)

        def killed_before_removal(path: object, *args: object, **kwargs: object) -> None:
            if Path(str(path)) != ep.work_dir:
                real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(shutil, "rmtree", killed_before_removal)
        assert ep.commit() == 0
        monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert (ep.work_dir / spool.COMMITTING).is_file()
    with _open(root) as writer:
        [recovery] = writer.recovered
    assert recovery.episode_index is None and "committed before the crash" in recovery.note
    assert DatasetReader(root).episode_indices == [0]
    assert not ep.work_dir.exists()


def test_a_cancelled_episode_is_never_recovered(tmp_path: Path) -> None:
    """CANCEL disowns the spool at once: a kill before its files are gone recovers nothing."""
    root = tmp_path / "raw"
    with _open(root) as writer:
        ep = writer.begin_episode("pick")
        _add_black_frames(ep, 4)
        ep.disown()  # what Recorder.cancel does before the consumer discards the episode
        assert ep.work_dir.is_dir()  # the kill comes now
        ep._encoders.stop(close=False)
    with _open(root) as writer:
        assert writer.recovered == []
    assert DatasetReader(root).episode_indices == []
    assert not ep.work_dir.exists()


def test_a_commit_short_of_file_descriptors_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "raw"
    real = atomic._write_all
    failures = [3]

    def out_of_fds(fd: int, data: bytes) -> None:
        if failures[0] and os.readlink(f"/proc/self/fd/{fd}").endswith("episodes.jsonl"):
            failures[0] -= 1
            raise OSError(24, "Too many open files")
        real(fd, data)

    with _open(root) as writer:
        ep = writer.begin_episode("pick")
        _add_black_frames(ep, 4)
        monkeypatch.setattr(atomic, "_write_all", out_of_fds)
        assert ep.commit({"quality": "green"}) == 0
    assert failures == [0]
    assert DatasetReader(root).episode(0)["quality"] == "green"
    assert validate_dataset(root) == []


def test_a_commit_that_keeps_failing_keeps_the_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "raw"
    real = atomic._write_all

    def read_only(fd: int, data: bytes) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("episodes.jsonl"):
            raise OSError(30, "Read-only file system")
        real(fd, data)

    with _open(root) as writer:
        ep = writer.begin_episode("pick")
        _add_black_frames(ep, 4)
        monkeypatch.setattr(atomic, "_write_all", read_only)
        with pytest.raises(DatasetError, match="Read-only.*eva recover"):
            ep.commit({"quality": "green"})
        monkeypatch.setattr(atomic, "_write_all", real)
        assert sorted(p.name for p in ep.work_dir.iterdir()) == [
            "00.mp4", "00.spool.mp4", "01.mp4", "01.spool.mp4",
            "rows.arrows", "spool.json", "stopped.json",
        ]  # fmt: skip
    with _open(root) as writer:
        assert [r.frames for r in writer.recovered] == [4]
    row = DatasetReader(root).episode(0)
    # STOP's checks ran before the failed commit: their fields are kept beside the recovery's.
    assert row["quality"] == "red" and row["quality_issues"][0]["code"] == RECOVERED_CODE


def test_a_torn_fragment_is_cut_off(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _record_then_kill(root, 9)
    [work] = [p for p in (root / layout.WORK_DIR).iterdir() if p.is_dir()]
    video = work / spool.video_spool_name(0)
    whole = complete_fragments(video)
    assert 0 < whole <= video.stat().st_size
    with open(video, "r+b") as f:  # a kill in the middle of writing the next fragment
        f.truncate(whole)
        f.seek(whole)
        f.write(b"\x00\x00\x10\x00moof" + b"\x01" * 100)
    assert complete_fragments(video) == whole
    rows = work / spool.ROWS
    with open(rows, "ab") as f:  # and in the middle of a row batch
        f.write(b"\xff\xff\xff\xff\x00\x01\x00\x00")
    with _open(root) as writer:
        [recovery] = writer.recovered
    assert recovery.error is None and recovery.frames > 0
    assert validate_dataset(root) == []


def test_recovery_follows_no_link_planted_in_a_spool(tmp_path: Path) -> None:
    """A spool file replaced by a link to a file outside: refused, the outside file untouched."""
    root = tmp_path / "raw"
    _record_then_kill(root, 6)
    [work] = [p for p in (root / layout.WORK_DIR).iterdir() if p.is_dir()]
    outside = tmp_path / "outside.mp4"
    video = work / spool.video_spool_name(0)
    outside.write_bytes(video.read_bytes() + b"\0" * 1000)  # truncating it would lose bytes
    before = outside.read_bytes()
    video.unlink()
    video.symlink_to(outside)
    with _open(root) as writer:
        [recovery] = writer.recovered
    assert recovery.error is not None and "symlink" in recovery.error
    assert outside.read_bytes() == before
    assert work.is_dir()  # kept for another try once the link is gone
    assert DatasetReader(root).episode_indices == []


@pytest.mark.realtime
def test_collect_recovers_a_killed_recording_as_it_starts(tmp_path: Path) -> None:
    config = fault_campaign.write_config(tmp_path)
    proc = subprocess.Popen(
        [*EVA, "collect", str(config), "--episodes", "1", "--seconds", "30"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    lines = fault_campaign.Lines(proc.stderr)
    deadline = time.monotonic() + 60
    while not any(": recording" in text for _, text in lines.lines):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    time.sleep(3.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    raw = fault_campaign.dataset_dir(tmp_path)
    again = subprocess.run(
        [*EVA, "collect", str(config), "--episodes", "1", "--seconds", "0.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "recovered as episode 0" in again.stderr
    reader = DatasetReader(raw)
    assert reader.episode_indices == [0, 1]
    assert reader.episode(0)["quality_issues"][-1]["code"] == RECOVERED_CODE
    assert reader.episode(0)["length"] >= int((3.0 - 2.0) * FPS)
    assert validate_dataset(raw) == []


@pytest.mark.realtime
def test_fault_campaign(tmp_path: Path) -> None:
    """kill -9 at random instants of collect, the console's recorder and eva recover; after
    each: a valid dataset, no earlier episode lost, at most 2 s of a recording lost."""
    # A short run (make faults runs 1,000 kills); the two passes of make test kill at other
    # instants (their own seeds).
    kills = int(os.environ.get("EVA_FAULT_KILLS", "6"))
    seed = int(os.environ.get("EVA_FAULT_SEED", "2027")) + bool(os.environ.get("EVA_PUREPYTHON"))
    results = fault_campaign.campaign(kills, tmp_path, seed, console_share=0.2)
    report = fault_campaign.summary(results)
    assert report["violations"] == 0, report["problems"]
    assert report["kills"] == kills
