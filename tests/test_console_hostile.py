"""The console under hostile clients: nothing a client does costs a recording, and no file outside
a dataset is ever served.

Real sockets on 127.0.0.1 throughout: a uvicorn server in this process with the console's
connection guard and small limits (what each limit does, exactly), and a real ``eva console``
with a simulated rig, held to 1024 descriptors, that records an episode through a flood of
half-open connections and oversized bodies (docs/console.md, docs/safety.md).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from console_server import CAMERAS, ConsoleServer, record_episode, wait_for, write_console_config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eva.console.errors import ConsoleError
from eva.console.fileserve import byte_range
from eva.console.transport import (
    ConnectionCounts,
    ConnectionLimits,
    guarded_protocol,
    missing_uvicorn_internals,
    read_body,
    trust_connection,
)
from eva.dataset import fsafe
from eva.dataset.errors import DatasetError

# ---- the guard in this process: each limit on its own -----------------------------------------

SMALL = ConnectionLimits(
    max_connections=8, max_untrusted=3, header_timeout_s=0.5, max_header_bytes=4096
)


class GuardedServer:
    """A uvicorn server with the guard on a thread; ``/trust`` marks its connection trusted,
    ``/echo`` reads a body through ``read_body`` (limit 1000 bytes, 1 s)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        async def trust(request: Request) -> Response:
            trust_connection(request.scope)
            return JSONResponse({"ok": True})

        async def echo(request: Request) -> Response:
            try:
                body = await read_body(request, 1000, timeout_s=1.0)
            except ConsoleError as e:
                status = {"too_large": 413, "timeout": 408}[e.kind]
                return JSONResponse({"code": e.code}, status, headers={"connection": "close"})
            return JSONResponse({"size": len(body)})

        app = Starlette(routes=[Route("/trust", trust), Route("/echo", echo, methods=["POST"])])
        self.counts = ConnectionCounts()
        protocol = guarded_protocol(limits, self.counts)
        config = uvicorn.Config(app, http=protocol, log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> GuardedServer:
        self.thread.start()
        wait_for(lambda: self.server.started, 10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        return sock


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the server has closed ``sock`` (EOF or reset), False if it is still open."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def answer(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.fixture
def guarded() -> Iterator[GuardedServer]:
    with GuardedServer(SMALL) as server:
        yield server


@pytest.mark.kernel_independent
def test_incomplete_headers_time_out(guarded: GuardedServer) -> None:
    silent = guarded.connect()
    partial = guarded.connect()
    partial.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert closed_by_peer(silent) and closed_by_peer(partial)
    assert guarded.counts.timed_out == 2
    # a keep-alive connection's next request is held to the same deadline
    kept = guarded.connect()
    kept.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept.recv(65536).startswith(b"HTTP/1.1 200")
    kept.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n")
    assert closed_by_peer(kept)
    wait_for(lambda: guarded.counts.open == 0, 5)


@pytest.mark.kernel_independent
def test_untrusted_and_total_connections_are_capped(guarded: GuardedServer) -> None:
    trusted = []
    for _ in range(5):
        sock = guarded.connect()
        sock.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        trusted.append(sock)
    waiting = [guarded.connect() for _ in range(3)]
    wait_for(lambda: guarded.counts.untrusted == 3, 5)
    extra = guarded.connect()  # a 4th without a token: closed at once, nothing read
    extra.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed_by_peer(extra, 2) and guarded.counts.refused >= 1
    # the trusted ones are still served meanwhile
    trusted[0].sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n\r\n")
    assert trusted[0].recv(65536).startswith(b"HTTP/1.1 200")
    for sock in waiting:
        sock.close()
    wait_for(lambda: guarded.counts.untrusted == 0, 5)
    # 5 trusted + 3 untrusted = the total cap of 8: the 9th is refused even though it would be
    # the only untrusted one
    more = [guarded.connect() for _ in range(3)]
    wait_for(lambda: guarded.counts.open == 8, 5)
    ninth = guarded.connect()
    assert closed_by_peer(ninth, 2)
    for sock in trusted + more:
        sock.close()
    wait_for(lambda: guarded.counts.open == 0, 5)
    again = guarded.connect()  # the flood over: served again
    again.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer(again).startswith(b"HTTP/1.1 200")


@pytest.mark.kernel_independent
def test_endless_headers_are_cut_off(guarded: GuardedServer) -> None:
    sock = guarded.connect()
    sock.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\nX-Big: ")
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        for _ in range(64):
            sock.sendall(b"a" * 1024)
    assert b"431" in answer(sock).split(b"\r\n")[0]


@pytest.mark.kernel_independent
@pytest.mark.parametrize("how", ["declared", "chunked", "lying_length", "slow"])
def test_body_limit_is_enforced_while_reading(guarded: GuardedServer, how: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", guarded.port, timeout=5)
    if how == "declared":  # refused on the header alone
        conn.putrequest("POST", "/echo")
        conn.putheader("Content-Length", str(300 * 1024 * 1024))
        conn.endheaders()
        status = conn.getresponse().status
        assert status == 413
    elif how == "chunked":  # no length given: counted as it streams
        sent = 0

        def chunks() -> Iterator[bytes]:
            nonlocal sent
            while sent < 10 * 1024 * 1024:
                sent += 256
                yield b"x" * 256

        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            conn.request("POST", "/echo", body=chunks(), encode_chunked=True)
        with contextlib.suppress(ConnectionResetError):
            assert conn.getresponse().status == 413
        assert sent < 10 * 1024 * 1024  # the server stopped reading long before
    elif how == "lying_length":  # more bytes than declared: the excess is no body but a
        # malformed next request (400), and the connection is closed
        conn.putrequest("POST", "/echo")
        conn.putheader("Content-Length", "10")
        conn.endheaders()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            conn.send(b"y" * 100_000)
        with contextlib.suppress(ConnectionResetError):
            response = conn.getresponse()
            assert response.status in (200, 400)
            if response.status == 200:
                assert response.read() == b'{"size":10}'
        wait_for(lambda: guarded.counts.open == 0, 5)
    else:  # fewer bytes than declared: the body times out
        conn.putrequest("POST", "/echo")
        conn.putheader("Content-Length", "500")
        conn.endheaders()
        conn.send(b"z" * 10)
        assert conn.getresponse().status == 408
    conn.close()


# ---- canary: the uvicorn internals the guard hooks ---------------------------------------------

_ADAPT = (
    "the console's connection guard (eva/console/transport.py) hooks uvicorn internals; adapt "
    "it to this uvicorn, then move the uvicorn bound in pyproject.toml and the Makefile"
)


@pytest.mark.kernel_independent
def test_uvicorn_canary_hooked_internals_are_there() -> None:
    missing = missing_uvicorn_internals()
    assert not missing, f"{_ADAPT}: " + "; ".join(missing)


@pytest.mark.kernel_independent
def test_uvicorn_canary_names_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    monkeypatch.delattr(HttpToolsProtocol, "on_headers_complete")
    monkeypatch.setattr(HttpToolsProtocol, "data_received", lambda self, chunk: None)
    missing = missing_uvicorn_internals()
    assert len(missing) == 2, missing
    assert missing[0].startswith("HttpToolsProtocol.data_received(chunk) instead of (data)")
    assert missing[1].startswith("HttpToolsProtocol.on_headers_complete is gone")
    assert all(item.endswith(f"(uvicorn {uvicorn.__version__})") for item in missing)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@pytest.mark.kernel_independent
def test_uvicorn_canary_installed_release_is_within_the_bound() -> None:
    """The canary vouches for the release installed; pyproject.toml must not allow a newer
    one, and the Makefile installs the same bound."""
    root = Path(__file__).resolve().parent.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["console"]
    requirement = next(r for r in extra if r.startswith("uvicorn"))
    upper = re.search(r"<\s*([\d.]+)", requirement)
    assert upper is not None, f"{requirement}: uvicorn needs an upper bound ({_ADAPT})"
    installed = uvicorn.__version__
    assert _version(installed) < _version(upper.group(1)), (
        f"uvicorn {installed} installed beyond the bound {requirement!r}: {_ADAPT}"
    )
    assert f'"{requirement}"' in (root / "Makefile").read_text(), requirement


@pytest.mark.kernel_independent
def test_uvicorn_canary_every_hook_still_acts(guarded: GuardedServer) -> None:
    """Each overridden method of the installed uvicorn still does its part on a real server:
    connection_made refuses past the cap, on_message_begin arms and on_headers_complete disarms
    the header deadline and hands the trust hook to the app, data_received bounds the headers."""
    half_open = guarded.connect()
    half_open.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n")
    assert closed_by_peer(half_open), (
        f"a half-open connection outlived the header timeout: {_ADAPT}"
    )
    assert guarded.counts.timed_out == 1, (guarded.counts, _ADAPT)
    kept = guarded.connect()
    kept.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept.recv(65536).startswith(b"HTTP/1.1 200"), _ADAPT
    wait_for(lambda: guarded.counts.untrusted == 0, 5)  # the app reached the trust hook
    time.sleep(SMALL.header_timeout_s * 2)
    kept.sendall(b"GET /trust HTTP/1.1\r\nHost: x\r\n\r\n")  # no deadline left armed
    assert kept.recv(65536).startswith(b"HTTP/1.1 200"), f"a served request timed out: {_ADAPT}"
    waiting = [guarded.connect() for _ in range(SMALL.max_untrusted)]
    wait_for(lambda: guarded.counts.untrusted == SMALL.max_untrusted, 5)
    assert closed_by_peer(guarded.connect(), 2) and guarded.counts.refused == 1, _ADAPT
    for sock in [*waiting, kept]:
        sock.close()
    wait_for(lambda: guarded.counts.open == 0, 5)
    big = guarded.connect()
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        big.sendall(
            b"GET /trust HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * SMALL.max_header_bytes)
        )
    assert b"431" in answer(big).split(b"\r\n")[0], f"endless headers were not cut off: {_ADAPT}"


@pytest.mark.kernel_independent
def test_byte_ranges() -> None:
    assert byte_range(None, 100) is None
    assert byte_range("bytes=10-19", 100) == (10, 19)
    assert byte_range("bytes=90-", 100) == (90, 99)
    assert byte_range("bytes=-5", 100) == (95, 99)
    assert byte_range("bytes=-500", 100) == (0, 99)
    assert byte_range("bytes=50-5000", 100) == (50, 99)
    assert byte_range("bytes=100-", 100) is False
    assert byte_range("bytes=20-10", 100) is False
    assert byte_range("bytes=-0", 100) is False
    assert byte_range("bytes=0-1,5-6", 100) is None  # several ranges: the whole file
    assert byte_range("items=0-1", 100) is None


@pytest.mark.kernel_independent
@pytest.mark.parametrize("walk", [False, True], ids=["openat2", "walk"])
def test_open_beneath_checks_every_component_every_time(
    tmp_path: Path, walk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsafe, "_openat2_missing", walk)
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "videos" / "cam").mkdir(parents=True)
    (outside / "cam").mkdir(parents=True)
    (root / "videos" / "cam" / "ep.mp4").write_bytes(b"inside")
    (outside / "cam" / "ep.mp4").write_bytes(b"outside")
    fd = fsafe.open_beneath(root, "videos/cam/ep.mp4")
    assert os.read(fd, 100) == b"inside"
    os.close(fd)
    (root / "videos" / "cam").rename(root / "videos" / "cam.aside")
    (root / "videos" / "cam").symlink_to(outside / "cam")
    with pytest.raises(DatasetError, match="symlink"):
        fsafe.open_beneath(root, "videos/cam/ep.mp4")
    (root / "videos" / "cam.aside" / "link.mp4").symlink_to(outside / "cam" / "ep.mp4")
    for rel in ("videos/cam.aside/link.mp4", "../outside/cam/ep.mp4", "/etc/passwd"):
        with pytest.raises(DatasetError):
            fsafe.open_beneath(root, rel)
    os.mkfifo(root / "fifo")
    with pytest.raises(DatasetError, match="FIFO"):
        fsafe.open_beneath(root, "fifo")  # at once: a FIFO does not block the open
    with pytest.raises(FileNotFoundError):
        fsafe.open_beneath(root, "videos/cam.aside/missing.mp4")
    (tmp_path / "root-link").symlink_to(root)
    with pytest.raises(DatasetError, match="symlink"):
        fsafe.open_beneath(tmp_path / "root-link", "videos/cam.aside/ep.mp4")


# ---- the real console: a flood during a recording -------------------------------------------

FLOOD = 2000
CONSOLE_FDS = 1024


def _limit_child_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (CONSOLE_FDS, CONSOLE_FDS))


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    """A console whose hard descriptor limit is the usual soft one (1024): its own raise to the
    hard limit gains nothing, so only its caps keep a flood from its descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FLOOD + 200
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"the flood needs {need} descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    workdir = tmp_path_factory.mktemp("hostile")
    config = write_console_config(workdir / "rig.toml", workdir / "logs")
    with ConsoleServer(config, workdir / "token", preexec=_limit_child_fds) as server:
        yield server


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Flood:
    """``FLOOD`` connections that send part of a request's headers (or nothing) and never
    finish, opened from a thread; they stay open until ``close``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for i in range(FLOOD):
            sock = socket.socket()
            sock.settimeout(2)
            self.sockets.append(sock)
            try:
                sock.connect(("127.0.0.1", self.port))
                if i % 2:
                    sock.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            except OSError:
                pass  # refused at once, or the backlog full: the flood goes on

    def close(self) -> None:
        self.thread.join(60)
        for sock in self.sockets:
            sock.close()


def _trusted_connections(console: ConsoleServer, n: int) -> list[http.client.HTTPConnection]:
    """``n`` keep-alive connections that have carried the token (opened before the flood: the
    cap on connections without a valid token does not shut them out)."""
    host, port = console.base.removeprefix("http://").split(":")
    conns = []
    for _ in range(n):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/api/status", headers={"Authorization": f"Bearer {console.token}"})
        response = conn.getresponse()
        assert response.status == 200
        response.read()
        conns.append(conn)
    return conns


def _oversized_bodies(conns: list[http.client.HTTPConnection], token: str) -> list[str]:
    """Authorised requests with bodies far over 64 KiB (300 MB declared; 300 MB chunked); what
    each got back."""
    outcomes = []
    declared, chunked = conns
    declared.putrequest("POST", "/api/datasets/pick/export")
    declared.putheader("Authorization", f"Bearer {token}")
    declared.putheader("Content-Length", str(300 * 1024 * 1024))
    declared.endheaders()
    outcomes.append(f"declared {declared.getresponse().status}")
    block = b"[" * (1 << 20)

    def blocks() -> Iterator[bytes]:
        for _ in range(300):
            yield block

    try:
        chunked.request(
            "POST", "/api/datasets/pick/export", body=blocks(),
            headers={"Authorization": f"Bearer {token}"}, encode_chunked=True,
        )  # fmt: skip
        outcomes.append(f"chunked {chunked.getresponse().status}")
    except (ConnectionResetError, BrokenPipeError):
        outcomes.append("chunked closed")  # refused and closed while the client still sent
    for conn in conns:
        conn.close()
    return outcomes


@pytest.mark.realtime
def test_flood_during_a_recording_costs_nothing(console: ConsoleServer) -> None:
    pid = console.process.pid
    api = console.client()  # the token holder: one keep-alive connection, polled below
    assert api.get("/api/status").status_code == 200
    baseline_fds = _open_fds(pid)
    rss_before = _rss_kib(pid)
    bodies = _trusted_connections(console, 2)
    response = api.post("/api/collect/start", json={"dataset": "pick"})
    assert response.status_code == 200, response.text
    flood = Flood(int(console.base.rsplit(":", 1)[1]))
    flood.thread.start()
    most_fds = 0
    polls = []
    try:
        outcomes = _oversized_bodies(bodies, console.token)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline or flood.thread.is_alive():
            most_fds = max(most_fds, _open_fds(pid))
            polls.append(api.get("/api/status").status_code)
            time.sleep(0.2)
        rss_during = _rss_kib(pid)
        stop = api.post("/api/collect/stop")  # during the flood, on the trusted connection
        assert stop.status_code == 200, stop.text
        job_id = stop.json()["job_id"]
    finally:
        flood.close()
    assert set(polls) == {200}, polls
    assert all(o.endswith(("413", "closed")) for o in outcomes), outcomes
    assert most_fds - baseline_fds <= 256 + 16, (baseline_fds, most_fds)
    assert rss_during - rss_before < 100 * 1024, (rss_before, rss_during)  # not 300 MB

    # the console answers its token holder again, on a new connection
    fresh = console.client()
    assert wait_for(lambda: _status_or_none(fresh), 30)["state"] in ("idle", "saving")

    def saved() -> dict | None:
        for job in fresh.get("/api/status").json()["save_jobs"]:
            if job["job_id"] == job_id and job["state"] in ("saved", "failed"):
                return job
        return None

    job = wait_for(saved, 60)
    assert job["state"] == "saved", (job, console.log_tail())
    assert job["frames"] >= 30, job
    raw = Path(job["dataset_dir"])
    check = subprocess.run(
        [sys.executable, "-m", "eva.cli", "validate", "--decode", "-q", str(raw)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "Too many open files" not in console.log_tail(200)


def _status_or_none(client: httpx.Client) -> dict | None:
    try:
        response = client.get("/api/status")
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


@pytest.mark.realtime
def test_a_camera_dir_swapped_for_a_link_is_refused(console: ConsoleServer, tmp_path: Path) -> None:
    api = console.client()
    job = record_episode(api, "fold", 1.0)
    assert job["state"] == "saved", job
    raw, episode = Path(job["dataset_dir"]), job["episode_index"]
    url = f"/api/datasets/fold/episodes/{episode}/video/{CAMERAS[0]}"
    name = f"episode_{episode:06d}.mp4"
    camera_dir = raw / "videos" / "chunk-000" / CAMERAS[0]
    inside = (camera_dir / name).read_bytes()
    first = api.get(url)
    assert first.status_code == 200 and first.content == inside  # served once: remembered
    assert api.get(url, headers={"Range": "bytes=0-9"}).content == inside[:10]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).write_bytes(b"OUTSIDE" * 1000)
    aside = camera_dir.with_name("aside")
    camera_dir.rename(aside)
    camera_dir.symlink_to(outside, target_is_directory=True)
    try:
        for headers in ({}, {"Range": "bytes=0-9"}):
            response = api.get(url, headers=headers)
            assert b"OUTSIDE" not in response.content, response.status_code
            assert response.status_code in (404, 409), response.text
            assert response.json()["error"]["code"] in ("unsafe_path", "missing_video")
        # the episode's parquet the same way, for the plotted series
        data_dir = raw / "data" / "chunk-000"
        shutil.copytree(data_dir, tmp_path / "data-outside")
        data_dir.rename(data_dir.with_name("data-aside"))
        data_dir.symlink_to(tmp_path / "data-outside", target_is_directory=True)
        try:
            series = api.get(f"/api/datasets/fold/episodes/{episode}/series")
            assert series.status_code == 409, series.text
            assert series.json()["error"]["code"] == "unsafe_path", series.text
        finally:
            data_dir.unlink()
            data_dir.with_name("data-aside").rename(data_dir)
    finally:
        camera_dir.unlink()
        aside.rename(camera_dir)
    assert api.get(url).content == inside
