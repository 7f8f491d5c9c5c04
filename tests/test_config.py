"""The TOML config loader: the collection section, defaults, derived log_dir, clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eva.config import ConfigError, default_log_dir, load_config

pytestmark = pytest.mark.kernel_independent

FULL = """
[collection]
log_dir = "logs"
fps = 15
robot_type = "aloha"
min_episode_frames = 5
skew_tolerance_s = 0.02

[collection.tasks]
"pick cube" = ["pick the red cube", "pick the blue cube"]
stack = "stack the cubes"

[[collection.cameras]]
key = "observation.images.front"
width = 64
height = 48

[[collection.vectors]]
name = "observation.state"
dim = 3
discrete = [2]

[collection.encoder]
codec = "libx264"
crf = 30
preset = "ultrafast"
gop = 15

[collection.backlog]
warn_seconds = [2, 0.5]
max_memory_mb = 64

[collection.storage.sftp]
host = "127.0.0.1"
remote_dir = "/data"

[other]
x = 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "eva.toml"
    path.write_text(text)
    return path


def test_full_config(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, FULL))
    c = cfg.collection
    assert c.log_dir == tmp_path / "logs" and not c.log_dir_derived
    assert c.fps == 15 and c.robot_type == "aloha" and c.min_episode_frames == 5
    assert c.tasks == {
        "pick cube": ["pick the red cube", "pick the blue cube"],
        "stack": ["stack the cubes"],
    }
    assert [(x.key, x.width, x.height) for x in c.cameras] == [("observation.images.front", 64, 48)]
    assert c.vectors[0].name == "observation.state" and c.vectors[0].discrete == (2,)
    assert c.encoder.preset == "ultrafast" and c.encoder.gop == 15 and c.encoder.crf == 30
    assert c.backlog.warn_seconds == (0.5, 2.0) and c.backlog.max_memory_mb == 64
    assert c.skew_tolerance == 0.02
    assert c.extra["storage"]["sftp"]["host"] == "127.0.0.1"
    assert cfg.raw["other"] == {"x": 1}
    assert c.dataset_dir("pick cube") == tmp_path / "logs" / "pick_cube" / "raw"


def test_defaults_and_derived_log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVA_HOME", str(tmp_path / "home"))
    c = load_config(write(tmp_path, '[collection]\ntasks = {demo = ["wave"]}\n')).collection
    assert c.log_dir == tmp_path / "home" / "logs" and c.log_dir_derived
    assert c.fps == 30 and len(c.cameras) == 3 and c.cameras[0].width == 640
    assert [v.name for v in c.vectors] == ["observation.state", "action"]
    assert c.vectors[0].discrete == (6, 13)
    assert c.skew_tolerance == pytest.approx(1 / 58)
    monkeypatch.delenv("EVA_HOME")
    assert default_log_dir({"XDG_DATA_HOME": "/x"}) == Path("/x/eva/logs")
    assert default_log_dir({}) == Path.home() / ".local/share/eva/logs"


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("fps = 1\ntasks = {a = ['t']}", "collection.fps"),
        ("fps = 'x'\ntasks = {a = ['t']}", "collection.fps"),
        ("log_dir = 3\ntasks = {a = ['t']}", "collection.log_dir"),
        ("", "collection.tasks"),
        ("tasks = {a = []}", "collection.tasks.a"),
        ("tasks = {'..' = ['t']}", "collection.tasks..."),
        (
            "tasks = {a = ['t']}\ncameras = [{key = 'front', width = 63, height = 48}]",
            "collection.cameras[0].width",
        ),
        (
            "tasks = {a = ['t']}\ncameras = [{key = '../x', width = 64, height = 48}]",
            "collection.cameras[0].key",
        ),
        (
            "tasks = {a = ['t']}\ncameras = [{key = 'f', width = 64}]",
            "collection.cameras[0].height",
        ),
        (
            "tasks = {a = ['t']}\nvectors = [{name = 's', dim = 3, discrete = [3]}]",
            "collection.vectors[0].discrete",
        ),
        ("tasks = {a = ['t']}\nvectors = [{name = 's'}]", "collection.vectors[0].dim"),
        (
            "tasks = {a = ['t']}\nvectors = [{name = 'timestamp', dim = 1}]",
            "collection.vectors[0].name",
        ),
        ("tasks = {a = ['t']}\nencoder = {codec = 'mpeg2'}", "collection.encoder.codec"),
        ("tasks = {a = ['t']}\nbacklog = {warn_seconds = [-1]}", "collection.backlog.warn_seconds"),
        ("tasks = {a = ['t']}\nbacklog = {max_mb = 3}", "collection.backlog.max_mb"),
        ("tasks = {a = ['t']}\nfrobnicate = 3", "collection.frobnicate"),
        ("tasks = {a = ['t']}\nmin_episode_frames = true", "collection.min_episode_frames"),
    ],
)
def test_invalid_config_names_the_key(tmp_path: Path, body: str, key: str) -> None:
    path = write(tmp_path, "[collection]\n" + body + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message and key in message and "\n" not in message


def test_missing_section_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[collection\]"):
        load_config(write(tmp_path, "[other]\nx = 1\n"))
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(write(tmp_path, "[collection\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_dataset_names_are_sanitised_and_escapes_refused(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, FULL)).collection
    assert c.dataset_dir("my data/set").name == "raw"
    with pytest.raises(ConfigError, match="escape"):
        c.dataset_dir("../../etc")
    with pytest.raises(ConfigError):
        c.dataset_dir("...")
    assert c.dataset_dir("a b").parent.name == "a_b"


RIG = """
[collection]
log_dir = "logs"
[collection.tasks]
pick = ["pick"]
[[collection.cameras]]
key = "observation.images.front"
width = 640
height = 480
source = { kind = "ffmpeg", url = "/dev/video0", format = "v4l2", options = { framerate = "30", video_size = "640x480" } }
[[collection.cameras]]
key = "observation.images.wrist"
width = 64
height = 48
[[collection.vectors]]
name = "observation.state"
dim = 14
source = { kind = "zmq", endpoint = "tcp://127.0.0.1:5601" }
[[collection.vectors]]
name = "action"
dim = 14
source = { kind = "python", object = "my_rig.teleop:Leader", args = { port = "/dev/ttyUSB0" }, stall_timeout_s = 0.5 }
"""


def test_stream_sources(tmp_path: Path) -> None:
    path = tmp_path / "rig.toml"
    path.write_text(RIG)
    cfg = load_config(path).collection
    front, wrist = cfg.cameras
    assert front.source.kind == "ffmpeg" and front.source.url == "/dev/video0"
    assert front.source.format == "v4l2"
    assert front.source.options == {"framerate": "30", "video_size": "640x480"}
    assert front.source.describe() == "ffmpeg /dev/video0 (v4l2)"
    assert wrist.source is None  # the simulator records it
    state, action = cfg.vectors
    assert state.source.kind == "zmq" and state.source.topic == "observation.state"
    assert action.source.object == "my_rig.teleop:Leader"
    assert action.source.args == {"port": "/dev/ttyUSB0"}
    assert action.source.stall_timeout_s == 0.5
    assert state.source.group_key() != action.source.group_key()
    assert front.source.priority == "high"  # the default
    assert state.source.batch_s == 0.02  # the default: one wake-up for a few messages


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ("-0.1", "source.batch_s: must be >= 0.0"),
        ("1.5", "source.batch_s: must be at most half of stall_timeout_s"),
    ],
)
def test_bad_zmq_batch_names_the_key(tmp_path: Path, batch: str, message: str) -> None:
    path = tmp_path / "rig.toml"
    path.write_text(
        "[collection]\n[collection.tasks]\npick = ['p']\n[[collection.vectors]]\n"
        'name = "observation.state"\ndim = 2\n'
        f'source = {{ kind = "zmq", endpoint = "tcp://127.0.0.1:1", batch_s = {batch} }}\n'
    )
    with pytest.raises(ConfigError, match="collection.vectors\\[0\\]") as info:
        load_config(path)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('{ url = "x" }', "source.kind: missing"),
        ('{ kind = "v4l" }', "unknown source kind 'v4l'"),
        ('{ kind = "ffmpeg" }', "source.url: missing"),
        (
            '{ kind = "ffmpeg", url = "x", endpoint = "tcp://a:1" }',
            "source.endpoint: unknown key of a ffmpeg source",
        ),
        ('{ kind = "zmq", endpoint = "tcp://a:1" }', "zmq sources deliver vectors"),
        (
            '{ kind = "python", object = "nocolon" }',
            "source.object: expected 'package.module:Factory'",
        ),
        (
            '{ kind = "ffmpeg", url = "x", options = { a = true } }',
            "source.options.a: expected a string or number",
        ),
        (
            '{ kind = "ffmpeg", url = "x", stall_timeout_s = 0 }',
            "source.stall_timeout_s: must be >=",
        ),
        (
            '{ kind = "ffmpeg", url = "x", priority = "urgent" }',
            "source.priority: expected one of normal, high, realtime",
        ),
    ],
)
def test_bad_sources_name_the_key(tmp_path: Path, source: str, message: str) -> None:
    path = tmp_path / "rig.toml"
    path.write_text(
        "[collection]\n[collection.tasks]\npick = ['p']\n[[collection.cameras]]\n"
        f'key = "observation.images.front"\nwidth = 64\nheight = 48\nsource = {source}\n'
    )
    with pytest.raises(ConfigError, match="collection.cameras\\[0\\]") as info:
        load_config(path)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (
            '[collection]\ntasks = { a = ["t"] }\n[collection.encodr]\ncrf = 20\n',
            "collection.encodr: unknown key (did you mean 'encoder'?)",
        ),
        (
            '[collection]\ntasks = { a = ["t"] }\nfsp = 30\n',
            "collection.fsp: unknown key (did you mean 'fps'?)",
        ),
        (
            '[collection]\ntasks = { a = ["t"] }\n[collection.encoder]\nprest = "fast"\n',
            "collection.encoder.prest: unknown key (did you mean 'preset'?)",
        ),
        (
            '[collection]\ntasks = { a = ["t"] }\n[collection.backlog]\nwarn_second = [1]\n',
            "collection.backlog.warn_second: unknown key (did you mean 'warn_seconds'?)",
        ),
        (
            '[collection]\ntasks = { a = ["t"] }\n[[collection.cameras]]\nkey = "observation.images.a"\n'
            "width = 64\nhieght = 48\n",
            "collection.cameras[0].hieght: unknown key (did you mean 'height'?)",
        ),
        (
            '[collection]\ntasks = { a = ["t"] }\n[[collection.vectors]]\nname = "s"\ndim = 2\n'
            "discret = [1]\n",
            "collection.vectors[0].discret: unknown key (did you mean 'discrete'?)",
        ),
        (
            '[collection]\ntasks = { a = ["t"] }\n[collection.storag.sftp]\nhost = "127.0.0.1"\n',
            "collection.storag: unknown key (did you mean 'storage'?)",
        ),
    ],
)
def test_mistyped_keys_and_tables_are_refused_with_a_suggestion(
    tmp_path: Path, toml: str, needle: str
) -> None:
    path = tmp_path / "eva.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(path)
