"""The review and what leaves the machine: stale exports are never uploaded, a killed upload's
remote staging is removed after a re-export, moved exports verify on their own, dataset text
never reaches a terminal or the console page as control sequences or HTML, and a full disk names
the file being written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sftp_server import SshdServer, sftp_config

from eva.cli import main
from eva.export.pipeline import export_dataset
from eva.export.staleness import export_staleness, stale_exports
from eva.formats import catalog
from eva.jobs import UPLOAD_JOB
from eva.quality.verdicts import review_episode
from eva.upload.gate import UploadRefused, check_upload
from eva.upload.job import start_upload
from eva.upload.sftp import STAGING_MARK, UploadOptions

pytest_plugins = ["sftp_server"]


def run_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def reviewed(synthetic_dataset) -> Path:  # noqa: ANN001 - the conftest factory
    """``P``: 3 green episodes, episode 1 QC-failed (accepted 0, 2; rejected 1)."""
    return synthetic_dataset(episodes=3, frames=[10, 12, 11], qc_verdicts=[None, "fail", None])


def upload_config(path: Path, log_dir: Path, port: int = 1) -> Path:
    """A config with an SFTP backend; the gate refuses before any connection is made."""
    path.write_text(
        "[collection]\n"
        f'log_dir = "{log_dir}"\n\n'
        "[collection.storage.sftp]\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        'user = "nobody"\n'
        f'remote_dir = "{log_dir / "remote"}"\n'
    )
    return path


# ---- E19: a review change after the export makes it stale; upload refuses it --------------


def test_upload_refuses_an_export_the_review_changed_since(reviewed: Path, tmp_path: Path) -> None:
    export_dataset(reviewed, "lerobot_v21")
    check_upload(reviewed, "lerobot_v21", backend_configured=True)  # current: allowed
    assert stale_exports(reviewed) == []

    code, out, err = run_cli("qc", reviewed, "0", "--fail")
    assert code == 0, err
    assert "lerobot_v21" in err and "stale" in err and "episode 0 now rejected" in err

    with pytest.raises(UploadRefused) as refused:
        check_upload(reviewed, "lerobot_v21", backend_configured=True)
    assert refused.value.reason == "stale_review"
    assert "episode 0 now rejected" in str(refused.value)

    config = upload_config(tmp_path / "eva.toml", tmp_path)
    code, out, err = run_cli("upload", reviewed, "--format", "v21", "--config", config)
    assert code == 1
    assert err.count("\n") == 1 and "upload refused (stale_review)" in err, err
    assert "episode 0" in err
    assert not (catalog.parse("lerobot_v21").export_root(reviewed) / UPLOAD_JOB).exists()

    code, out, err = run_cli("info", reviewed)
    assert code == 0 and "stale" in out and "lerobot_v21" in out and "episode 0" in out
    code, out, _ = run_cli("info", reviewed, "--json")
    stale = json.loads(out)["stale_exports"]
    assert [s["format"] for s in stale] == ["lerobot_v21"]

    # Putting the verdict back makes the export current again: no warning, upload allowed.
    code, _, err = run_cli("qc", reviewed, "0", "--clear")
    assert code == 0 and "stale" not in err
    check_upload(reviewed, "lerobot_v21", backend_configured=True)
    code, out, _ = run_cli("info", reviewed)
    assert "stale" not in out


def test_accepted_recorded_or_removed_since_is_stale_too(reviewed: Path) -> None:
    export_dataset(reviewed, "hdf5")
    run_cli("qc", reviewed, "1", "--pass")
    state = export_staleness(reviewed, "hdf5")
    assert state is not None and state.stale
    assert state.changed == {1: ("rejected", "accepted")}
    assert state.describe() == "episode 1 now accepted"
    # The verdict back as exported, then a note alone: no subset changes, nothing is stale.
    run_cli("qc", reviewed, "1", "--fail")
    code, _, err = run_cli("qc", reviewed, "1", "--note", "looked again")
    assert code == 0 and "stale" not in err
    assert export_staleness(reviewed, "hdf5").stale is False  # type: ignore[union-attr]

    episodes = reviewed / "meta" / "episodes.jsonl"
    rows = episodes.read_text().splitlines()
    # An episode recorded after the export (only the review row matters here).
    episodes.write_text("\n".join([*rows, json.dumps({**json.loads(rows[0]), "episode_index": 3})]))
    state = export_staleness(reviewed, "hdf5")
    assert state is not None and state.added == (3,) and not state.changed
    assert "episode 3 recorded since the export" in state.describe()
    # An exported episode gone from the source.
    episodes.write_text("\n".join(rows[:-1]) + "\n")
    state = export_staleness(reviewed, "hdf5")
    assert state is not None and state.removed == (2,) and not state.added
    with pytest.raises(UploadRefused) as refused:
        check_upload(reviewed, "hdf5", backend_configured=True)
    assert refused.value.reason == "stale_review"
    assert "no longer in the source" in str(refused.value)


def test_unreadable_review_refuses_upload(reviewed: Path) -> None:
    export_dataset(reviewed, "hdf5")
    (reviewed / "meta" / "episodes.jsonl").write_text('{"episode_index": "x"}\n')
    with pytest.raises(UploadRefused) as refused:
        check_upload(reviewed, "hdf5", backend_configured=True)
    assert refused.value.reason == "review_unreadable"
    assert "episodes.jsonl" in str(refused.value)


def test_review_changed_during_the_upload_is_not_published(
    reviewed: Path, sshd_server: SshdServer, known_hosts: Path, remote_root: Path
) -> None:
    export_dataset(reviewed, "lerobot_v21")
    config = sftp_config(sshd_server, remote_root, known_hosts)
    job = start_upload(
        reviewed, "v21", config, options=UploadOptions(connections=1, sessions_per_connection=1)
    )
    changed: list[bool] = []

    def fail_episode_zero(progress: object) -> None:
        if not changed:  # qc takes no export lock: a verdict can change mid-upload
            changed.append(True)
            review_episode(reviewed, 0, verdict="fail")

    job.progress.listeners.insert(0, fail_episode_zero)
    assert job.wait(120)
    assert changed and job.result is None
    assert "stale_review" in (job.error or "")
    assert list(remote_root.iterdir()) == []  # nothing published, staging removed


# ---- E20: --resume after a re-export removes the killed upload's remote staging ------------

KILLED_UPLOADER = """
import os, signal, sys
from pathlib import Path
from eva.upload.config import SftpConfig
from eva.upload.job import start_upload
from eva.upload.sftp import UploadOptions

source, fmt, remote_dir, port, user, key, known_hosts = sys.argv[1:8]
config = SftpConfig(host="127.0.0.1", port=int(port), user=user, identity_file=Path(key),
                    remote_dir=remote_dir, known_hosts=Path(known_hosts))
job = start_upload(Path(source), fmt, config,
                   options=UploadOptions(connections=1, sessions_per_connection=1))
def die(progress):
    if progress.files >= 2:
        os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, no final record
job.progress.listeners.insert(0, die)
job.wait(120)
"""


@pytest.mark.parametrize("resume", [True, False])
def test_upload_after_reexport_removes_the_killed_uploads_staging(
    reviewed: Path,
    sshd_server: SshdServer,
    known_hosts: Path,
    remote_root: Path,
    resume: bool,
) -> None:
    export_dataset(reviewed, "lerobot_v21")
    args = [str(reviewed), "lerobot_v21", str(remote_root), str(sshd_server.port)]
    args += [sshd_server.user, str(sshd_server.client_key), str(known_hosts)]
    killed = subprocess.run([sys.executable, "-c", KILLED_UPLOADER, *args], timeout=120)
    assert killed.returncode == -9
    leftovers = [p for p in remote_root.iterdir() if STAGING_MARK in p.name]
    assert len(leftovers) == 1 and leftovers[0].is_dir()

    export_dataset(reviewed, "lerobot_v21")  # a new export job: the staged files are not its own
    config = sftp_config(sshd_server, remote_root, known_hosts)
    job = start_upload(reviewed, "v21", config, resume=resume)
    assert job.wait(120)
    assert job.result is not None, job.error
    assert not job.result.resumed
    assert [p.name for p in remote_root.iterdir()] == [f"{reviewed.parent.name}-lerobot_v21"]


# ---- C13: dataset text never reaches the terminal as control sequences -------------------

HOSTILE_NOTE = "\x1b[2J\x1b]0;pwned\x07 \x9b31m red\x7f \u202eevil"
# A lone surrogate: JSON can carry it (as an escape), UTF-8 cannot print it.
SURROGATE_NOTE = HOSTILE_NOTE + " \udc80"
HOSTILE_TASK = "pick\x1b[31m the cube\x07\x85"
UNSAFE = [chr(c) for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))] + ["\u202e", "\udc80"]


def assert_terminal_safe(text: str) -> None:
    lines = text.split("\n")
    for ch in UNSAFE:
        if ch == "\n":
            continue
        assert all(ch not in line for line in lines), (repr(ch), text)


@pytest.fixture
def hostile(synthetic_dataset) -> Path:  # noqa: ANN001 - the conftest factory
    """A dataset named with an ESC, a task prompt and a note full of controls."""
    return synthetic_dataset(
        name="pick\x1b]0;title\x07",
        episodes=3,
        frames=[10, 12, 11],
        qc_verdicts=[None, "fail", None],
        qc_notes=[HOSTILE_NOTE, None, None],
        tasks=[HOSTILE_TASK],
    )


def with_surrogate_note(dataset: Path) -> None:
    """Episode 0's note gets a lone surrogate, written as the JSON escape a hand edit gives."""
    episodes = dataset / "meta" / "episodes.jsonl"
    rows = [json.loads(line) for line in episodes.read_text().split("\n") if line]
    rows[0]["qc_note"] = SURROGATE_NOTE
    episodes.write_text("".join(json.dumps(r) + "\n" for r in rows))  # ASCII: \udc80 escaped


def test_qc_list_info_validate_escape_dataset_text(hostile: Path) -> None:
    original = (hostile / "meta" / "episodes.jsonl").read_text()
    with_surrogate_note(hostile)
    code, out, err = run_cli("qc", hostile, "--list")
    assert code == 0, err
    assert_terminal_safe(out + err)
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in out and "\\x9b31m" in out and "\\udc80" in out
    assert len(out.splitlines()) == 1 + 3 + 1  # header, one line per episode, totals

    code, out, err = run_cli("qc", hostile, "--list", "--json")
    assert code == 0, err
    assert_terminal_safe(out)
    assert json.loads(out.splitlines()[0])["qc_note"] == SURROGATE_NOTE  # JSON keeps the data

    code, out, err = run_cli("info", hostile)
    assert code == 0, err
    assert_terminal_safe(out + err)
    assert "pick\\x1b[31m the cube\\x07\\x85" in out
    code, out, err = run_cli("info", hostile, "--json")
    assert_terminal_safe(out)
    assert json.loads(out)["tasks"] == [HOSTILE_TASK]

    code, out, err = run_cli("validate", hostile)
    assert_terminal_safe(out + err)

    (hostile / "meta" / "episodes.jsonl").write_text(original)
    code, out, err = run_cli("qc", hostile, "0", "--pass")
    assert code == 0, err
    assert_terminal_safe(out + err)


def test_export_verify_cleanup_escape_dataset_text(hostile: Path) -> None:
    code, out, err = run_cli("export", hostile, "--format", "v21", "--json")
    assert code == 0, err
    assert_terminal_safe(out + err)
    done = json.loads(out.splitlines()[-1])
    assert done["event"] == "completed" and "\x1b" in done["accepted_dir"]  # the data, intact
    code, out, err = run_cli("verify", done["accepted_dir"])
    assert code == 0, out + err
    assert_terminal_safe(out + err)
    assert "\\x1b]0;title\\x07" in out
    code, out, err = run_cli("cleanup", hostile)
    assert_terminal_safe(out + err)

    # An error naming the dataset: one escaped line.
    (hostile / "meta" / "info.json").write_text("{not json")
    code, out, err = run_cli("export", hostile, "--format", "v21")
    assert code == 1
    assert_terminal_safe(out + err)
    assert err.startswith("eva: error: ") and err.count("\n") == 1


def test_printable_escapes_every_control_and_keeps_the_rest() -> None:
    from eva.textsafe import json_line, printable

    assert printable("plain – ünïcode ✓ 日本") == "plain – ünïcode ✓ 日本"
    assert printable("a\x1b[2Jb\x07\n\t\x7f\x9b\u202e\udcff") == (
        "a\\x1b[2Jb\\x07\\x0a\\x09\\x7f\\x9b\\u202e\\udcff"
    )
    line = json_line({"note": "\x1b\x9b\u2028\udc80ü"})
    assert_terminal_safe(line)
    assert "ü" in line and json.loads(line) == {"note": "\x1b\x9b\u2028\udc80ü"}


def test_collect_list_escapes_prompts_and_names(tmp_path: Path) -> None:
    config = tmp_path / "rig.toml"
    config.write_text(
        "[collection]\n"
        'log_dir = "logs"\n'
        "fps = 10\n\n"
        "[collection.tasks]\n"
        '"demo\\u001b[2J" = ["wave\\u001b]0;pwned\\u0007", "point\\u009b1m"]\n\n'
        "[[collection.cameras]]\n"
        'key = "observation.images.front"\n'
        "width = 64\n"
        "height = 48\n"
    )
    code, out, err = run_cli("collect", config, "--list")
    assert_terminal_safe(out + err)
    if code == 0:  # the name may be refused instead; either way nothing raw is printed
        assert "wave\\x1b]0;pwned\\x07" in out and "point\\x9b1m" in out
    code, out, err = run_cli("collect", config, "--list", "--json")
    assert_terminal_safe(out + err)


# ---- C13: the console never inserts dataset text as HTML ----------------------------------

HTML_NOTE = "<img src=x onerror=alert(1)>"
HTML_TASK = "<script>alert(2)</script> pick"
STATIC = Path(__file__).resolve().parents[1] / "python" / "eva" / "console" / "static"


def test_console_serves_dataset_text_as_json_and_the_page_never_parses_it(
    tmp_path: Path,
) -> None:
    from console_server import ConsoleServer, write_console_config

    from eva.capture.synthetic import write_synthetic_dataset

    config = write_console_config(tmp_path / "rig.toml", tmp_path / "logs")
    write_synthetic_dataset(
        tmp_path / "logs" / "fold" / "raw",
        episodes=2,
        frames=[10, 10],
        cameras=["observation.images.front"],
        qc_notes=[HTML_NOTE, None],
        tasks=[HTML_TASK],
    )
    with ConsoleServer(config, tmp_path / "token") as console:
        api = console.client()
        listed = api.get("/api/datasets/fold/episodes")
        assert listed.status_code == 200, listed.text
        assert listed.headers["content-type"].startswith("application/json")
        episodes = listed.json()["episodes"]
        assert episodes[0]["qc_note"] == HTML_NOTE and episodes[0]["tasks"] == [HTML_TASK]
        put = api.put("/api/datasets/fold/episodes/1/qc", json={"note": HTML_NOTE})
        assert put.status_code == 200 and put.headers["content-type"].startswith("application/json")
        page = api.get("/")
        assert page.status_code == 200
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("style-src")[0]
    # The page's scripts build every node with createElement and set text with textContent.
    for path in sorted(STATIC.rglob("*.js")):
        script = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script, f"{path.relative_to(STATIC)}: {sink}"


# ---- E22: a moved, renamed or symlinked export verifies on its own -------------------------


@pytest.mark.parametrize("fmt", ["lerobot_v21", "lerobot_v3", "hdf5", "mcap"])
def test_moved_renamed_and_symlinked_exports_verify(
    reviewed: Path, tmp_path: Path, fmt: str
) -> None:
    import shutil

    from eva.export.verify import verify_export, verify_export_report

    result = export_dataset(reviewed, fmt)
    moved = tmp_path / "archive" / f"pick-{fmt}-2026"
    shutil.copytree(result.accepted_dir, moved, symlinks=True)
    report = verify_export_report(moved)
    assert report.problems == [] and report.source is None
    code, out, err = run_cli("verify", moved)
    assert code == 0, out + err
    assert "own consistency only" in out

    # The same layout under another root, without its sibling: no source, no pair to check.
    renamed = tmp_path / "elsewhere" / fmt / "rejected"
    shutil.copytree(result.rejected_dir, renamed, symlinks=True)
    assert verify_export(renamed) == []

    # A symlink the user names is theirs to choose: resolved, then checked at its home.
    link = tmp_path / "latest"
    link.symlink_to(result.accepted_dir, target_is_directory=True)
    report = verify_export_report(link)
    assert report.problems == [] and report.source == reviewed.resolve()

    # With --source the copy is compared with the current review, which has changed since.
    assert verify_export(moved, source_dir=reviewed) == []
    run_cli("qc", reviewed, "0", "--fail")
    problems = verify_export(moved, source_dir=reviewed)
    assert [p.code for p in problems] == ["source_episode_indices"]
    code, out, err = run_cli("verify", moved, "--source", reviewed)
    assert code == 1 and "source_episode_indices" in err
    assert verify_export(moved) == []  # on its own it is still what it was

    # Its own consistency is still checked: the marker's totals and the files.
    marker_path = moved / "meta" / "quality_split.json"
    marker = json.loads(marker_path.read_text())
    marker_path.write_text(json.dumps({**marker, "total_frames": marker["total_frames"] + 1}))
    assert "quality_split" in {p.code for p in verify_export(moved)}
    marker_path.write_text(json.dumps({**marker, "subset": "other"}))
    assert "subset" in {p.code for p in verify_export(moved)}
    marker_path.write_text(json.dumps(marker))
    data = sorted(p for p in (moved / "data").rglob("*") if p.is_file())
    data[0].write_bytes(b"not a data file")
    assert verify_export(moved) != []


# ---- C16: a full disk names the file being written; nothing is published -------------------


def _mount_small_tmpfs(directory: Path, size: str = "64k") -> bool:
    """A real, tiny filesystem for the export root (needs root and mount rights)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _limit_file_size(limit: int = 20_000):  # noqa: ANN202 - a preexec_fn
    def apply() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("fmt", ["lerobot_v21", "lerobot_v3", "hdf5", "mcap"])
def test_full_disk_names_the_file_and_publishes_nothing(synthetic_dataset, fmt: str) -> None:  # noqa: ANN001
    source = synthetic_dataset(
        name="site/raw", episodes=3, frames=[60, 60, 60], width=160, height=120
    )
    export = source.parent / "export"
    mounted = _mount_small_tmpfs(export)
    # Without mount rights: a file size limit in the exporting process (EFBIG, not ENOSPC).
    reason = "No space left on device" if mounted else "File too large"
    command = [sys.executable, "-m", "eva.cli", "export", str(source), "--format", fmt, "--json"]
    if not mounted:
        command.append("--copy-videos")  # a hard link or reflink writes no data
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=None if mounted else _limit_file_size(),
        )
        assert done.returncode == 1, done.stdout + done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith(f"eva: error: {export}/") and line.endswith(f": {reason}"), line
        written = Path(line.removeprefix("eva: error: ").removesuffix(f": {reason}"))
        assert written.name.startswith(("episode_", "file-", "job.json")), line
        failed = json.loads(done.stdout.splitlines()[-1])
        assert failed["event"] == "failed" and failed["error"] == line.removeprefix("eva: error: ")
        root = export / fmt
        assert not (root / "accepted").exists() and not (root / "rejected").exists()
        assert [p.name for p in export.iterdir() if p.name.startswith(".eva-staging")] == []
    finally:
        if mounted:
            subprocess.run(["umount", str(export)], check=True, timeout=30)
