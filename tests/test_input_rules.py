"""One rule for what a user may type, and numbers range-checked at every entry.

Whatever ``eva collect`` (its config, ``--task``, ``--dataset``), ``eva qc --note``, ``eva export``
and the console accept, the writer, the validator and the exports accept afterwards: the text
rule is ``eva.textsafe.text_problem`` (the validator's ``invalid_text`` rule plus one printable
line of bounded length) and every number is checked against the limit the writer and the
validator share. Property tests drive the entry checks in-process over many values; a few real
runs (``eva collect --source sim`` then ``eva validate``, a console process) check the wiring.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from console_server import ConsoleServer, record_episode, wait_for, write_console_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_capture_cli import CONFIG  # a one-camera rig at 10 fps

from eva.capture.sources import SourceSpecError, source_from_spec
from eva.capture.synthetic import write_synthetic_dataset
from eva.config import ConfigError, config_from_dict, ring_memory_problem
from eva.console.errors import ConsoleError
from eva.console.http_values import (
    MAX_JSON_DEPTH,
    UnicodeSafeJSONResponse,
    decimal,
    episode_index,
    parse_json_body,
)
from eva.dataset import atomic, layout
from eva.dataset.atomic import NotJSONError
from eva.dataset.errors import DatasetError
from eva.dataset.features import CameraSpec, VectorSpec
from eva.dataset.limits import MAX_FPS, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE
from eva.dataset.reader import info_field_problems
from eva.dataset.validate import validate_dataset
from eva.export.options import format_options, parse_options
from eva.formats.base import OptionError
from eva.quality.verdicts import review_episodes
from eva.textsafe import MAX_TEXT_CHARS, storable_problem, text_problem

EVA = [sys.executable, "-m", "eva.cli"]
PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SLOW_PROPERTY = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# Any code point, lone surrogates, NUL and controls included, with printable text around them.
ANY_TEXT = st.text(st.characters(), max_size=60) | st.text(
    st.sampled_from(["a", " ", "é", "中", "🤖", "\u202e", "\x00", "\t", "\n", "\x1b", "\x9b",
                     "\ud800", "\udcff", "\ufeff"]),
    max_size=20,
)  # fmt: skip
NUMBERS = (
    st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, 1, 2, 1000, 1001, 8192, 8194, 10**20, 1e300, -1])
)


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVA, *args], capture_output=True, text=True, timeout=timeout, errors="surrogateescape"
    )


def collection(**overrides: Any) -> dict[str, Any]:
    table: dict[str, Any] = {"log_dir": "/nonexistent/logs", "tasks": {"demo": ["wave"]}}
    table.update(overrides)
    return {"collection": table}


# ---- the text rule -----------------------------------------------------------------------------


@PROPERTY
@given(ANY_TEXT)
def test_typed_text_the_rule_accepts_is_storable(text: str) -> None:
    """The entry rule is the validator's rule and more: nothing it accepts is invalid_text."""
    if text_problem(text) is None:
        assert storable_problem(text) is None
        text.encode("utf-8")
        assert "\x00" not in text and len(text) <= MAX_TEXT_CHARS
    if storable_problem(text) is not None:
        assert text_problem(text) is not None


@pytest.fixture(scope="module")
def small_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("rules") / "raw", episodes=1, frames=6, cameras=1, width=32,
        height=24, state_dim=2,
    )  # fmt: skip


@SLOW_PROPERTY
@given(ANY_TEXT)
def test_a_note_qc_accepts_validates(small_raw: Path, text: str) -> None:
    """``eva qc --note`` and the console's note take text_problem's word; validate agrees."""
    if text_problem(text) is not None:
        return
    review_episodes(small_raw, [0], note=text)
    assert validate_dataset(small_raw) == []


@PROPERTY
@given(prompt=ANY_TEXT, name=ANY_TEXT, robot=ANY_TEXT)
def test_config_text_is_refused_or_storable(prompt: str, name: str, robot: str) -> None:
    """Every string of [collection] passes the text rule, and names the key when it does not."""
    raw = collection(tasks={name or "n": [prompt or "p"]}, robot_type=robot)
    try:
        cfg = config_from_dict(raw).collection
    except ConfigError as e:
        assert "collection." in str(e) and "\n" not in str(e)
        return
    for text in (*cfg.tasks, *cfg.tasks[next(iter(cfg.tasks))], cfg.robot_type):
        assert text_problem(text) is None


def test_config_strings_name_their_key() -> None:
    cases = {
        "collection.tasks.demo[0]": collection(tasks={"demo": ["pick\x00cube"]}),
        "collection.robot_type": collection(robot_type="arm\x1b[2J"),
        "collection.cameras[0].key": collection(
            cameras=[{"key": "observation.images.a\ud800", "width": 64, "height": 48}]
        ),
    }
    for key, raw in cases.items():
        with pytest.raises(ConfigError, match=rf"^config: {re.escape(key)}: "):
            config_from_dict(raw)


# ---- numbers -----------------------------------------------------------------------------------


@PROPERTY
@given(fps=NUMBERS, width=NUMBERS, height=NUMBERS, dim=NUMBERS)
def test_config_numbers_the_writer_and_validator_accept(
    fps: Any, width: Any, height: Any, dim: Any
) -> None:
    raw = collection(
        fps=fps,
        cameras=[{"key": "observation.images.a", "width": width, "height": height}],
        vectors=[{"name": "observation.state", "dim": dim}],
    )
    try:
        cfg = config_from_dict(raw).collection
    except ConfigError as e:
        assert "config: collection." in str(e) and "\n" not in str(e)
        return
    assert 2 <= cfg.fps <= MAX_FPS
    assert not [p for p in info_field_problems({"fps": cfg.fps, "features": {}}) if "fps" in p]
    camera = cfg.cameras[0]
    CameraSpec(camera.key, camera.height, camera.width)  # the writer's own check
    VectorSpec(cfg.vectors[0].name, cfg.vectors[0].dim)
    assert camera.width * camera.height <= MAX_IMAGE_PIXELS


@PROPERTY
@given(key=st.sampled_from(
    ["stream_start_timeout_s", "frozen_camera_s", "clock_jump_s", "skew_tolerance_s",
     "min_episode_frames"]
), value=NUMBERS)  # fmt: skip
def test_config_durations_are_finite_and_bounded(key: str, value: Any) -> None:
    try:
        cfg = config_from_dict(collection(**{key: value})).collection
    except ConfigError as e:
        assert f"collection.{key}" in str(e)
        return
    assert math.isfinite(getattr(cfg, key)) and 0 <= getattr(cfg, key) <= 86_400_000


def test_defect_11_a_huge_camera_names_its_field() -> None:
    with pytest.raises(ConfigError, match=r"collection\.cameras\[0\]\.width: must be <= 8192"):
        config_from_dict(
            collection(cameras=[{"key": "observation.images.a", "width": 100000, "height": 100000}])
        )
    with pytest.raises(ConfigError, match=r"cameras\[0\]\.width: 8192x8192: .* pixels"):
        config_from_dict(
            collection(
                cameras=[{"key": "observation.images.a", "width": MAX_IMAGE_SIDE, "height": 8192}]
            )
        )
    cfg = config_from_dict(
        collection(
            fps=1000,
            cameras=[{"key": "observation.images.a", "width": 8192, "height": 4352}],
            backlog={"ring_seconds": 60},
        )
    ).collection
    problem = ring_memory_problem(cfg, available_bytes=64 << 30)
    assert problem is not None and problem.startswith("collection.backlog.ring_seconds:")
    assert ring_memory_problem(config_from_dict(collection()).collection) is None


NUMERIC_OPTIONS = [
    (fmt, f.name) for fmt, fields in format_options().items() for f in fields
    if f.type in ("int", "float")
]  # fmt: skip


@PROPERTY
@given(option=st.sampled_from(NUMERIC_OPTIONS), value=NUMBERS)
def test_export_options_are_bounded(option: tuple[str, str], value: Any) -> None:
    """The console's parse (and the CLI's check): a value is refused naming the option, or
    it is finite and within the bounds the format's writer works within."""
    fmt, name = option
    # The training profile's own numbers (its CRF) are only accepted with that profile.
    context = {"video_profile": "training"} if name.startswith("video_") else {}
    try:
        options = parse_options(fmt, {**context, name: value})
    except OptionError as e:
        assert str(e).startswith(f"options.{name}: ") and "\n" not in str(e)
        return
    spec = next(f for f in format_options()[fmt] if f.name == name)
    chosen = getattr(options.format, spec.field_name)
    assert math.isfinite(chosen)
    assert spec.info.minimum is not None and spec.info.maximum is not None
    assert spec.info.minimum <= chosen <= spec.info.maximum


def test_every_number_option_has_both_bounds() -> None:
    for fields in format_options().values():
        for f in fields:
            if f.type in ("int", "float"):
                assert f.info.minimum is not None and f.info.maximum is not None, f.name


def test_defect_9_export_cli_refuses_huge_and_infinite_options(small_raw: Path) -> None:
    for args in (
        ("--format", "hdf5", "--hdf5-frames-per-chunk", "99999999999999999999"),
        ("--format", "v3", "--video-file-size-mb", "inf"),
        ("--format", "v3", "--data-file-size-mb", "nan"),
        ("--format", "mcap", "--mcap-chunk-size", "1" + "0" * 30),
    ):
        result = run("export", str(small_raw), *args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and args[2] in result.stderr
    assert not (small_raw.parent / "export").exists()


# ---- console values ----------------------------------------------------------------------------


@PROPERTY
@given(st.text(max_size=30) | st.integers() | st.none() | st.booleans())
def test_episode_index_is_ascii_digits_or_a_400(value: Any) -> None:
    try:
        index = episode_index(value)
    except ConsoleError as e:
        assert e.kind == "bad_request" and e.field == "index"
        return
    assert isinstance(index, int) and index >= 0
    assert isinstance(value, int) or (value.isascii() and value.isdigit() and len(value) <= 18)


def test_defect_10_parsing_values() -> None:
    for bad in ("²", "٣", "1" * 5000, "-1", " 1", "1e3", ""):
        assert decimal(bad) is None
        with pytest.raises(ConsoleError):
            episode_index(bad)
    assert episode_index("007") == 7
    nested = b"[" * 30_000 + b"]" * 30_000
    with pytest.raises(ConsoleError, match="nested more than"):
        parse_json_body(nested)
    deep_ok = b'{"a":' * MAX_JSON_DEPTH + b"1" + b"}" * MAX_JSON_DEPTH
    assert parse_json_body(deep_ok)
    # brackets inside strings are text, not nesting
    assert parse_json_body(json.dumps({"note": "[" * 10_000}).encode()) == {"note": "[" * 10_000}
    unterminated = b'{"note": "' + b"\\" * 5000 + b"[" * 1000
    with pytest.raises(ConsoleError, match="bad_json|not JSON|nested"):
        parse_json_body(unterminated)


# ---- end to end: eva collect, eva qc, eva validate ---------------------------------------------


@pytest.mark.realtime
def test_collect_records_what_it_accepts_and_refuses_the_rest(tmp_path: Path) -> None:
    config = tmp_path / "rig.toml"
    config.write_text(CONFIG)
    raw = tmp_path / "logs" / "demo" / "raw"
    refused = {
        "--task": [b"a\xffb".decode("utf-8", "surrogateescape"), "two\nlines", "x" * 2001],
        "--dataset": ["demo\x1b]0;title\x07"],
    }
    for option, values in refused.items():
        for value in values:
            result = run("collect", str(config), "--episodes", "1", "--seconds", "0.3",
                         option, value)  # fmt: skip
            assert result.returncode == 2, (value, result.stderr)
            assert result.stderr.startswith(f"eva: error: collect: {option}: ")
            assert result.stderr.count("\n") == 1
    assert not raw.exists()
    for prompt in ("ünïcødé 中文 🤖", "\u202eright to left", "y" * MAX_TEXT_CHARS):
        result = run("collect", str(config), "--episodes", "1", "--seconds", "0.6",
                     "--task", prompt, "-q")  # fmt: skip
        assert result.returncode == 0, result.stderr
    assert [e["tasks"] for e in atomic.read_jsonl(raw / layout.EPISODES)] == [
        ["ünïcødé 中文 🤖"],
        ["\u202eright to left"],
        ["y" * MAX_TEXT_CHARS],
    ]
    assert run("validate", str(raw)).returncode == 0
    note = run("qc", str(raw), "0", "--note", "bad\tnote")
    assert note.returncode == 2 and "qc: --note: control character \\x09" in note.stderr
    assert run("qc", str(raw), "0", "--note", "glare — ok ✓").returncode == 0
    assert run("validate", str(raw)).returncode == 0


def test_defect_4_and_11_collect_refuses_the_config(tmp_path: Path) -> None:
    for change, field in (
        (("fps = 10", "fps = 1000000000"), "collection.fps: must be <= 1000"),
        (("width = 64", "width = 100000"), "collection.cameras[0].width: must be <= 8192"),
        (("preset", 'gop = 99999999999999999\npreset'), "collection.encoder.gop"),
        (("min_episode_frames = 3", "min_episode_frames = 3\nclock_jump_s = nan"),
         "collection.clock_jump_s: must be a finite number"),
    ):  # fmt: skip
        config = tmp_path / "rig.toml"
        config.write_text(CONFIG.replace(*change))
        result = run("collect", str(config), "--episodes", "1", "--seconds", "0.3")
        assert result.returncode == 2 and field in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "logs").exists()


# ---- end to end: the console -------------------------------------------------------------------


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("rules-console")
    config = write_console_config(workdir / "rig.toml", workdir / "logs", width=64, height=48)
    with ConsoleServer(config, workdir / "token") as server:
        yield server


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    error: dict[str, Any] = response.json()["error"]
    assert "\n" not in error["message"]
    return error


def _raw_json(client: httpx.Client, method: str, url: str, text: str) -> httpx.Response:
    """A request whose body is ``text`` as it is (lone surrogates written as JSON escapes)."""
    return client.request(
        method, url, content=text.encode(), headers={"content-type": "application/json"}
    )


@pytest.mark.realtime
def test_console_refuses_what_validate_would_and_survives_a_hostile_dataset(
    console: ConsoleServer,
) -> None:
    api = console.client()
    # defect 3: a prompt that is not Unicode, or holds a control or a NUL: 400 naming task
    for body in ('{"dataset": "pick", "task": "a\\ud800b"}',
                 '{"dataset": "pick", "task": "a\\u0000b"}',
                 '{"dataset": "pick", "task": "a\\nb"}'):  # fmt: skip
        assert _error(_raw_json(api, "POST", "/api/collect/start", body), 400)["field"] == "task"
    assert api.get("/api/status").json()["state"] == "idle"
    job = record_episode(api, "pick", 1.2, "pick up the cube ✓")
    assert job["state"] == "saved", job
    base = "/api/datasets/pick/episodes"
    # defect 10: 400, never 500
    for index in ("%C2%B2", "1" * 5000, "-1", "1e3"):
        assert _error(api.get(f"{base}/{index}/series"), 400)["field"] == "index"
    assert _error(api.get(f"{base}/99/series"), 404)["code"] == "unknown_episode"
    deep = "[" * 30_000 + "]" * 30_000
    assert _error(_raw_json(api, "PUT", f"{base}/0/qc", deep), 400)["code"] == "bad_json"
    for note in ('"x\\udcffy"', '"x\\u0000y"', '"x\\ty"'):
        response = _raw_json(api, "PUT", f"{base}/0/qc", f'{{"note": {note}}}')
        assert _error(response, 400)["field"] == "note"
    # defect 9: unbounded export options are refused before a job starts
    for options in ('{"video_files_size_in_mb": Infinity}', '{"data_files_size_in_mb": NaN}',
                    '{"image_quantile_keyframes": 1e300}'):  # fmt: skip
        body = f'{{"format": "lerobot_v3", "options": {options}}}'
        error = _error(_raw_json(api, "POST", "/api/datasets/pick/export", body), 400)
        assert "options." in error["message"]
    body = '{"format": "hdf5", "options": {"hdf5_frames_per_chunk": 1e300}}'
    assert _error(_raw_json(api, "POST", "/api/datasets/pick/export", body), 400)
    assert api.get("/api/jobs").json()["jobs"] == []
    # Whatever was accepted validates.
    raw = console.config.parent / "logs" / "pick" / "raw"
    assert validate_dataset(raw) == []
    # A dataset edited by hand (a lone surrogate) still answers: the operator sees and fixes it.
    rows = atomic.read_jsonl(raw / layout.EPISODES)
    rows[0]["qc_note"] = "glare \ud800 here"
    (raw / layout.EPISODES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    console_rows = wait_for(lambda: api.get(f"{base}").json()["episodes"] or None)
    assert console_rows[0]["qc_note"] == "glare \ud800 here"
    assert api.get("/api/status").status_code == 200
    fixed = api.put(f"{base}/0/qc", json={"note": "glare here"})
    assert fixed.status_code == 200, fixed.text
    assert validate_dataset(raw) == []


def test_console_answers_carry_what_utf8_and_json_cannot() -> None:
    response = UnicodeSafeJSONResponse({"note": "a\ud800", "seconds": [float("nan"), 1.5]})
    assert json.loads(response.body) == {"note": "a\ud800", "seconds": [None, 1.5]}


# ---- values read back from hand-edited files -------------------------------------------------

# What Python's json reads and JSON has no text for; eva writes JSON only.
NOT_JSON = ("NaN", "Infinity", "-Infinity", "1e999")


def _hand_edit(path: Path, line: int, old: str, new: str) -> bytes:
    lines = path.read_bytes().split(b"\n")
    assert old.encode() in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old.encode(), new.encode())
    path.write_bytes(b"\n".join(lines))
    return path.read_bytes()


@pytest.fixture
def two_episodes(tmp_path: Path) -> Path:
    return write_synthetic_dataset(
        tmp_path / "raw", episodes=2, frames=6, cameras=1, width=32, height=24, state_dim=2
    )


def test_qc_names_a_hand_edited_nan_and_leaves_the_file(two_episodes: Path) -> None:
    """A review rewrites episodes.jsonl: a NaN in any row refuses it with the file, the row and
    the field, before anything is written; eva validate names the same field."""
    episodes = two_episodes / layout.EPISODES
    fine = episodes.read_bytes()
    for value, field in [(v, "duration_seconds") for v in NOT_JSON] + [
        ('0.2, "quality_issues": [{"code": "x", "at": [1, NaN]}]', "quality_issues.0.at.1")
    ]:
        before = _hand_edit(episodes, 2, '"duration_seconds": 0.2', f'"duration_seconds": {value}')
        message = rf"episodes\.jsonl: row 2 \(episode 1\): field {re.escape(field)}: .* JSON number"
        with pytest.raises(NotJSONError, match=message + ".* by hand, then run this again$"):
            review_episodes(two_episodes, [0], note="glare")
        assert episodes.read_bytes() == before
        assert not [p for p in episodes.parent.iterdir() if p.name.startswith(atomic.TMP_PREFIX)]
        problems = [(p.code, p.episode) for p in validate_dataset(two_episodes)]
        assert problems == [("invalid_episode_row", 1)], problems
        episodes.write_bytes(fine)
    _hand_edit(episodes, 2, '"duration_seconds": 0.2', '"duration_seconds": NaN')
    result = run("qc", str(two_episodes), "0", "--pass")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "row 2 (episode 1): field duration_seconds: NaN" in (
        result.stderr
    )
    _hand_edit(episodes, 2, "NaN", "null")  # the fix the message asks for
    assert run("qc", str(two_episodes), "0", "--pass").returncode == 0
    assert validate_dataset(two_episodes) == []


def test_lines_json_loads_chokes_on_name_their_line(two_episodes: Path) -> None:
    """Beyond JSONDecodeError: a 5000-digit integer (ValueError) and deep nesting
    (RecursionError) are an invalid line, named, for qc and validate alike; in info.json too."""
    episodes = two_episodes / layout.EPISODES
    fine = episodes.read_bytes()
    for value, reason in (("9" * 5000, "more than 4300 digits"),
                          ("[" * 100_000 + "]" * 100_000, "nested too deeply")):  # fmt: skip
        _hand_edit(episodes, 2, '"duration_seconds": 0.2', f'"duration_seconds": {value}')
        with pytest.raises(DatasetError, match=rf"episodes\.jsonl:2: invalid JSON line .*{reason}"):
            review_episodes(two_episodes, [0], note="glare")
        assert [p.code for p in validate_dataset(two_episodes)] == ["invalid_episodes"]
        episodes.write_bytes(fine)
        info = two_episodes / layout.INFO
        info_text = info.read_text()
        info.write_text(info_text.replace('"fps": 30,', f'"fps": 30, "x": {value},'))
        problems = validate_dataset(two_episodes)
        assert [p.code for p in problems] == ["invalid_info"] and reason in problems[0].message
        info.write_text(info_text)


def test_metadata_writers_name_what_json_cannot_hold(two_episodes: Path, tmp_path: Path) -> None:
    """Every metadata write names the file and the field; the writer refuses a NaN in the
    info.json it writes back when it opens the dataset, before recording an episode."""
    target = tmp_path / "info.json"
    target.write_text("{}\n")
    with pytest.raises(NotJSONError, match=r"info\.json: field features\.a\.range\.1: NaN is"):
        atomic.atomic_write_json(target, {"features": {"a": {"range": [0, math.nan]}}})
    assert target.read_text() == "{}\n"
    rows = tmp_path / "rows.jsonl"
    with pytest.raises(NotJSONError, match=r"rows\.jsonl: row 2 \(episode 7\): field s\.x: -Inf"):
        atomic.append_jsonl_inplace(
            rows, [{"episode_index": 6}, {"episode_index": 7, "s": {"x": -math.inf}}]
        )
    assert not rows.exists()
    info = two_episodes / layout.INFO
    info.write_text(info.read_text().replace('"fps": 30,', '"fps": 30, "note": [Infinity],'))
    before = (two_episodes / layout.EPISODES).read_bytes()
    with pytest.raises(NotJSONError, match=r"info\.json: field note\.0: Infinity is not a JSON"):
        write_synthetic_dataset(two_episodes, episodes=1, frames=6, cameras=1, width=32,
                                height=24, state_dim=2)  # fmt: skip
    assert (two_episodes / layout.EPISODES).read_bytes() == before
    assert [p.code for p in validate_dataset(two_episodes)] == ["invalid_info"]


def test_console_review_of_a_hand_edited_nan_is_a_409(console: ConsoleServer) -> None:
    raw = console.config.parent / "logs" / "fold" / "raw"
    write_synthetic_dataset(raw, episodes=2, frames=6, cameras=1, width=32, height=24, state_dim=2)
    _hand_edit(raw / layout.EPISODES, 2, '"duration_seconds": 0.2', '"duration_seconds": NaN')
    api = console.client()
    base = "/api/datasets/fold/episodes"
    error = _error(api.put(f"{base}/0/qc", json={"verdict": "fail"}), 409)
    assert error["code"] == "invalid_episode_row"
    assert "row 2 (episode 1): field duration_seconds: NaN" in error["message"]
    assert api.get(base).status_code == 200 and api.get("/api/status").status_code == 200
    _hand_edit(raw / layout.EPISODES, 2, "NaN", "0.2")
    assert api.put(f"{base}/0/qc", json={"verdict": "fail"}).status_code == 200


# ---- a replayed dataset's streams --------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("[24, 32, 3]", "[100000, 100000, 3]"), "shape [100000, 100000, 3]: 100000x100000: each"),
        (("[24, 32, 3]", "[24, 32, 4]"), "shape [24, 32, 4] is not [height, width, 3]"),
        (("[24, 32, 3]", "[25, 32, 3]"), "32x25: yuv420p video needs even sizes"),
        (('"fps": 30', '"fps": 1'), "field fps 1: recording needs 2..1000"),
        (
            ('[2], "names": ["joint_0", "gripper"]', '[5000], "names": ["joint_0", "gripper"]'),
            "shape [5000]: a vector of 1..4096 values",
        ),
    ],
)
def test_replay_streams_meet_the_config_limits(
    small_raw: Path, tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    """A replayed dataset's cameras, vectors and fps replace the config's and size the capture
    rings: they are held to the config's limits, naming info.json and the field."""
    replay = Path(shutil.copytree(small_raw, tmp_path / "replay"))
    info = json.loads((replay / layout.INFO).read_text())
    (replay / layout.INFO).write_text(json.dumps(info).replace(*edit))
    assert edit[1] in (replay / layout.INFO).read_text()
    with pytest.raises(SourceSpecError) as refused:
        source_from_spec(config_from_dict(collection()).collection, f"replay:{replay}")
    assert str(refused.value).startswith(f"--source replay:{replay}: {replay / layout.INFO}: ")
    assert message in str(refused.value)


def test_replay_streams_must_fit_the_rings(small_raw: Path, tmp_path: Path) -> None:
    replay = Path(shutil.copytree(small_raw, tmp_path / "replay"))
    info = json.loads((replay / layout.INFO).read_text())
    info["fps"] = 1000
    info["features"]["observation.images.cam0"]["shape"] = [4352, 8192, 3]
    (replay / layout.INFO).write_text(json.dumps(info))
    config = config_from_dict(collection(backlog={"ring_seconds": 60})).collection
    with pytest.raises(SourceSpecError, match=r"the replayed streams: collection\.backlog\.ring"):
        source_from_spec(config, f"replay:{replay}")
    # eva collect: a usage error (exit 2), one line, nothing created
    (replay / layout.INFO).write_text(
        json.dumps(info).replace("[4352, 8192, 3]", "[100000, 100000, 3]")
    )
    (tmp_path / "rig.toml").write_text(CONFIG)
    result = run("collect", str(tmp_path / "rig.toml"), "--episodes", "1", "--seconds", "0.3",
                 "--source", f"replay:{replay}")  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "info.json: feature 'observation.images.cam0': shape [100000, 100000, 3]" in (
        result.stderr
    )
    assert not (tmp_path / "logs").exists()
