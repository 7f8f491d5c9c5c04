"""`eva collect`: --list, scripted runs (results streamed as saves finish, bytes, reset pause,
--quiet), replay source, and the interactive keys, status line and log lines on a real pty."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from datetime import datetime
from pathlib import Path

import pytest

from eva.capture.save_worker import SaveJob
from eva.cli.collect_screen import CaptureLogHandler, LogLimiter, collect_job_line, fit_width
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset

pytestmark = pytest.mark.realtime

EVA = [sys.executable, "-m", "eva.cli"]

CONFIG = """
[collection]
log_dir = "logs"
fps = 10
min_episode_frames = 3

[collection.tasks]
demo = ["wave", "point"]

[[collection.cameras]]
key = "observation.images.front"
width = 64
height = 48

[[collection.vectors]]
name = "observation.state"
dim = 14
discrete = [6, 13]

[collection.encoder]
preset = "ultrafast"
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "rig.toml"
    path.write_text(CONFIG)
    return path


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVA, *args], capture_output=True, text=True, timeout=timeout)


def test_scripted_sim_then_replay_appends(config: Path, tmp_path: Path) -> None:
    done = run("collect", str(config), "--episodes", "2", "--seconds", "0.8", "--task", "point")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("saved episode") == 2
    raw = tmp_path / "logs" / "demo" / "raw"
    reader = DatasetReader(raw)
    assert [e["episode_index"] for e in reader.episodes] == [0, 1]
    assert all(e["tasks"] == ["point"] and e["quality"] == "green" for e in reader.episodes)
    replay = run(
        # 2 s: on a loaded host the replay's first samples can take most of a second to arrive,
        # and an episode with no rows is saved without an episode index
        "collect", str(config), "--episodes", "1", "--seconds", "2",
        "--source", f"replay:{raw}", "--json",
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    job = json.loads(replay.stdout.splitlines()[0])
    assert job["state"] == "saved" and job["episode_index"] == 2 and job["frames"] > 0
    assert validate_dataset(raw) == []


def test_a_dataset_another_writer_holds_is_refused_before_anything_starts(
    config: Path, tmp_path: Path
) -> None:
    from eva.dataset import layout
    from eva.dataset.locks import release_flock, try_flock

    work = tmp_path / "logs" / "demo" / "raw" / layout.WORK_DIR
    work.mkdir(parents=True)
    fd = try_flock(work / layout.WRITER_LOCK)  # held as a recording eva collect holds it
    assert fd is not None
    try:
        for extra in (["--episodes", "1", "--seconds", "1"], ["--check"]):
            refused = run("collect", str(config), *extra)
            assert refused.returncode == 1, refused.stderr
            assert refused.stderr.splitlines() == [
                f"eva: error: {work.parent}: another writer has this dataset open (eva collect "
                "or eva console is recording into it); stop it, or collect into another "
                "dataset (--dataset)"
            ]
            assert refused.stdout == ""
    finally:
        release_flock(fd)


def test_usage_errors_are_one_line(config: Path, tmp_path: Path) -> None:
    bad = run("collect", str(config), "--episodes", "1", "--source", "nope")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "nope" in bad.stderr
    missing = run("collect", str(tmp_path / "none.toml"), "--episodes", "1")
    assert missing.returncode == 2 and "not found" in missing.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[collection]\nfps = 0\ntasks = {a = ['t']}\n")
    result = run("collect", str(broken), "--episodes", "1")
    assert result.returncode == 2 and "collection.fps" in result.stderr
    unknown = run("collect", str(config), "--episodes", "1", "--dataset", "other")
    assert unknown.returncode == 2 and "other" in unknown.stderr
    no_tty = subprocess.run(
        [*EVA, "collect", str(config)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert no_tty.returncode == 2 and "terminal" in no_tty.stderr


def set_size(fd: int, columns: int, rows: int = 24) -> None:
    """The pty's window size (on the master: a resize, the child gets SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _own_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`eva collect` on a real pseudo-terminal."""

    def __init__(self, config: Path, columns: int | None = None) -> None:
        self.master, slave = pty.openpty()
        if columns is not None:
            set_size(slave, columns)
        self.proc = subprocess.Popen(
            [*EVA, "collect", str(config)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=_own_terminal,  # so Ctrl-C on the pty reaches eva as SIGINT
        )
        os.close(slave)
        self.output = b""

    def read_until(self, text: bytes, timeout: float = 60, start: int = 0) -> None:
        """Read until ``text`` appears in the output after byte ``start``."""
        deadline = time.monotonic() + timeout
        while text not in self.output[start:]:
            assert time.monotonic() < deadline, (text, self.output.decode(errors="replace")[-800:])
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    break

    def drain(self, seconds: float) -> None:
        """Read whatever comes for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                self.output += os.read(self.master, 65536)

    def send(self, key: bytes) -> None:
        os.write(self.master, key)

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            chunk = b""
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the child closed its end
                    chunk = b""
            self.output += chunk
            if chunk:
                continue
            if self.proc.poll() is not None:
                break
            assert time.monotonic() < deadline
        self.proc.wait()
        os.close(self.master)
        return self.proc.returncode


def test_interactive_keys_and_ctrl_c(config: Path, tmp_path: Path) -> None:
    term = Terminal(config)
    term.read_until(b"keys: s START")
    term.read_until(b"idle")
    term.send(b"s")
    term.read_until(b"REC")
    time.sleep(1.0)
    term.send(b"e")
    term.read_until(b"saved episode 0")
    term.send(b"s")
    term.read_until(b"REC")
    time.sleep(0.5)
    term.send(b"c")
    term.read_until(b"episode cancelled")
    term.send(b"s")
    term.read_until(b"REC")
    time.sleep(0.3)
    term.send(b"\x03")  # Ctrl-C during an episode: cancelled, then exit
    assert term.finish() == 130
    assert b"interrupted: episode cancelled" in term.output
    assert b"fps front:" in term.output and b"dropped 0" in term.output
    raw = tmp_path / "logs" / "demo" / "raw"
    assert [e["episode_index"] for e in DatasetReader(raw).episodes] == [0]
    assert not [p for p in (raw / ".eva-work").iterdir() if p.is_dir()]
    assert validate_dataset(raw) == []


def test_interactive_quit(config: Path, tmp_path: Path) -> None:
    term = Terminal(config)
    term.read_until(b"keys: s START")
    term.read_until(b"idle")
    term.send(b"t")  # next task prompt of the dataset: "point"
    term.read_until(b"task: point")
    mark = len(term.output)
    term.send(b"d")  # a single dataset: stays "demo", the task goes back to its first prompt
    term.read_until(b"task: wave", start=mark)
    mark = len(term.output)
    term.send(b"t")
    term.read_until(b"task: point", start=mark)
    term.send(b"s")
    term.read_until(b"REC")
    term.send(b"q")
    term.read_until(b"before quitting")
    time.sleep(0.8)  # long enough for aligned frames (a zero-frame episode saves nothing)
    term.send(b"e")
    term.read_until(b"saved episode")
    term.send(b"q")
    assert term.finish() == 0
    episodes = DatasetReader(tmp_path / "logs" / "demo" / "raw").episodes
    assert [e["tasks"] for e in episodes] == [["point"]]


# ---- --list ----------------------------------------------------------------------------------


def test_list_text_and_json(config: Path, tmp_path: Path) -> None:
    text = run("collect", str(config), "--list")
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "recording the SIMULATOR" in out
    assert re.search(r"observation\.images\.front\s+64x48\s+source sim \(", out), out
    assert re.search(r"observation\.state\s+dim 14\s+discrete 6,13\s+source sim \(", out), out
    assert f"demo -> {tmp_path / 'logs' / 'demo' / 'raw'}" in out
    assert "task 1: wave" in out and "task 2: point" in out
    assert not (tmp_path / "logs").exists()  # no recorder: nothing created

    as_json = run("collect", str(config), "--list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    [line] = as_json.stdout.splitlines()
    listing = json.loads(line)
    assert listing["recording"] == "sim" and listing["fps"] == 10
    assert listing["cameras"] == [
        {
            "key": "observation.images.front",
            "width": 64,
            "height": 48,
            "source": {
                "kind": "sim",
                "description": listing["cameras"][0]["source"]["description"],
            },
        }
    ]
    [vector] = listing["vectors"]
    assert (vector["name"], vector["dim"], vector["discrete"]) == ("observation.state", 14, [6, 13])
    assert vector["source"]["kind"] == "sim"
    assert listing["datasets"] == [
        {
            "name": "demo",
            "dir": str(tmp_path / "logs" / "demo" / "raw"),
            "prompts": ["wave", "point"],
        }
    ]
    override = json.loads(run("collect", str(config), "--list", "--json", "--source", "sim").stdout)
    assert override["source_override"] == "sim" and "--source sim" in override["summary"]


def test_list_names_configured_source_kinds(tmp_path: Path) -> None:
    path = tmp_path / "rig.toml"
    path.write_text(
        CONFIG.replace(
            "height = 48\n",
            'height = 48\nsource = {kind = "ffmpeg", url = "udp://127.0.0.1:5600"}\n',
        ).replace(
            "discrete = [6, 13]\n",
            'discrete = [6, 13]\nsource = {kind = "zmq", endpoint = "tcp://127.0.0.1:5601"}\n',
        )
    )
    listing = run("collect", str(path), "--list", "--json")
    assert listing.returncode == 0, listing.stderr
    obj = json.loads(listing.stdout)
    assert obj["recording"] == "configured"
    assert obj["cameras"][0]["source"]["kind"] == "ffmpeg"
    assert "udp://127.0.0.1:5600" in obj["cameras"][0]["source"]["description"]
    assert obj["vectors"][0]["source"]["kind"] == "zmq"
    text = run("collect", str(path), "--list").stdout
    assert "ffmpeg udp://127.0.0.1:5600" in text and "zmq tcp://127.0.0.1:5601" in text


# ---- scripted --------------------------------------------------------------------------------


def _episode_files_bytes(raw: Path, ep: int) -> int:
    reader = DatasetReader(raw)
    paths = [reader.data_path(ep), *(reader.video_path(ep, k) for k in reader.video_keys)]
    return sum(p.stat().st_size for p in paths)


def test_scripted_results_stream_as_saves_finish(config: Path, tmp_path: Path) -> None:
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [*EVA, "collect", str(config), "--episodes", "2", "--seconds", "1.5",
             "--reset-seconds", "0.8", "--json"],
            stdout=subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
        assert proc.stdout is not None
        lines: list[tuple[float, bool, bytes]] = []  # (arrival, process still running, line)
        buffer = b""
        deadline = time.monotonic() + 60
        while len(lines) < 2:
            assert time.monotonic() < deadline, lines
            ready, _, _ = select.select([proc.stdout], [], [], 0.05)
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                lines.append((time.monotonic(), proc.poll() is None, line))
        assert proc.wait(60) == 0, stderr_path.read_text()
    (t0, running0, first), (t1, _, second) = lines
    # Episode 0's result comes during the reset pause / episode 1 (1.5 s + 0.8 s), not at exit.
    assert running0 and t1 - t0 > 1.0, (t1 - t0, lines)
    raw = tmp_path / "logs" / "demo" / "raw"
    jobs = [json.loads(first), json.loads(second)]
    assert [j["episode_index"] for j in jobs] == [0, 1]
    for job in jobs:
        assert job["state"] == "saved" and job["quality"] == "green" and job["frames"] > 0
        assert job["bytes"] == _episode_files_bytes(raw, job["episode_index"]) > 0
    log = stderr_path.read_text()
    assert "recording the SIMULATOR" in log and "camera observation.images.front 64x48: sim" in log
    # one base: the lines name each episode by the index its saved line gives
    assert "episode 0: recording 1.5 s (1 of 2)" in log and "episode 2/2" not in log
    assert "reset: 0.8 s to reset the scene before episode 1" in log
    assert "episode 1: recording 1.5 s (2 of 2)" in log
    episodes = DatasetReader(raw).episodes
    gap = datetime.fromisoformat(episodes[1]["started_at"]) - datetime.fromisoformat(
        episodes[0]["ended_at"]
    )
    assert gap.total_seconds() >= 0.75, gap
    assert validate_dataset(raw) == []


def test_scripted_quiet_prints_only_results(config: Path, tmp_path: Path) -> None:
    config.write_text(CONFIG.replace("min_episode_frames = 3", "min_episode_frames = 1000"))
    done = run("collect", str(config), "--episodes", "2", "--seconds", "0.5", "--quiet")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    raw = tmp_path / "logs" / "demo" / "raw"
    lines = done.stdout.splitlines()
    assert len(lines) == 2, lines
    for ep, line in enumerate(lines):
        size = _episode_files_bytes(raw, ep)
        expected = rf"saved episode {ep}: \d+ frames, red \(episode_too_short\), [\d.]+ (B|KB) -> "
        assert re.match(expected, line), line
        assert line.endswith(f" -> {raw}")
        assert (f"{size} B" if size < 1000 else f"{size / 1000:.1f} KB") in line
    usage = run("collect", str(config), "--quiet")
    assert usage.returncode == 2 and "--episodes" in usage.stderr


def test_job_line_names_the_first_issue_and_counts_the_others(tmp_path: Path) -> None:
    job = SaveJob(tmp_path, "wave", state="saved", episode_index=4, frames=7, quality="red")
    job.quality_issues = [
        {"code": "episode_too_short", "detail": "7 frames"},
        {"code": "frozen_camera", "detail": "front"},
        {"code": "image_skew_exceeded", "detail": "front"},
    ]
    line = collect_job_line(job, 2_500_000)
    assert (
        line == f"saved episode 4: 7 frames, red (episode_too_short +2 more), 2.5 MB -> {tmp_path}"
    )
    job.quality_issues = job.quality_issues[1:2]
    assert "red (frozen_camera), " in collect_job_line(job, 10)


# ---- interactive screen ----------------------------------------------------------------------

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def status_writes(output: bytes) -> list[str]:
    """Every status line written: the pieces between \\r / \\n that start like one."""
    text = ANSI.sub(b"", output).decode(errors="replace")
    return [p for p in re.split(r"[\r\n]", text) if p.startswith(("REC ", "idle "))]


def render(output: bytes) -> list[str]:
    """The lines as a terminal leaves them (\\r, \\n, erase-to-end-of-line; no wrapping)."""
    lines: list[list[str]] = [[]]
    col = 0
    for token in re.split(r"(\x1b\[[0-9;?]*[A-Za-z]|\r|\n)", output.decode(errors="replace")):
        line = lines[-1]
        if token == "\r":
            col = 0
        elif token == "\n":
            lines.append([])
            col = 0
        elif token.startswith("\x1b["):
            if token.endswith("K"):
                del line[col:]
        else:
            for ch in token:
                if col < len(line):
                    line[col] = ch
                else:
                    line.append(ch)
                col += 1
    return ["".join(line) for line in lines]


@pytest.mark.parametrize("columns", [80, 200])
def test_interactive_status_line_fits_the_terminal(
    config: Path, tmp_path: Path, columns: int
) -> None:
    raw = tmp_path / "logs" / "demo" / "raw"
    if columns == 80:  # leftovers of a crash: START logs two warnings, which go above the status
        for name in ("episode-a", "episode-b"):
            (raw / ".eva-work" / name).mkdir(parents=True)
    term = Terminal(config, columns)
    term.read_until(b"keys: s START")
    term.read_until(b"idle ep 0 ")
    term.send(b"s")
    term.read_until(b"REC ep 0 ")
    time.sleep(1.0)
    term.send(b"e")
    term.read_until(b"saved episode 0")
    term.read_until(b"idle ep 1 ")
    resized = None
    if columns == 200:
        set_size(term.master, 50)  # the redraws after the next one fit the new width
        term.drain(0.6)
        resized = len(term.output)
        term.drain(0.6)
    term.send(b"q")
    assert term.finish() == 0
    before = status_writes(term.output[:resized])
    assert before and all(len(line) <= columns - 1 for line in before), max(before, key=len)
    assert all(" | fps front:" in line for line in before)
    widest = max(len(line) for line in before)
    if columns == 80:
        assert widest == columns - 1  # the full line is longer: it was cut
    else:
        assert any(line.endswith(" failed") for line in before)  # uncut, up to the save counts
    if resized is not None:
        after = status_writes(term.output[resized:])
        assert after and all(len(line) <= 49 for line in after), max(after, key=len)
    assert any(line.startswith("REC ep 0 | ") for line in before)
    screen = render(term.output)
    assert "" not in [line.strip() for line in screen[:-1]], screen  # no blank lines
    assert "recording the SIMULATOR" in term.output.decode()
    assert any(line.startswith("saved episode 0: ") for line in screen)
    if columns == 80:
        warnings = [line for line in screen if "removed leftovers" in line]
        assert len(warnings) == 2, screen
        assert all(line.startswith("eva: warning: ") for line in warnings), warnings
        assert [e["episode_index"] for e in DatasetReader(raw).episodes] == [0]


def test_backlog_messages_are_rate_limited_per_stream() -> None:
    now = [100.0]
    limiter = LogLimiter(interval=5.0, clock=lambda: now[0])
    handler = CaptureLogHandler(limiter, logging.INFO)
    handler.held = True
    log = logging.getLogger("eva.capture.test-rate-limit")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    backlog = "capture backlog: stream %s has %d samples waiting (%.1f MB), %.2f s behind%s"
    try:
        for i in range(10):  # one shown, nine counted
            log.warning(backlog, "observation.images.front", 5 + i, 4.6, 0.5 + i, "")
            now[0] += 0.1
        log.warning(backlog, "observation.state", 40, 0.1, 0.5, "\n(alignment waits for x)")
        log.info("capture backlog: stream %s caught up", "observation.images.front")
        log.error("capture: saving episode failed: %s", "disk full")
        log.error("capture: saving episode failed: %s", "disk full")  # not a backlog message
        now[0] += 5.0
        log.warning(backlog, "observation.images.front", 50, 46.1, 2.0, "")
        log.warning(backlog, "observation.images.front", 51, 47.0, 2.1, "")
        lines = handler.pending()
        leftovers = limiter.leftovers()
    finally:
        log.removeHandler(handler)
    assert all("\n" not in line for line in lines)
    assert lines == [
        "eva: warning: capture backlog: stream observation.images.front has 5 samples waiting "
        "(4.6 MB), 0.50 s behind",
        "eva: warning: capture backlog: stream observation.state has 40 samples waiting (0.1 MB), "
        "0.50 s behind (alignment waits for x)",
        "eva: info: capture backlog: stream observation.images.front caught up",
        "eva: error: capture: saving episode failed: disk full",
        "eva: error: capture: saving episode failed: disk full",
        "eva: warning: capture backlog: stream observation.images.front has 50 samples waiting "
        "(46.1 MB), 2.00 s behind (9 similar suppressed)",
    ]
    assert leftovers == [
        "eva: warning: capture backlog: stream observation.images.front: 1 more message(s) "
        "suppressed"
    ]


def test_fit_never_fills_the_last_column() -> None:
    assert fit_width("x" * 100, 80) == "x" * 79
    assert fit_width("short", 80) == "short"
    assert fit_width("相机" * 10, 9) == "相机相机"  # wide characters take two columns


def test_check_prints_one_line_per_dead_stream_naming_its_own_topic(tmp_path: Path) -> None:
    (tmp_path / "dying_plugin.py").write_text(
        "class Dies:\n"
        "    def samples(self):\n"
        "        raise RuntimeError('device /dev/video9 not found')\n"
    )
    silent = 'kind = "zmq", endpoint = "tcp://127.0.0.1:1", open_timeout_s = 0.5'
    path = tmp_path / "rig.toml"
    path.write_text(
        CONFIG.replace("discrete = [6, 13]\n", f'source = {{{silent}, topic = "state"}}\n')
        + '[[collection.vectors]]\nname = "action"\ndim = 4\n'
        + f'source = {{{silent}, topic = "act"}}\n'  # the same process as "state"
        + '[[collection.vectors]]\nname = "gripper"\ndim = 1\n'
        + 'source = {kind = "python", object = "dying_plugin:Dies", open_timeout_s = 5}\n'
    )
    gone = subprocess.Popen(["true"])
    gone.wait()  # a recorder that is gone left its ring file behind
    stale = Path("/dev/shm") / f"eva-{gone.pid}-0badc0de-00.ring"
    stale.touch()
    try:
        refused = subprocess.run(
            [*EVA, "collect", str(path), "--check"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
        )
    finally:
        stale.unlink(missing_ok=True)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.splitlines()
    assert sorted(line for line in lines if line.startswith("eva: ")) == [
        "eva: error: stream action: zmq tcp://127.0.0.1:1 topic 'act': no sample within 0.5 s",
        "eva: error: stream gripper: python dying_plugin:Dies: RuntimeError: device "
        "/dev/video9 not found",
        "eva: error: stream observation.state: zmq tcp://127.0.0.1:1 topic 'state': no sample "
        "within 0.5 s",
    ], lines
    assert "ring" not in refused.stderr


def test_configured_sources_check_and_record(tmp_path: Path) -> None:
    path = tmp_path / "rig.toml"
    path.write_text(CONFIG.replace("height = 48\n", 'height = 48\nsource = {kind = "sim"}\n'))
    done = run("collect", str(path), "--episodes", "1", "--seconds", "1", "--json")
    assert done.returncode == 0, done.stderr
    # (a rig that starts may first report ring files that a killed recorder left behind)
    first = next(
        line for line in done.stderr.splitlines() if not line.startswith("removed the ring")
    )
    assert first.startswith("recording the SIMULATOR for every stream (configured: 2 sim)"), first
    assert "camera observation.images.front 64x48: sim (" in done.stderr
    job = json.loads(done.stdout)
    assert job["state"] == "saved" and job["frames"] > 0 and job["bytes"] > 0
    check = run("collect", str(path), "--check")
    assert check.returncode == 0 and check.stdout.startswith("check: ok"), check.stderr
    silent = tmp_path / "silent.toml"  # a ZeroMQ endpoint nobody publishes on
    silent.write_text(
        CONFIG.replace(
            "discrete = [6, 13]\n",
            'discrete = [6, 13]\nsource = {kind = "zmq", endpoint = "tcp://127.0.0.1:1", '
            "open_timeout_s = 0.5}\n",
        )
    )
    refused = run("collect", str(silent), "--check")
    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("eva: error:")]
    assert len(errors) == 1 and "observation.state" in errors[0] and "zmq" in errors[0], errors
    assert "1 sim, 1 zmq" in refused.stderr
