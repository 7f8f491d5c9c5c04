"""Filesystem safety under hostile datasets and faults (eva.dataset.fsafe and its callers).

Every test builds a real dataset with the writer and runs the real CLI (``CliRunner``, or a
subprocess where a hang or another user is part of the case). Permission cases run as
``nobody`` (tests run as root here, and root ignores file modes); the full-disk and read-only
filesystem cases mount a small tmpfs / a read-only bind mount, and skip where mounting is not
allowed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import main
from eva.dataset import fsafe, layout, share
from eva.dataset.atomic import TMP_PREFIX, atomic_write_bytes
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset
from eva.dataset.writer import DatasetWriter, VectorSpec
from eva.jobs import read_job

EVA = [sys.executable, "-m", "eva.cli"]
NOBODY = 65534
FRONT = "observation.images.front"


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def _error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("eva: error:")]
    assert len(lines) == 1, output
    return lines[0]


def _assert_one_line_error(code: int, output: str, *needles: str) -> None:
    assert code == 1, output
    assert "Traceback" not in output, output
    line = _error_line(output)
    for needle in needles:
        assert needle in line, line


@pytest.fixture
def dataset(small_dataset: Path) -> Path:
    """A 3-episode dataset (green / red+pass / red) at ``<tmp>/raw``; export goes to
    ``<tmp>/export/<fmt>``."""
    return small_dataset


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


# ---- A1: the export lock never follows a symlink ------------------------------------------


@pytest.mark.parametrize("command", ["export", "cleanup"])
def test_export_lock_symlink_is_refused_and_not_followed(
    dataset: Path, tmp_path: Path, command: str
) -> None:
    victim = _victim(tmp_path)
    export = tmp_path / "export"
    export.mkdir()
    lock = export / ".eva-lerobot_v21.lock"
    lock.symlink_to(victim)
    args = [command, dataset, "--format", "v21"]
    code, output = _run(args)
    _assert_one_line_error(code, output, str(lock), "symlink")
    assert victim.read_text() == "precious\n"
    assert not (export / "lerobot_v21").exists()


# ---- A4: the export root or the directory holding it is a symlink ---------------------------


@pytest.mark.parametrize("which", ["root", "parent"])
@pytest.mark.parametrize("command", ["export", "cleanup"])
def test_export_root_symlink_is_refused(
    dataset: Path, tmp_path: Path, which: str, command: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    if which == "root":
        (tmp_path / "export").mkdir()
        link = tmp_path / "export" / "lerobot_v21"
    else:
        link = tmp_path / "export"
    link.symlink_to(outside, target_is_directory=True)
    code, output = _run([command, dataset, "--format", "v21"])
    _assert_one_line_error(code, output, str(link), "symlink")
    assert list(outside.iterdir()) == []


def test_upload_gate_refuses_a_symlinked_export_root(dataset: Path, tmp_path: Path) -> None:
    from eva.upload.gate import UploadRefused, check_upload

    assert _run(["export", dataset, "--format", "v21"])[0] == 0
    real = tmp_path / "export" / "lerobot_v21"
    moved = tmp_path / "elsewhere"
    real.rename(moved)
    real.symlink_to(moved, target_is_directory=True)
    with pytest.raises(UploadRefused, match="symlink") as refused:
        check_upload(dataset, "v21", backend_configured=True)
    assert refused.value.reason == "accepted_dir_mismatch"


# ---- A2: qc, cleanup, the writer and the console refuse links in eva-managed paths ----------


def _plant_link(dataset: Path, tmp_path: Path, rel: str) -> Path:
    """Replace ``dataset/rel`` by a link to a copy outside; returns the outside copy."""
    inside = dataset / rel
    outside = tmp_path / ("outside-" + rel.replace("/", "-"))
    if inside.is_dir():
        shutil.copytree(inside, outside)
        shutil.rmtree(inside)
    elif inside.exists():
        shutil.copy2(inside, outside)
        inside.unlink()
    else:
        outside.write_text("")
    inside.symlink_to(outside)
    return outside


def _tree_bytes(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


LINKED_PATHS = ["meta", layout.EPISODES, layout.WORK_DIR, f"{layout.WORK_DIR}/{layout.META_LOCK}"]


@pytest.mark.parametrize("rel", LINKED_PATHS)
def test_qc_refuses_links_in_managed_paths(dataset: Path, tmp_path: Path, rel: str) -> None:
    (dataset / layout.WORK_DIR).mkdir(exist_ok=True)
    outside = _plant_link(dataset, tmp_path, rel)
    before = _tree_bytes(outside)
    for args in (["qc", dataset, "0", "--fail", "--note", "x"], ["qc", dataset, "--list"]):
        code, output = _run(args)
        _assert_one_line_error(code, output, "is a symlink")
        assert str(dataset / rel) in _error_line(output)
    assert _tree_bytes(outside) == before


@pytest.mark.parametrize("rel", LINKED_PATHS)
def test_writer_validate_export_refuse_links_in_managed_paths(
    dataset: Path, tmp_path: Path, rel: str
) -> None:
    (dataset / layout.WORK_DIR).mkdir(exist_ok=True)
    outside = _plant_link(dataset, tmp_path, rel)
    before = _tree_bytes(outside)
    with pytest.raises(DatasetError, match="is a symlink"):
        DatasetWriter.create_or_open(dataset, fps=30, vectors=[VectorSpec("x", 2)])
    problems = validate_dataset(dataset)
    assert [p.code for p in problems] == ["unsafe_path"]
    code, output = _run(["export", dataset, "--format", "v21"])
    _assert_one_line_error(code, output, "is a symlink")
    code, output = _run(["cleanup", dataset])
    assert code == 1 or "symlink" not in output  # a link is refused, never followed
    assert _tree_bytes(outside) == before


def test_cleanup_refuses_a_linked_meta_dir(dataset: Path, tmp_path: Path) -> None:
    outside = _plant_link(dataset, tmp_path, "meta")
    (outside / f"{TMP_PREFIX}episodes.jsonl.dead").write_text("x")
    code, output = _run(["cleanup", dataset])
    _assert_one_line_error(code, output, str(dataset / "meta"), "is a symlink")
    assert (outside / f"{TMP_PREFIX}episodes.jsonl.dead").exists()


# ---- A3: an episode file that is a link (even inside the dataset) --------------------------


def test_in_dataset_symlinked_episode_video_is_refused(dataset: Path, tmp_path: Path) -> None:
    reader = DatasetReader(dataset)
    video0 = reader.video_path(0, FRONT)
    video2 = reader.video_path(2, FRONT)
    video0.unlink()
    video0.symlink_to(os.path.relpath(video2, video0.parent))
    problems = validate_dataset(dataset)
    assert [p.code for p in problems] == ["unsafe_path"]
    assert str(video0) in problems[0].message and "symlink" in problems[0].message
    code, output = _run(["export", dataset, "--format", "v21"])
    _assert_one_line_error(code, output, str(video0), "symlink")
    assert not (tmp_path / "export" / "lerobot_v21" / "accepted").exists()


def test_share_file_never_links_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.mp4"
    real.write_bytes(b"frames")
    real.chmod(0o444)
    link = tmp_path / "link.mp4"
    link.symlink_to(real.name)
    with pytest.raises(DatasetError, match="is a symlink"):
        share.share_file(link, tmp_path / "out.mp4")
    assert not (tmp_path / "out.mp4").exists()


# ---- C10: a FIFO in place of an episode or metadata file -----------------------------------


def _fifo_in_place(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("which", ["mp4", "parquet", "episodes"])
def test_fifo_fails_at_once(dataset: Path, tmp_path: Path, which: str) -> None:
    reader = DatasetReader(dataset)
    target = {
        "mp4": reader.video_path(1, FRONT),
        "parquet": reader.data_path(1),
        "episodes": dataset / layout.EPISODES,
    }[which]
    _fifo_in_place(target)
    for args in (["validate", dataset], ["export", dataset, "--format", "v21"]):
        # A subprocess with a timeout: before the fix this hung forever.
        result = subprocess.run(
            [*EVA, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr
        assert str(target) in result.stdout + result.stderr
        assert "FIFO" in result.stdout + result.stderr
    job = read_job(tmp_path / "export" / "lerobot_v21" / "job.json")
    assert job is None or job.state != "running"


def test_open_regular_does_not_block_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(DatasetError, match="not a regular file \\(a FIFO\\)"):
        fsafe.open_regular(fifo)


# ---- C12: modes follow the umask; a rewrite keeps the old mode -----------------------------


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_new_metadata_follows_umask_and_qc_keeps_the_mode(
    synthetic_dataset: Callable[..., Path],
) -> None:
    with _umask(0o022):
        root = synthetic_dataset(episodes=2, frames=6)
    for rel in (layout.INFO, layout.EPISODES, layout.EPISODES_STATS, layout.TASKS, layout.STATS):
        assert stat.S_IMODE((root / rel).stat().st_mode) == 0o644, rel
    episodes = root / layout.EPISODES
    assert _run(["qc", root, "0", "--fail"])[0] == 0
    assert stat.S_IMODE(episodes.stat().st_mode) == 0o644
    episodes.chmod(0o640)
    assert _run(["qc", root, "0", "--pass"])[0] == 0
    assert stat.S_IMODE(episodes.stat().st_mode) == 0o640


def test_atomic_write_keeps_mode_and_refuses_a_link(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    with _umask(0o027):
        atomic_write_bytes(target, b"1")
        assert stat.S_IMODE(target.stat().st_mode) == 0o640
        target.chmod(0o604)
        atomic_write_bytes(target, b"2")
    assert stat.S_IMODE(target.stat().st_mode) == 0o604 and target.read_bytes() == b"2"
    victim = _victim(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    with pytest.raises(DatasetError, match="is a symlink"):
        atomic_write_bytes(link, b"3")
    assert victim.read_text() == "precious\n"


# ---- C15: a killed qc's temporaries are removed ---------------------------------------------


def _stale_temp(dataset: Path) -> Path:
    stale = dataset / "meta" / f"{TMP_PREFIX}episodes.jsonl.dead0001"
    stale.write_bytes((dataset / layout.EPISODES).read_bytes())
    return stale


def test_qc_cleanup_and_writer_remove_stale_temporaries(dataset: Path) -> None:
    stale = _stale_temp(dataset)
    assert _run(["qc", dataset, "0", "--note", "looked"])[0] == 0
    assert not stale.exists()

    stale = _stale_temp(dataset)
    code, output = _run(["cleanup", dataset])
    assert code == 0, output
    assert f"raw: removed {stale}" in output
    assert not stale.exists()

    stale = _stale_temp(dataset)
    write_synthetic_dataset(dataset, episodes=1, frames=5)  # opens the writer: appends one
    assert not stale.exists()


def test_cleanup_spares_a_live_writers_temporaries(dataset: Path) -> None:
    from eva.dataset.locks import try_flock

    info_temp = dataset / "meta" / f"{TMP_PREFIX}info.json.live0001"
    info_temp.write_text("{}")
    qc_temp = _stale_temp(dataset)
    fd = try_flock(dataset / layout.WORK_DIR / layout.WRITER_LOCK)  # a writer has it open
    assert fd is not None
    try:
        code, output = _run(["cleanup", dataset])
    finally:
        os.close(fd)
    assert code == 0, output
    assert info_temp.exists() and not qc_temp.exists()


# ---- E21: committed raw files are read-only; exports share them safely ---------------------


def test_committed_episode_files_are_read_only(dataset: Path) -> None:
    reader = DatasetReader(dataset)
    for ep in reader.episode_indices:
        for path in (reader.data_path(ep), reader.video_path(ep, FRONT)):
            assert fsafe.is_read_only(path.stat()), path


def test_export_links_only_read_only_files(dataset: Path, tmp_path: Path) -> None:
    reader = DatasetReader(dataset)
    writable = reader.video_path(0, FRONT)
    writable.chmod(0o644)  # as an older eva committed it
    assert _run(["export", dataset, "--format", "v21"])[0] == 0
    out = tmp_path / "export" / "lerobot_v21" / "accepted" / "videos" / "chunk-000" / FRONT
    exported0 = out / "episode_000000.mp4"  # accepted episode 0 is raw episode 0
    exported1 = out / "episode_000001.mp4"  # raw episode 1 (red, verdict pass), read-only
    assert exported0.read_bytes() == writable.read_bytes()
    assert exported0.stat().st_ino != writable.stat().st_ino  # copied (or reflinked)
    raw1 = reader.video_path(1, FRONT)
    if exported1.stat().st_ino == raw1.stat().st_ino:  # hard-linked: only because read-only
        assert fsafe.is_read_only(raw1.stat())


def test_share_file_choice(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x" * 5000)
    how = share.share_file(src, tmp_path / "a")
    assert how in ("reflink", "copy")  # writable: never a hard link
    assert (tmp_path / "a").read_bytes() == src.read_bytes()
    src.chmod(0o444)
    how = share.share_file(src, tmp_path / "b")
    assert how in ("reflink", "link", "copy")
    assert share.share_file(src, tmp_path / "c", link=False) == "copy"
    assert (tmp_path / "c").read_bytes() == src.read_bytes()


# ---- C11: filesystem faults are one named line ---------------------------------------------


def test_symlink_loop_is_one_line(dataset: Path) -> None:
    info = dataset / layout.INFO
    info.unlink()
    info.symlink_to(info.name)  # a loop: info.json -> info.json
    for args in (
        ["qc", dataset, "--list"],
        ["info", dataset],
        ["export", dataset, "--format", "v21"],
    ):
        code, output = _run(args)
        _assert_one_line_error(code, output, str(info), "is a symlink")
    code, output = _run(["validate", dataset])  # validate lists each problem on its own line
    assert code == 1 and "Traceback" not in output
    assert f"[unsafe_path] {info}: is a symlink" in output


def _mount(args: list[str]) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here ({result.stderr.strip()})")


@pytest.fixture
def tiny_tmpfs() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="eva-tmpfs-"))
    _mount(["-t", "tmpfs", "-o", "size=2M", "tmpfs", str(where)])
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def test_qc_on_a_full_disk_is_one_line(tiny_tmpfs: Path, dataset: Path) -> None:
    """A 2 MB tmpfs, filled up: a qc rewrite gets ENOSPC, names the file, changes nothing."""
    root = tiny_tmpfs / "raw"
    shutil.copytree(dataset, root, symlinks=True)
    episodes = root / layout.EPISODES
    before = episodes.read_bytes()
    filler = tiny_tmpfs / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
    code, output = _run(["qc", root, "0", "--note", "n" * 2000])  # the longest note allowed
    _assert_one_line_error(code, output, str(episodes))
    assert "No space left" in output
    assert episodes.read_bytes() == before
    assert not [p for p in (root / "meta").iterdir() if p.name.startswith(TMP_PREFIX)]


@pytest.fixture
def read_only_copy(dataset: Path) -> Iterator[Path]:
    """The dataset, with a stale temp, seen through a read-only bind mount."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    _stale_temp(dataset)
    where = Path(tempfile.mkdtemp(prefix="eva-ro-"))
    _mount(["--bind", str(dataset), str(where)])
    try:
        _mount(["-o", "remount,ro,bind", str(where)])
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def test_qc_and_cleanup_on_a_read_only_filesystem(read_only_copy: Path) -> None:
    code, output = _run(["qc", read_only_copy, "0", "--fail"])
    _assert_one_line_error(code, output, str(read_only_copy), "Read-only file system")
    code, output = _run(["cleanup", read_only_copy])
    _assert_one_line_error(code, output, str(read_only_copy), "Read-only file system")
    code, output = _run(["qc", read_only_copy, "--list"])
    assert code == 0, output  # reading still works


# ---- as an unprivileged user -----------------------------------------------------------------


def _can_run_as_nobody() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    probe = _as_nobody([sys.executable, "-c", "import eva"], cwd=Path("/"))
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run this Python/eva: {probe.stderr.strip()[-200:]}")


def _as_nobody(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["HOME"] = str(cwd)
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
        env=env,
    )


def _eva_as_nobody(cwd: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return _as_nobody([*EVA, *map(str, args)], cwd)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory nobody can reach (pytest's tmp_path is 0700 root)."""
    where = Path(tempfile.mkdtemp(prefix="eva-nobody-"))
    where.chmod(0o755)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _make_readable_tree(root: Path) -> None:
    """0644 files, 0755 directories (a dataset copied with a 022 umask)."""
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
        del dirnames


def test_unprivileged_user_validate_qc_export_verify_cleanup(
    shared_dir: Path, dataset: Path
) -> None:
    _can_run_as_nobody()
    # Read-only operations on a root-owned 0644/0755 tree.
    with _umask(0o022):
        owned_by_root = shared_dir / "rootsite" / "raw"
        owned_by_root.parent.mkdir()
        owned_by_root.parent.chmod(0o755)
        shutil.copytree(dataset, owned_by_root)
    _make_readable_tree(owned_by_root.parent)
    for args in (["validate", owned_by_root], ["qc", owned_by_root, "--list"]):
        result = _eva_as_nobody(shared_dir, *args)
        assert result.returncode == 0, result
    # A review or an export of a tree nobody may not write: one line, nothing changed.
    result = _eva_as_nobody(shared_dir, "qc", owned_by_root, "0", "--fail")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result
    assert "Permission denied" in result.stderr and str(owned_by_root) in result.stderr
    result = _eva_as_nobody(shared_dir, "export", owned_by_root, "--format", "v21")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result

    # Writing operations on a copy nobody owns (made by nobody, with nobody's 022 umask).
    site = shared_dir / "site"
    site.mkdir()
    os.chown(site, NOBODY, NOBODY)
    copy = _as_nobody(["sh", "-c", f"umask 022 && cp -r {owned_by_root} {site / 'raw'}"], site)
    assert copy.returncode == 0, copy
    raw = site / "raw"
    for args in (
        ["validate", raw],
        ["qc", raw, "0", "--fail", "--note", "as nobody"],
        ["qc", raw, "--list"],
        ["export", raw, "--format", "v21"],
        ["verify", site / "export" / "lerobot_v21" / "accepted"],
        ["verify", site / "export" / "lerobot_v21" / "rejected"],
        ["cleanup", raw],
    ):
        result = _eva_as_nobody(site, *args)
        assert result.returncode == 0, (args, result)
    assert stat.S_IMODE((raw / layout.EPISODES).stat().st_mode) == 0o644
    exported = site / "export" / "lerobot_v21" / "accepted" / layout.INFO
    assert stat.S_IMODE(exported.stat().st_mode) == 0o644


def test_unreadable_files_as_nobody_are_one_line(shared_dir: Path, dataset: Path) -> None:
    _can_run_as_nobody()
    site = shared_dir / "site"
    shutil.copytree(dataset.parent / dataset.name, site / "raw")
    _make_readable_tree(site)
    raw = site / "raw"
    videos = raw / "videos"
    videos.chmod(0o700)  # an unreadable videos directory
    result = _eva_as_nobody(shared_dir, "validate", raw)
    assert result.returncode == 1 and "Traceback" not in result.stderr + result.stdout, result
    assert str(videos) in result.stdout + result.stderr
    videos.chmod(0o755)
    episodes = raw / layout.EPISODES
    episodes.chmod(0o600)  # an unreadable episodes.jsonl
    for args in (["qc", raw, "--list"], ["validate", raw], ["export", raw, "--format", "v21"]):
        result = _eva_as_nobody(shared_dir, *args)
        assert result.returncode == 1 and "Traceback" not in result.stderr, (args, result)
        assert str(episodes) in result.stdout + result.stderr, (args, result)


# ---- A2: the console uses the same containment check -----------------------------------------


def test_console_refuses_a_linked_episodes_file(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from console_server import write_console_config

    from eva.console.session import ConsoleError, ConsoleSession

    config = write_console_config(tmp_path / "rig.toml", tmp_path / "logs")
    session = ConsoleSession(config, durable=False)
    try:
        root = session.dataset_root("pick")
        write_synthetic_dataset(root, episodes=2, frames=5)
        outside = _plant_link(root, tmp_path, layout.EPISODES)
        before = outside.read_bytes()
        for call in (
            lambda: session.episodes("pick"),
            lambda: session.set_review("pick", 0, {"verdict": "fail"}),
        ):
            with pytest.raises(ConsoleError) as refused:
                call()
            assert refused.value.code == "unsafe_path", refused.value
            assert "is a symlink" in str(refused.value)
        assert outside.read_bytes() == before
    finally:
        session.close()
