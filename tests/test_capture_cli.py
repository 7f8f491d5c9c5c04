"""`eva collect`: scripted runs, replay source, and the interactive keys driven through a real pty."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset

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
        "collect", str(config), "--episodes", "1", "--seconds", "0.8",
        "--source", f"replay:{raw}", "--json",
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    job = json.loads(replay.stdout.splitlines()[0])
    assert job["state"] == "saved" and job["episode_index"] == 2 and job["frames"] > 0
    assert validate_dataset(raw) == []


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


def _own_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`eva collect` on a real pseudo-terminal."""

    def __init__(self, config: Path) -> None:
        self.master, slave = pty.openpty()
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
