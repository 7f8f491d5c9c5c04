"""The console's HTTP API against a real ``eva console`` process on 127.0.0.1 (simulated rig).

One server with an SFTP backend (the real sshd of tests/sftp_server.py) carries the whole flow:
record two episodes, list them, fail one, export v3, poll the job, upload. A second server
without a backend checks the upload refusal. Every refusal answers a 4xx JSON error naming the
field; the token and Origin rules are checked on the real server.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from console_server import (
    CAMERAS,
    ConsoleServer,
    record_episode,
    sftp_table,
    wait_for,
    wait_job,
    write_console_config,
)
from sftp_server import SshdServer

pytest_plugins = ["sftp_server"]

pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console")


@pytest.fixture(scope="module")
def remote_dir(workdir: Path) -> Path:
    path = workdir / "remote"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def server(sshd_server: SshdServer, workdir: Path, remote_dir: Path) -> Iterator[ConsoleServer]:
    known_hosts = sshd_server.write_known_hosts(workdir / "known_hosts")
    config = write_console_config(
        workdir / "rig.toml",
        workdir / "logs",
        sftp=sftp_table(sshd_server, remote_dir, known_hosts),
    )
    with ConsoleServer(config, workdir / "token") as console:
        yield console


@pytest.fixture(scope="module")
def api(server: ConsoleServer) -> httpx.Client:
    return server.client()


@pytest.fixture(scope="module")
def recorded(api: httpx.Client) -> list[dict]:
    """Two saved episodes of dataset "pick" (the flow's first step)."""
    jobs = [record_episode(api, "pick", 1.5), record_episode(api, "pick", 1.5, "pick up the ball")]
    assert [j["state"] for j in jobs] == ["saved", "saved"], jobs
    return jobs


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["message"] and "\n" not in error["message"]
    return error


# ---- security --------------------------------------------------------------------------------


def test_binds_loopback_and_writes_a_private_token_file(server: ConsoleServer) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    mode = stat.S_IMODE(server.token_file.stat().st_mode)
    assert mode == 0o600
    assert server.token_file.read_text().strip() == server.token


def test_every_request_needs_the_token(server: ConsoleServer) -> None:
    anonymous = server.client(auth=False)
    assert error_of(anonymous.get("/api/status"), 401)["code"] == "unauthorized"
    wrong = httpx.Client(base_url=server.base, headers={"Authorization": "Bearer nope"})
    assert wrong.get("/api/status").status_code == 401
    assert anonymous.get("/").status_code == 401
    assert anonymous.get("/static/app.js").status_code == 401
    assert anonymous.get("/?token=wrong").status_code == 401
    wrong.close()


def test_page_token_becomes_a_strict_httponly_cookie(server: ConsoleServer) -> None:
    browser = server.client(auth=False, follow_redirects=False)
    response = browser.get(f"/?token={server.token}")
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    assert server.token not in response.headers["location"]
    page = browser.get("/")  # the cookie from the redirect answer
    assert page.status_code == 200 and page.text.lower().startswith("<!doctype html")
    assert browser.get("/api/status").status_code == 200


def test_page_scripts_are_served_as_javascript(server: ConsoleServer) -> None:
    """Every module of the page comes with a JavaScript type (a browser runs a module script of
    no other type), and the page's policy allows scripts of its own origin."""
    static = Path(__file__).resolve().parents[1] / "python" / "eva" / "console" / "static"
    client = server.client()
    assert "script-src 'self'" in client.get("/").headers["content-security-policy"]
    scripts = sorted(static.rglob("*.js"))
    assert len(scripts) > 1
    for path in scripts:
        response = client.get(f"/static/{path.relative_to(static).as_posix()}")
        assert response.status_code == 200, path
        kind = response.headers["content-type"].split(";")[0]
        assert kind in {"text/javascript", "application/javascript"}, (path, kind)


def test_mutating_requests_check_origin(server: ConsoleServer) -> None:
    browser = server.client(auth=False)
    browser.get(f"/?token={server.token}", follow_redirects=False)
    assert browser.cookies.get("eva_console_token") == server.token
    # a cookie alone (a cross-site form post, say) never authorises a change
    assert error_of(browser.post("/api/collect/stop"), 403)["code"] == "bad_origin"
    evil = {"Origin": "http://evil.example:8750"}
    assert error_of(browser.post("/api/collect/stop", headers=evil), 403)["code"] == "bad_origin"
    scripted = server.client()
    assert scripted.post("/api/collect/stop", headers=evil).status_code == 403
    # the console's own origin (or a Bearer script without Origin) passes the check; the
    # request then fails on its own merits: nothing is recording
    own = {"Origin": server.base}
    assert error_of(browser.post("/api/collect/stop", headers=own), 409)["code"] == "not_recording"
    assert error_of(scripted.post("/api/collect/stop"), 409)["code"] == "not_recording"
    # reads need no Origin
    assert browser.get("/api/status").status_code == 200


# ---- collect ------------------------------------------------------------------------------------


def test_status_describes_the_rig(api: httpx.Client) -> None:
    status = api.get("/api/status").json()
    assert status["state"] in ("idle", "saving")
    assert status["source"].startswith("simulated rig")
    assert [c["key"] for c in status["cameras"]] == list(CAMERAS)
    assert {d["name"]: d["tasks"] for d in status["datasets"]} == {
        "pick": ["pick up the cube", "pick up the ball"],
        "fold": ["fold the towel"],
    }
    assert status["upload_backend"] and status["upload_backend"].startswith("sftp://")


def test_collect_refusals(api: httpx.Client, recorded: list[dict]) -> None:
    assert (
        error_of(api.post("/api/collect/start", json={"dataset": "nope"}), 404)["field"]
        == "dataset"
    )
    assert error_of(api.post("/api/collect/start", json={}), 400)["field"] == "dataset"
    bad = api.post("/api/collect/start", json={"dataset": "pick", "extra": 1})
    assert error_of(bad, 400)["field"] == "extra"
    assert error_of(api.post("/api/collect/start", content=b"{not json"), 400)["code"] == "bad_json"
    bad_task = api.post("/api/collect/start", json={"dataset": "pick", "task": "a\nb"})
    assert error_of(bad_task, 400)["field"] == "task"
    assert error_of(api.post("/api/collect/cancel"), 409)["code"] == "not_recording"
    assert api.post("/api/collect/start", json={"dataset": "fold"}).status_code == 200
    try:
        second = api.post("/api/collect/start", json={"dataset": "pick"})
        assert error_of(second, 409)["code"] == "already_recording"
        status = api.get("/api/status").json()
        assert status["state"] == "recording" and status["dataset"] == "fold"
        assert status["task"] == "fold the towel"
        wait_for(lambda: api.get("/api/status").json()["frames"] > 0)
        samples = api.get("/api/status").json()["samples"]
        assert all(samples[key] > 0 for key in (*CAMERAS, "observation.state", "action"))
    finally:
        cancel = api.post("/api/collect/cancel")
    assert cancel.status_code == 200 and cancel.json()["cancelled"]
    # CANCEL writes nothing: the fold dataset has no episode
    time.sleep(0.5)
    fold = api.get("/api/datasets/fold/episodes").json()
    assert fold["episodes"] == []


def test_saved_episodes_appear_in_status(api: httpx.Client, recorded: list[dict]) -> None:
    status = api.get("/api/status").json()
    saved = [j for j in status["save_jobs"] if j["state"] == "saved" and j["dataset"] == "pick"]
    assert len(saved) >= 2
    assert all(j["quality"] in ("green", "red") and j["frames"] > 0 for j in saved)
    assert {d["name"]: d["episodes"] for d in status["datasets"]}["pick"] == 2


def test_preview_is_a_fresh_jpeg_per_camera(api: httpx.Client) -> None:
    def first() -> httpx.Response | None:
        response = api.get(f"/api/preview/{CAMERAS[0]}")
        return response if response.status_code == 200 else None

    response = wait_for(first, 10)
    assert response.headers["content-type"] == "image/jpeg"
    assert response.content[:2] == b"\xff\xd8"
    seq = int(response.headers["x-preview-seq"])
    # nothing newer yet -> 204; later a newer one
    assert api.get(f"/api/preview/{CAMERAS[0]}", params={"after": 10**9}).status_code == 204
    newer = wait_for(
        lambda: (
            (r := api.get(f"/api/preview/{CAMERAS[0]}", params={"after": seq})).status_code == 200
            and r
        ),
        10,
    )
    assert int(newer.headers["x-preview-seq"]) > seq
    assert error_of(api.get("/api/preview/observation.images.nope"), 404)["field"] == "camera"


def test_events_stream_reports_status(server: ConsoleServer, api: httpx.Client) -> None:
    events: list[tuple[str, dict]] = []
    stop = threading.Event()
    sockets: list[socket.socket] = []  # the listener's, shut down to end its read at once

    def listen() -> None:
        with server.client() as client, client.stream("GET", "/api/events", timeout=30) as response:
            sockets.append(response.extensions["network_stream"].get_extra_info("socket"))
            assert response.headers["content-type"].startswith("text/event-stream")
            name = None
            try:
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: ") and name:
                        events.append((name, json.loads(line[6:])))
                    if stop.is_set():
                        return
            except httpx.RemoteProtocolError:  # the socket shut down below
                if not stop.is_set():
                    raise

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    wait_for(lambda: any(n == "status" for n, _ in events), 10)
    started = api.post("/api/collect/start", json={"dataset": "fold"})
    assert started.status_code == 200, started.text
    try:
        try:
            recording = any_status(events, "recording", 20)
            assert recording, (events[-3:], server.log_tail())
        finally:
            cancelled = api.post("/api/collect/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert any_status(events, "idle", 20, last=True), (events[-3:], server.log_tail())
    finally:
        # The listener returns at its next line; a quiet stream sends one only as a heartbeat
        # (10 s), so its socket is shut down: its read ends now.
        stop.set()
        for listening in sockets:
            listening.shutdown(socket.SHUT_RDWR)
        thread.join(15)
        assert not thread.is_alive()


def any_status(
    events: list[tuple[str, dict]], state: str, timeout: float, last: bool = False
) -> bool:
    """Whether a status event (the last one, with ``last``) reports ``state`` within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = [e["state"] for n, e in list(events) if n == "status"]
        if (statuses[-1:] == [state]) if last else (state in statuses):
            return True
        time.sleep(0.1)
    return False


# ---- review ----------------------------------------------------------------------------------


def test_episode_list_and_review(api: httpx.Client, recorded: list[dict]) -> None:
    listing = api.get("/api/datasets/pick/episodes").json()
    episodes = listing["episodes"]
    assert [e["episode_index"] for e in episodes] == [0, 1]
    assert episodes[1]["tasks"] == ["pick up the ball"]
    for e in episodes:
        assert e["quality"] in ("green", "red") and e["video_keys"] == list(CAMERAS)
        assert all("detail" in i and "frames" in i for i in e["quality_issues"])
    url = "/api/datasets/pick/episodes/1/qc"
    # bad verdicts, fields, indices, datasets
    assert error_of(api.put(url, json={"verdict": "maybe"}), 400)["field"] == "verdict"
    assert error_of(api.put(url, json={"verdict": 1}), 400)["field"] == "verdict"
    assert error_of(api.put(url, json={"note": 3}), 400)["field"] == "note"
    assert error_of(api.put(url, json={"note": "a\nb"}), 400)["field"] == "note"
    assert error_of(api.put(url, json={}), 400)["field"] == "verdict"
    assert error_of(api.put(url, json={"verdict": "pass", "x": 1}), 400)["field"] == "x"
    assert (
        error_of(api.put("/api/datasets/pick/episodes/7/qc", json={"verdict": "pass"}), 404)[
            "field"
        ]
        == "index"
    )
    assert (
        error_of(api.put("/api/datasets/pick/episodes/-1/qc", json={"verdict": "pass"}), 400)[
            "field"
        ]
        == "index"
    )
    assert (
        error_of(api.put("/api/datasets/zzz/episodes/0/qc", json={"verdict": "pass"}), 404)["field"]
        == "dataset"
    )
    assert error_of(api.get("/api/datasets/..%2F..%2Fetc/episodes"), 404)["code"] in (
        "not_found",
        "unknown_dataset",
    )
    # FAIL with a note, then a note-only update, then clear and set again
    failed = api.put(url, json={"verdict": "fail", "note": "dropped the ball"}).json()
    assert failed["qc_verdict"] == "fail" and failed["subset"] == "rejected" and failed["changed"]
    noted = api.put(url, json={"note": "dropped it"}).json()
    assert noted["qc_verdict"] == "fail" and noted["qc_note"] == "dropped it"
    cleared = api.put(url, json={"verdict": None}).json()
    assert cleared["qc_verdict"] is None and cleared["qc_note"] == "dropped it"
    again = api.put(url, json={"verdict": "FAIL"}).json()
    assert again["qc_verdict"] == "fail"
    listing = api.get("/api/datasets/pick/episodes").json()
    row = listing["episodes"][1]
    assert (row["qc_verdict"], row["qc_note"], row["subset"]) == ("fail", "dropped it", "rejected")
    assert 1 in listing["split"]["rejected"] and 1 not in listing["split"]["accepted"]
    # the file itself: the same rows eva qc reads
    lines = Path(listing["dir"], "meta", "episodes.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["qc_verdict"] == "fail"


def test_video_supports_range_requests(api: httpx.Client, recorded: list[dict]) -> None:
    listing = api.get("/api/datasets/pick/episodes").json()
    path = Path(listing["dir"]) / "videos" / "chunk-000" / CAMERAS[1] / "episode_000000.mp4"
    data = path.read_bytes()
    url = f"/api/datasets/pick/episodes/0/video/{CAMERAS[1]}"
    whole = api.get(url)
    assert whole.status_code == 200 and whole.content == data
    assert (
        whole.headers["content-type"] == "video/mp4" and whole.headers["accept-ranges"] == "bytes"
    )
    part = api.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
    tail = api.get(url, headers={"Range": "bytes=-64"})
    assert tail.status_code == 206 and tail.content == data[-64:]
    rest = api.get(url, headers={"Range": f"bytes={len(data) - 10}-"})
    assert rest.status_code == 206 and rest.content == data[-10:]
    assert api.get(url, headers={"Range": f"bytes={len(data) + 5}-"}).status_code == 416
    assert (
        error_of(api.get("/api/datasets/pick/episodes/0/video/observation.images.x"), 404)["field"]
        == "video_key"
    )
    assert (
        error_of(api.get(f"/api/datasets/pick/episodes/9/video/{CAMERAS[0]}"), 404)["field"]
        == "index"
    )


def test_series_for_the_plots(api: httpx.Client, recorded: list[dict]) -> None:
    listing = api.get("/api/datasets/pick/episodes").json()
    length = listing["episodes"][0]["length"]
    full = api.get("/api/datasets/pick/episodes/0/series").json()
    assert full["fps"] == 30 and full["length"] == length
    assert full["frame_index"] == list(range(length))
    table = pq.read_table(Path(listing["dir"]) / "data" / "chunk-000" / "episode_000000.parquet")
    state = table.column("observation.state").to_pylist()
    series = full["series"]["observation.state"]
    assert len(series["values"]) == 6 and len(series["names"]) == 6
    assert series["values"][2] == pytest.approx([row[2] for row in state], rel=1e-6)
    assert set(full["series"]) >= {"observation.state", "action"}
    small = api.get("/api/datasets/pick/episodes/0/series", params={"max_points": 10}).json()
    assert len(small["frame_index"]) == 10
    assert small["frame_index"][0] == 0 and small["frame_index"][-1] == length - 1
    assert len(small["series"]["action"]["values"][0]) == 10
    bad = api.get("/api/datasets/pick/episodes/0/series", params={"max_points": "x"})
    assert error_of(bad, 400)["field"] == "max_points"


def test_issue_frames_are_parsed_for_jumps() -> None:
    from eva.console.review import issue_frames

    assert issue_frames("camera c: frozen from frame 12 (near frame 40) for 1 s") == [12, 40]
    assert issue_frames("no image for frames 0-9") == [0]
    assert issue_frames(None) == []


# ---- export and upload -------------------------------------------------------------------------


def test_export_v3_then_upload(
    api: httpx.Client, recorded: list[dict], remote_dir: Path, workdir: Path
) -> None:
    api.put("/api/datasets/pick/episodes/1/qc", json={"verdict": "fail"})
    api.put("/api/datasets/pick/episodes/0/qc", json={"verdict": "pass"})
    # never exported: the gate refuses with its reason
    refused = api.post("/api/datasets/pick/upload", json={"format": "lerobot_v3"})
    assert error_of(refused, 409)["code"] == "never_exported"
    # bad export requests
    assert (
        error_of(api.post("/api/datasets/pick/export", json={"format": "tar"}), 400)["field"]
        == "format"
    )
    bad_option = api.post(
        "/api/datasets/pick/export", json={"format": "v3", "options": {"chunks": 2}}
    )
    assert error_of(bad_option, 400)["field"] == "options.chunks"
    bad_value = api.post(
        "/api/datasets/pick/export",
        json={"format": "mcap", "options": {"mcap_compression": "gzip"}},
    )
    assert error_of(bad_value, 400)["field"] == "options.mcap_compression"
    assert (
        error_of(api.post("/api/datasets/fold/export", json={"format": "v3"}), 409)["code"]
        == "no_episodes"
    )

    started = api.post(
        "/api/datasets/pick/export",
        json={"format": "lerobot_v3", "options": {"image_quantiles": "none"}},
    )
    assert started.status_code == 202, started.text
    job = started.json()
    assert started.headers["location"] == f"/api/jobs/{job['job_id']}"
    assert job["state"] in ("queued", "running") and job["format"] == "lerobot_v3"
    raw = Path(api.get("/api/datasets/pick/episodes").json()["dir"])
    assert job["accepted_dir"] == str(raw.parent / "export" / "lerobot_v3" / "accepted")
    # one job at a time
    busy = api.post("/api/datasets/pick/export", json={"format": "hdf5"})
    assert error_of(busy, 409)["code"] == "job_running"
    done = wait_job(api, job["job_id"])
    assert done["state"] == "completed", done
    assert done["totals"] == {
        "accepted": {"episodes": 1, "frames": recorded[0]["frames"]},
        "rejected": {"episodes": 1, "frames": recorded[1]["frames"]},
    }
    assert done["verify"]["accepted"]["ok"] and done["verify"]["rejected"]["ok"], done["verify"]
    assert done["progress"]["episodes"] == 2
    assert Path(done["accepted_dir"], "meta", "quality_split.json").is_file()
    on_disk = json.loads(Path(raw.parent / "export" / "lerobot_v3" / "job.json").read_text())
    assert on_disk["job_id"] == job["job_id"] and on_disk["state"] == "completed"
    assert error_of(api.get("/api/jobs/nope"), 404)["code"] == "unknown_job"

    exports = api.get("/api/datasets/pick/exports").json()
    v3 = exports["formats"]["lerobot_v3"]
    assert v3["state"] == "completed" and not v3["stale"] and v3["upload"]["allowed"]
    assert exports["formats"]["hdf5"]["upload"]["reason"] == "never_exported"
    assert set(exports["options"]) == {"lerobot_v21", "lerobot_v3", "hdf5", "mcap", "zarr"}
    # a verdict change makes the export stale: upload refused until it is exported again
    api.put("/api/datasets/pick/episodes/0/qc", json={"verdict": "fail"})
    assert api.get("/api/datasets/pick/episodes").json()["stale"] == ["lerobot_v3"]
    stale = api.get("/api/datasets/pick/exports").json()["formats"]["lerobot_v3"]
    assert stale["stale"] and stale["upload"]["reason"] == "export_stale"
    assert (
        error_of(api.post("/api/datasets/pick/upload", json={"format": "v3"}), 409)["code"]
        == "export_stale"
    )
    api.put("/api/datasets/pick/episodes/0/qc", json={"verdict": "pass"})
    assert api.get("/api/datasets/pick/episodes").json()["stale"] == []

    assert (
        error_of(api.post("/api/datasets/pick/upload", json={"format": "hdf5"}), 409)["code"]
        == "never_exported"
    )
    started = api.post("/api/datasets/pick/upload", json={"format": "lerobot_v3"})
    assert started.status_code == 202, started.text
    upload = wait_job(api, started.json()["job_id"])
    assert upload["state"] == "completed", upload
    remote_path = remote_dir / "pick-lerobot_v3"  # the remote name says the format
    assert upload["remote_path"] == str(remote_path)
    assert upload["progress"]["files"] == upload["progress"]["total_files"] > 0
    uploaded = sorted(p.relative_to(remote_path) for p in remote_path.rglob("*") if p.is_file())
    exported = sorted(
        p.relative_to(done["accepted_dir"])
        for p in Path(done["accepted_dir"]).rglob("*")
        if p.is_file()
    )
    assert uploaded == exported
    last = api.get("/api/datasets/pick/exports").json()["formats"]["lerobot_v3"]["last_upload"]
    assert last["state"] == "completed" and last["remote_path"] == upload["remote_path"]
    assert last["export_job_id"] == done["job_id"]
    # The same export again: refused, saying where it is, until asked for explicitly.
    again = api.post("/api/datasets/pick/upload", json={"format": "lerobot_v3"})
    assert error_of(again, 409)["code"] == "already_uploaded"
    assert f"at {remote_path} (uploaded " in error_of(again, 409)["message"]
    bad = api.post("/api/datasets/pick/upload", json={"format": "lerobot_v3", "again": 1})
    assert error_of(bad, 400)["field"] == "again"
    second = api.post("/api/datasets/pick/upload", json={"format": "lerobot_v3", "again": True})
    assert second.status_code == 202, second.text
    copy = wait_job(api, second.json()["job_id"])
    assert copy["state"] == "completed" and copy["remote_path"].startswith(f"{remote_path}.copy_")


def test_unknown_routes_and_symlinked_dataset(
    server: ConsoleServer, api: httpx.Client, workdir: Path
) -> None:
    assert error_of(api.get("/api/nope"), 404)["code"] == "not_found"
    # a dataset directory that is a symlink out of the log directory is refused, not followed
    outside = workdir / "outside"
    (outside / "meta").mkdir(parents=True)
    (outside / "meta" / "episodes.jsonl").write_text('{"episode_index": 0}\n')
    (workdir / "logs" / "fold").mkdir(parents=True, exist_ok=True)
    link = workdir / "logs" / "fold" / "raw"
    aside = link.with_name("raw.aside")
    if link.exists():
        link.rename(aside)  # the cancelled episode of an earlier test created it
    os.symlink(outside, link)
    try:
        assert error_of(api.get("/api/datasets/fold/episodes"), 409)["code"] == "unsafe_path"
        assert (
            error_of(api.get("/api/datasets/fold/episodes/0/series"), 409)["code"] == "unsafe_path"
        )
        assert error_of(api.get("/api/datasets/fold/exports"), 409)["code"] == "unsafe_path"
        put = api.put("/api/datasets/fold/episodes/0/qc", json={"verdict": "pass"})
        assert error_of(put, 409)["code"] == "unsafe_path"
        assert (outside / "meta" / "episodes.jsonl").read_text() == '{"episode_index": 0}\n'
    finally:
        link.unlink()
        if aside.exists():
            aside.rename(link)


def test_no_backend_refuses_upload_without_a_thread(tmp_path: Path) -> None:
    config = write_console_config(tmp_path / "rig.toml", tmp_path / "logs")
    with ConsoleServer(config, tmp_path / "token") as console:
        api = console.client()
        assert api.get("/api/status").json()["upload_backend"] is None
        record_episode(api, "pick", 1.0)
        job = wait_job(
            api, api.post("/api/datasets/pick/export", json={"format": "v21"}).json()["job_id"]
        )
        assert job["state"] == "completed", job
        exports = api.get("/api/datasets/pick/exports").json()["formats"]["lerobot_v21"]
        assert exports["upload"] == {
            "allowed": False,
            "reason": "no_backend",
            "message": exports["upload"]["message"],
        }
        refused = api.post("/api/datasets/pick/upload", json={"format": "lerobot_v21"})
        assert error_of(refused, 409)["code"] == "no_backend"
        # no upload job was started or recorded
        assert [j["kind"] for j in api.get("/api/jobs").json()["jobs"]] == ["export"]
        raw = Path(api.get("/api/datasets/pick/episodes").json()["dir"])
        assert not (raw.parent / "export" / "lerobot_v21" / "upload_job.json").exists()


def test_another_address_must_be_explicit_and_matches_its_host(tmp_path: Path) -> None:
    """127.0.0.2 is loopback too, but not the default: it stands in for a rig's LAN address."""
    config = write_console_config(tmp_path / "rig.toml", tmp_path / "logs")
    with ConsoleServer(config, tmp_path / "token", ("--host", "127.0.0.2")) as console:
        assert console.base.startswith("http://127.0.0.2:")
        assert "reachable from other hosts" in console.log_path.read_text()
        browser = console.client(auth=False)
        browser.get(f"/?token={console.token}", follow_redirects=False)
        own = {"Origin": console.base}
        assert (
            error_of(browser.post("/api/collect/stop", headers=own), 409)["code"] == "not_recording"
        )
        evil = {"Origin": "http://127.0.0.1:1"}
        assert (
            error_of(browser.post("/api/collect/stop", headers=evil), 403)["code"] == "bad_origin"
        )


def test_console_records_the_configs_source_processes(tmp_path: Path) -> None:
    """Streams with a configured source (here the sim kind, in a source process): pre-checked at
    start-up, recorded through shared memory, previewed from the ring."""
    config = write_console_config(
        tmp_path / "rig.toml", tmp_path / "logs", source='{ kind = "sim" }'
    )
    with ConsoleServer(config, tmp_path / "token") as console:
        api = console.client()
        status = api.get("/api/status").json()
        assert status["source"].startswith("the config's sources")
        assert set(status["streams"]) == {*CAMERAS, "observation.state", "action"}
        assert all(text.startswith("sim") for text in status["streams"].values())
        job = record_episode(api, "pick", 1.5)
        assert job["state"] == "saved" and job["quality"] == "green", job
        assert 30 <= job["frames"] <= 60

        def preview() -> httpx.Response | None:
            response = api.get(f"/api/preview/{CAMERAS[1]}")
            return response if response.status_code == 200 else None

        assert wait_for(preview, 10).content[:2] == b"\xff\xd8"  # idle: from the ring


def test_console_refuses_to_start_when_a_source_is_silent(tmp_path: Path) -> None:
    config = write_console_config(
        tmp_path / "rig.toml",
        tmp_path / "logs",
        source='{ kind = "zmq", endpoint = "tcp://127.0.0.1:9", open_timeout_s = 1 }',
    ).read_text()
    # only the vectors may take a zmq source: give the cameras the simulator
    config = config.replace(
        'height = 120\nsource = { kind = "zmq", endpoint = "tcp://127.0.0.1:9", open_timeout_s = 1 }',
        'height = 120\nsource = { kind = "sim" }',
    )
    (tmp_path / "rig.toml").write_text(config)
    console = ConsoleServer(tmp_path / "rig.toml", tmp_path / "token")
    with pytest.raises(RuntimeError, match="did not start") as info:
        console.start(timeout=20)
    text = str(info.value)
    assert "stream observation.state: zmq tcp://127.0.0.1:9" in text
    assert "stream action: zmq tcp://127.0.0.1:9" in text
    assert not (tmp_path / "token").exists()
