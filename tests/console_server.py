"""A real ``eva console`` process on 127.0.0.1 for the console's API and browser tests.

``ConsoleServer(config).start()`` runs ``python -m eva.cli console CONFIG --port 0`` (the
simulated rig, real time), reads the URL it prints, and ``stop()`` sends SIGTERM (then SIGKILL).
``write_console_config`` writes a small rig: 2 cameras 160x120 at 30 fps, 6-dim state and action,
two datasets (one with two prompts), optionally an SFTP backend. The environment is inherited, so
``EVA_PUREPYTHON=1`` reaches the server.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx

CAMERAS = ("observation.images.front", "observation.images.wrist")
DATASETS = {"pick": ["pick up the cube", "pick up the ball"], "fold": ["fold the towel"]}


def write_console_config(
    path: Path,
    log_dir: Path,
    *,
    sftp: dict[str, Any] | None = None,
    width: int = 160,
    height: int = 120,
    source: str | None = None,
) -> Path:
    """``source``: a TOML inline table every stream gets (e.g. ``{ kind = "sim" }``)."""
    extra = [f"source = {source}"] if source else []
    lines = [
        "[collection]",
        f'log_dir = "{log_dir}"',
        "fps = 30",
        "min_episode_frames = 10",
        "[collection.tasks]",
        *(f"{name} = {prompts!r}".replace("'", '"') for name, prompts in DATASETS.items()),
    ]
    for key in CAMERAS:
        lines += [
            "[[collection.cameras]]",
            f'key = "{key}"',
            f"width = {width}",
            f"height = {height}",
            *extra,
        ]
    for name in ("observation.state", "action"):
        lines += [
            "[[collection.vectors]]",
            f'name = "{name}"',
            "dim = 6",
            "discrete = [5]",
            *extra,
        ]
    lines += ["[collection.encoder]", 'preset = "ultrafast"']
    if sftp is not None:
        lines.append("[collection.storage.sftp]")
        for key, value in sftp.items():
            lines.append(f"{key} = {value}" if isinstance(value, int) else f'{key} = "{value}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def sftp_table(server: Any, remote_dir: Path, known_hosts: Path) -> dict[str, Any]:
    """The ``[collection.storage.sftp]`` keys for the test sshd (tests/sftp_server.py)."""
    return {
        "host": "127.0.0.1",
        "port": server.port,
        "user": server.user,
        "identity_file": str(server.client_key),
        "remote_dir": str(remote_dir),
        "known_hosts": str(known_hosts),
    }


@dataclass
class ConsoleServer:
    config: Path
    token_file: Path
    extra_args: tuple[str, ...] = ()
    preexec: Callable[[], None] | None = None  # run in the child before exec (e.g. rlimits)
    process: subprocess.Popen | None = None
    url: str = ""
    token: str = ""
    base: str = ""
    log_path: Path | None = None
    clients: list[httpx.Client] = field(default_factory=list)

    def start(self, timeout: float = 30.0) -> ConsoleServer:
        self.log_path = self.token_file.with_name(self.token_file.name + ".log")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "eva.cli", "console", str(self.config), "--port", "0",
             "--token-file", str(self.token_file), *self.extra_args],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            preexec_fn=self.preexec,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        log.close()
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            ready, _, _ = select.select([self.process.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
        if not line.startswith(b"http://"):
            self.stop()
            raise RuntimeError(
                f"eva console did not start: {line!r}\n{self.log_path.read_text(errors='replace')}"
            )
        self.url = line.decode().strip().splitlines()[0]
        parsed = urlparse(self.url)
        self.token = parse_qs(parsed.query)["token"][0]
        self.base = f"{parsed.scheme}://{parsed.netloc}"
        return self

    def client(self, *, auth: bool = True, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        client = httpx.Client(base_url=self.base, headers=headers, timeout=30.0, **kwargs)
        self.clients.append(client)
        return client

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's stderr log, for an assertion message."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def __enter__(self) -> ConsoleServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll ``predicate()`` until it returns something truthy; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        time.sleep(interval)


def record_episode(
    client: httpx.Client, dataset: str, seconds: float, task: str | None = None
) -> dict[str, Any]:
    """START, wait, STOP through the API; returns the finished save job."""
    body: dict[str, Any] = {"dataset": dataset}
    if task is not None:
        body["task"] = task
    response = client.post("/api/collect/start", json=body)
    assert response.status_code == 200, response.text
    time.sleep(seconds)
    response = client.post("/api/collect/stop")
    assert response.status_code == 200, response.text
    job_id = response.json()["job_id"]

    def finished() -> dict[str, Any] | None:
        for job in client.get("/api/status").json()["save_jobs"]:
            if job["job_id"] == job_id and job["state"] in ("saved", "failed"):
                return job
        return None

    return wait_for(finished)


def wait_job(client: httpx.Client, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job = client.get(f"/api/jobs/{job_id}").json()
        return job if job["state"] in ("completed", "failed") else None

    return wait_for(done, timeout)
