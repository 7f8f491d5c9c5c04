"""The console's edit request (``PUT /api/datasets/{name}/episodes/{index}/edit``) against a real
``eva console`` process: trim, task and drop as ``eva edit`` stores them, the episode list and
the split showing them, stale exports marked, and hostile bodies answered 4xx naming the field
with the raw tree unchanged."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from console_server import CAMERAS, ConsoleServer, wait_job, write_console_config

from eva.capture.synthetic import write_synthetic_dataset
from eva.quality.verdicts import read_episode_rows


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("console_edits")
    return write_synthetic_dataset(
        workdir / "logs" / "pick" / "raw",
        episodes=3,
        frames=[30, 20, 1],
        cameras=list(CAMERAS),
        width=64,
        height=48,
        state_dim=6,
        action_dim=6,
        tasks=["pick up the cube"],
    )


@pytest.fixture(scope="module")
def api(raw: Path) -> Iterator[httpx.Client]:
    workdir = raw.parents[2]
    config = write_console_config(workdir / "rig.toml", workdir / "logs")
    with ConsoleServer(config, workdir / "token") as console:
        yield console.client()


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["message"] and "\n" not in error["message"]
    return error


URL = "/api/datasets/pick/episodes/{}/edit"
KEPT_HISTOGRAMS = "meta/eva_kept_histograms.jsonl"


def kept_histogram_trims(raw: Path, want: dict[int, list[int]]) -> dict[int, list[int]]:
    """The trims of the kept-histogram cache once they are ``want`` (the console records them
    after answering, on its own thread; every later run of it can only agree with the edits)."""
    path = raw / KEPT_HISTOGRAMS
    deadline = time.monotonic() + 60
    while True:
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines()]
        except FileNotFoundError:
            rows = []
        got = {r["episode_index"]: r["trim"] for r in rows}
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_trim_task_and_drop_are_one_request_each(api: httpx.Client, raw: Path) -> None:
    recorded = {k: v for k, v in tree_digest(raw).items() if k != "meta/episodes.jsonl"}
    trimmed = api.put(URL.format(0), json={"trim": [5, 25]}).json()
    assert (
        trimmed["edit_trim"] == [5, 25] and trimmed["changed"] and trimmed["subset"] == "accepted"
    )
    seconds = api.put(URL.format(0), json={"trim": "0.5s:"}).json()
    assert seconds["edit_trim"] == [15, 30]
    tasked = api.put(URL.format(1), json={"task": "pick up the ball"}).json()
    assert tasked["edit_task"] == "pick up the ball" and tasked["edit_trim"] is None
    dropped = api.put(URL.format(2), json={"drop": True}).json()
    assert dropped["edit_drop"] is True and dropped["subset"] == "dropped"

    listing = api.get("/api/datasets/pick/episodes").json()
    by_index = {e["episode_index"]: e for e in listing["episodes"]}
    assert by_index[0]["edit_trim"] == [15, 30] and by_index[0]["edit_drop"] is False
    assert by_index[1]["edit_task"] == "pick up the ball"
    assert by_index[2]["subset"] == "dropped"
    assert listing["split"] == {"accepted": [0, 1], "rejected": [], "dropped": [2]}
    rows = {r["episode_index"]: r for r in read_episode_rows(raw)}
    assert rows[0]["edit_trim"] == [15, 30] and rows[2]["edit_drop"] is True
    assert kept_histogram_trims(raw, {0: [15, 30]}) == {0: [15, 30]}

    # Undone, one request each: the fields are gone.
    assert api.put(URL.format(0), json={"trim": None}).json()["edit_trim"] is None
    assert api.put(URL.format(1), json={"task": None}).json()["edit_task"] is None
    assert api.put(URL.format(2), json={"drop": False}).json()["subset"] == "accepted"
    again = api.put(URL.format(2), json={"drop": False}).json()
    assert again["changed"] is False
    assert not any(k.startswith("edit_") for r in read_episode_rows(raw) for k in r)
    assert kept_histogram_trims(raw, {}) == {}
    assert {k: v for k, v in tree_digest(raw).items() if k != "meta/episodes.jsonl"} == recorded


def test_an_edit_marks_the_export_stale(api: httpx.Client, raw: Path) -> None:
    response = api.post("/api/datasets/pick/export", json={"format": "hdf5"})
    assert response.status_code == 202, response.text
    assert wait_job(api, response.json()["job_id"], timeout=60)["state"] == "completed"
    assert api.get("/api/datasets/pick/episodes").json()["stale"] == []
    api.put(URL.format(1), json={"trim": [0, 10]})
    assert api.get("/api/datasets/pick/episodes").json()["stale"] == ["hdf5"]
    api.put(URL.format(1), json={"trim": None})
    assert api.get("/api/datasets/pick/episodes").json()["stale"] == []
    assert kept_histogram_trims(raw, {}) == {}


@pytest.mark.parametrize(
    ("index", "body", "status", "field"),
    [
        (0, {}, 400, "trim"),
        (0, [], 400, None),
        (0, {"trim": [5, 5]}, 400, "trim"),
        (0, {"trim": [0, 31]}, 400, "trim"),
        (2, {"trim": [0, 2]}, 400, "trim"),
        (0, {"trim": [-1, 3]}, 400, "trim"),
        (0, {"trim": [1, 2, 3]}, 400, "trim"),
        (0, {"trim": [True, 3]}, 400, "trim"),
        (0, {"trim": [1.5, 3]}, 400, "trim"),
        (0, {"trim": {"a": 1}}, 400, "trim"),
        (0, {"trim": "x:3"}, 400, "trim"),
        (0, {"trim": "1e9s:"}, 400, "trim"),
        (0, {"trim": "9" * 5000 + ":"}, 400, "trim"),
        (0, {"trim": [0, 10**30]}, 400, "trim"),
        (0, {"task": "   "}, 400, "task"),
        (0, {"task": "a\nb"}, 400, "task"),
        (0, {"task": "\ud800"}, 400, "task"),
        (0, {"task": "x" * 2001}, 400, "task"),
        (0, {"task": 7}, 400, "task"),
        (0, {"drop": "yes"}, 400, "drop"),
        (0, {"drop": None}, 400, "drop"),
        (0, {"trim": [0, 3], "x": 1}, 400, "x"),
        (9, {"drop": True}, 404, "index"),
        ("1٣", {"drop": True}, 400, "index"),
    ],
)
def test_hostile_edits_are_4xx_naming_the_field(
    api: httpx.Client, raw: Path, index: object, body: object, status: int, field: str | None
) -> None:
    before = tree_digest(raw)
    sent = json.dumps(body).encode()  # ASCII: a lone surrogate travels as its \ud800 escape
    response = api.put(
        URL.format(index), content=sent, headers={"content-type": "application/json"}
    )
    error = error_of(response, status)
    if field is not None:
        assert error["field"] == field
    assert tree_digest(raw) == before


def test_unknown_dataset_and_bad_json(api: httpx.Client, raw: Path) -> None:
    before = tree_digest(raw)
    assert error_of(api.put("/api/datasets/zzz/episodes/0/edit", json={"drop": True}), 404)
    bad = api.put(URL.format(0), content=b"{" * 100, headers={"content-type": "application/json"})
    assert error_of(bad, 400)["code"] == "bad_json"
    assert tree_digest(raw) == before
