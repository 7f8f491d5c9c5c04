"""Every example in the CLI's help runs as written against a dataset laid out as `make demo`'s
(demo-data/collect.toml, demo-data/logs/pick_cube/raw and its exports), in the commands' workflow
order, each exiting 0. The config also names a loopback SFTP server (sftp_server.py) so that the
upload example has somewhere to go."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from sftp_server import SshdServer

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import COMMANDS, main
from eva.export.pipeline import export_dataset

pytest_plugins = ["sftp_server"]
pytestmark = pytest.mark.slow

CAMERAS = ["observation.images.front", "observation.images.wrist", "observation.images.side"]
FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap")


def _examples(command: click.Command) -> list[str]:
    """The ``eva ...`` lines of a command's Example(s) block, without trailing ``# comments``."""
    help_text = command.help or ""
    block = help_text.split("Example", 1)[1] if "Example" in help_text else ""
    lines = [line.strip() for line in block.splitlines()[1:]]
    return [re.sub(r"\s+#.*$", "", line) for line in lines if line.startswith("eva ")]


def _all_examples() -> list[tuple[str, str]]:
    ctx = click.Context(main)
    found = [("eva", line) for line in _examples(main)]
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None
        found += [(name, line) for line in _examples(command)]
    return found


@pytest.fixture
def demo(tmp_path: Path, sshd_server: SshdServer) -> Path:
    """The layout scripts/demo.sh makes, built quickly: the same config (plus an SFTP server),
    a 3-episode 3-camera dataset with episode 1 judged "fail", exported in every format, and a
    second 2-episode session of the same rig."""
    remote = tmp_path / "remote"
    remote.mkdir()
    known_hosts = sshd_server.write_known_hosts(tmp_path / "known_hosts")
    demo = tmp_path / "demo-data"
    demo.mkdir()
    (demo / "collect.toml").write_text(
        "[collection]\n"
        f'log_dir = "{demo / "logs"}"\n'
        "fps = 30\nmin_episode_frames = 10\n\n"
        "[collection.tasks]\n"
        'pick_cube = ["pick up the red cube and place it in the bin"]\n\n'
        + "".join(
            f'[[collection.cameras]]\nkey = "{key}"\nwidth = 160\nheight = 120\n\n'
            for key in CAMERAS
        )
        + "[collection.storage.sftp]\n"
        'host = "127.0.0.1"\n'
        f"port = {sshd_server.port}\n"
        f'user = "{sshd_server.user}"\n'
        f'identity_file = "{sshd_server.client_key}"\n'
        f'remote_dir = "{remote}"\n'
        f'known_hosts = "{known_hosts}"\n'
    )
    raw = write_synthetic_dataset(
        demo / "logs" / "pick_cube" / "raw",
        episodes=3,
        frames=[30, 32, 31],
        cameras=CAMERAS,
        width=160,
        height=120,
        action_dim=14,
        qc_verdicts=[None, "fail", "pass"],
        tasks=["pick up the red cube and place it in the bin"],
    )
    for fmt in FORMATS:
        export_dataset(raw, fmt)
    write_synthetic_dataset(  # a second session of the same rig, for eva merge
        demo / "logs" / "pick_cube_2" / "raw",
        episodes=2,
        frames=[30, 33],
        cameras=CAMERAS,
        width=160,
        height=120,
        action_dim=14,
        tasks=["pick up the red cube and place it in the bin"],
        seed=2,
    )
    return tmp_path


def test_every_command_has_examples() -> None:
    names = {name for name, _ in _all_examples()}
    assert names >= set(COMMANDS) | {"eva"}, set(COMMANDS) - names


def test_every_help_example_runs_as_written(demo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    for name, line in _all_examples():
        argv = [sys.executable, "-m", "eva.cli", *shlex.split(line)[1:]]
        if name == "console":  # serves until Ctrl-C: up, then interrupted
            process = subprocess.Popen(
                argv + ["--port", "0"],
                cwd=demo,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert process.stdout is not None
            seen = ""
            while "http://127.0.0.1:" not in seen:
                chunk = process.stdout.readline()
                assert chunk, f"{line}: exited before serving: {seen}"
                seen += chunk
            process.send_signal(signal.SIGINT)
            out, _ = process.communicate(timeout=60)
            assert process.returncode in (0, 130), f"{line}: {seen}{out}"
            continue
        result = subprocess.run(argv, cwd=demo, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{line}: exit {result.returncode}: {result.stderr[-2000:]}"
