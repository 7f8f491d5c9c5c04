"""Fuzzing the dataset readers: whatever a hostile or damaged dataset holds, every failure is a
``DatasetError`` (or, from the box parser, an ``Mp4Error``) whose one-line message names the file
at fault; never another exception, never a hang.

Each example copies a tiny real dataset (written by eva's writer, PyAV-encoded MP4s), damages one
file, then runs the reader entry points (``validate_dataset`` and the ``DatasetReader``
accessors every command builds on) under an alarm. Damage is structural (a JSON node replaced by
an arbitrary JSON value, a line dropped or duplicated, a parquet column dropped or retyped) or
byte-level (bytes flipped, cut, inserted).

An exported subset handed over is hostile input too: ``test_damaged_export_json`` damages the
JSON metadata of a copied export of each format and runs ``eva verify``'s and ``eva info``'s
readers on it (problems or a ``DatasetError``, one line each).

``make test`` runs a few dozen examples per file kind; ``make fuzz`` sets ``EVA_FUZZ_EXAMPLES``
(default here 25) much higher.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.dataset.mp4box import Mp4Error, read_video_samples
from eva.dataset.reader import DatasetReader
from eva.dataset.validate import validate_dataset
from eva.export.describe import describe_directory
from eva.export.pipeline import export_dataset
from eva.export.verify import verify_export_report
from eva.quality.verdicts import read_episode_rows, review_table

EXAMPLES = int(os.environ.get("EVA_FUZZ_EXAMPLES", "25"))
HANG_S = 20  # an example taking longer than this is a hang
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("EVA_FUZZ_RANDOM") != "1",  # make test: the same cases every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
CAMERA = "observation.images.front"


@pytest.fixture(scope="module")
def pristine() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_dataset(
            Path(tmp) / "raw",
            episodes=2,
            frames=[8, 10],
            cameras=[CAMERA],
            width=32,
            height=24,
            state_dim=3,
            quality=["green", "red"],
            qc_verdicts=["pass", None],
            qc_notes=["ok", None],
            tasks=["pick", "place"],
        )
        yield root


@contextlib.contextmanager
def copy_of(pristine: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "raw"
        shutil.copytree(pristine, root)
        yield root


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def hang(*_: object) -> None:
        raise TimeoutError(f"a reader took more than {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def names_a_file(message: str, root: Path) -> bool:
    """The message names a path in (or the root of) the dataset, or a file by its name."""
    names = {root.name, "info.json", "episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl"}
    names |= {"stats.json", "eva_image_histograms.jsonl", ".parquet", ".mp4"}
    return str(root) in message or any(n in message for n in names)


def exercise(root: Path) -> None:
    """Every reader entry point; each either works or raises a DatasetError naming a file."""
    problems = validate_dataset(root)
    for p in problems:
        assert "\n" not in str(p), f"a multi-line problem: {p!r}"
    reader = DatasetReader(root)
    steps: list[Callable[[], Any]] = [
        lambda: reader.info,
        lambda: reader.fps,
        lambda: reader.features,
        lambda: reader.chunks_size,
        lambda: reader.video_keys,
        lambda: reader.vector_keys,
        lambda: reader.episodes,
        lambda: reader.episode_indices,
        lambda: reader.tasks,
        lambda: reader.episodes_stats,
        lambda: reader.stats,
        lambda: reader.all_image_histograms,
        lambda: reader.total_frames,
        # what qc --list and info show of a review (rows as read, not validated)
        lambda: review_table(read_episode_rows(root)),
        lambda: describe_directory(root, episodes=True),
    ]
    for ep in (0, 1):
        steps += [
            lambda ep=ep: reader.episode(ep),
            lambda ep=ep: reader.length(ep),
            lambda ep=ep: reader.read_table(ep),
            lambda ep=ep: reader.read_vector(ep, "observation.state"),
            lambda ep=ep: reader.count_rows(ep),
            lambda ep=ep: reader.count_frames(ep, CAMERA),
            lambda ep=ep: sum(len(b) for b in reader.iter_frames(ep, CAMERA, batch_size=4)),
        ]
    for step in steps:
        try:
            step()
        except DatasetError as e:
            message = str(e)
            assert message and "\n" not in message, f"not one line: {message!r}"
            assert names_a_file(message, root), f"names no file: {message!r}"


# ---- damage ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)


def nodes(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:6]):
            out += nodes(v, (*path, i))
    return out


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = replaced(value[head], tuple(rest), new)
    return copy


@st.composite
def json_damage(draw: st.DrawFn, doc: Any) -> Any:
    """The document with one node replaced, or one key removed."""
    where = draw(st.sampled_from(nodes(doc)))
    if where and draw(st.booleans()):
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
        if isinstance(parent, dict):
            shrunk = {k: v for k, v in parent.items() if k != where[-1]}
            return replaced(doc, where[:-1], shrunk)
    return replaced(doc, where, draw(json_values))


@st.composite
def byte_damage(draw: st.DrawFn, data: bytes, *, head: int | None = None) -> bytes:
    """Bytes flipped, cut or inserted (within the first ``head`` bytes, if given)."""
    span = max(1, min(len(data), head or len(data)))
    at = draw(st.integers(0, span - 1))
    how = draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
    if how == "flip":
        n = draw(st.integers(1, 8))
        noise = draw(st.binary(min_size=n, max_size=n))
        return data[:at] + noise + data[at + n :]
    if how == "cut":
        return data[:at] + data[at + draw(st.integers(1, 64)) :]
    if how == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    return data[:at]


JSON_FILES = [layout.INFO, layout.STATS]
JSONL_FILES = [layout.EPISODES, layout.TASKS, layout.EPISODES_STATS, layout.IMAGE_HISTOGRAMS]


def dump_json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@FUZZ
@given(data=st.data(), rel=st.sampled_from(JSON_FILES), structural=st.booleans())
def test_damaged_json(pristine: Path, data: st.DataObject, rel: str, structural: bool) -> None:
    with copy_of(pristine) as root:
        path = root / rel
        original = path.read_bytes()
        if structural:
            damaged = dump_json(data.draw(json_damage(json.loads(original))))
        else:
            damaged = data.draw(byte_damage(original))
        path.write_bytes(damaged)
        with alarm(HANG_S):
            exercise(root)


@FUZZ
@given(
    data=st.data(),
    rel=st.sampled_from(JSONL_FILES),
    how=st.sampled_from(["node", "lines", "bytes"]),
)
def test_damaged_jsonl(pristine: Path, data: st.DataObject, rel: str, how: str) -> None:
    with copy_of(pristine) as root:
        path = root / rel
        lines = path.read_bytes().splitlines(keepends=True)
        if how == "node" and lines:
            i = data.draw(st.integers(0, len(lines) - 1))
            row = data.draw(json_damage(json.loads(lines[i])))
            lines[i] = dump_json(row) + b"\n"
            damaged = b"".join(lines)
        elif how == "lines" and lines:
            i = data.draw(st.integers(0, len(lines) - 1))
            op = data.draw(st.sampled_from(["drop", "duplicate", "swap", "blank"]))
            if op == "drop":
                del lines[i]
            elif op == "duplicate":
                lines.insert(i, lines[i])
            elif op == "swap":
                lines[0], lines[i] = lines[i], lines[0]
            else:
                lines[i] = b"\n"
            damaged = b"".join(lines)
        else:
            damaged = data.draw(byte_damage(b"".join(lines)))
        path.write_bytes(damaged)
        with alarm(HANG_S):
            exercise(root)


PARQUET_TYPES = [
    pa.string(),
    pa.float32(),
    pa.float64(),
    pa.int32(),
    pa.int64(),
    pa.bool_(),
    pa.list_(pa.string()),
    pa.list_(pa.float32()),
    pa.list_(pa.float64(), 2),
]


def retyped(column: pa.ChunkedArray, to: pa.DataType) -> pa.Array:
    """The column as ``to``: a cast where arrow can, else nulls of that type."""
    try:
        return column.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return pa.nulls(len(column), to)


@FUZZ
@given(data=st.data(), ep=st.sampled_from([0, 1]), how=st.sampled_from(["schema", "bytes"]))
def test_damaged_parquet(pristine: Path, data: st.DataObject, ep: int, how: str) -> None:
    with copy_of(pristine) as root:
        path = DatasetReader(root).data_path(ep)
        if how == "schema":
            table = pq.read_table(path)
            name = data.draw(st.sampled_from(table.column_names))
            op = data.draw(st.sampled_from(["drop", "retype", "rows"]))
            if op == "drop":
                table = table.drop_columns([name])
            elif op == "retype":
                to = data.draw(st.sampled_from(PARQUET_TYPES))
                i = table.column_names.index(name)
                table = table.set_column(i, name, retyped(table.column(name), to))
            else:
                keep = data.draw(st.integers(0, max(0, table.num_rows - 1)))
                table = table.slice(0, keep)
            pq.write_table(table, path)
        else:
            path.write_bytes(data.draw(byte_damage(path.read_bytes())))
        with alarm(HANG_S):
            exercise(root)


@FUZZ
@given(data=st.data(), ep=st.sampled_from([0, 1]))
def test_damaged_mp4_boxes(pristine: Path, data: st.DataObject, ep: int) -> None:
    with copy_of(pristine) as root:
        path = DatasetReader(root).video_path(ep, CAMERA)
        raw = path.read_bytes()
        moov = raw.find(b"moov")
        # the box headers and the sample tables: where a parser can be led astray
        region = data.draw(st.sampled_from(["head", "moov"])) if moov > 0 else "head"
        if region == "moov":
            damaged = raw[: moov - 4] + data.draw(byte_damage(raw[moov - 4 :], head=2048))
        else:
            damaged = data.draw(byte_damage(raw, head=64))
        path.write_bytes(damaged)
        with alarm(HANG_S):
            with contextlib.suppress(Mp4Error):
                read_video_samples(path)
            exercise(root)


EXPORT_FORMATS = ["lerobot_v21", "lerobot_v3", "hdf5", "mcap"]
EXPORT_JSON = [layout.INFO, layout.QUALITY_SPLIT, layout.EPISODES, layout.TASKS]


@pytest.fixture(scope="module")
def exported(pristine: Path) -> Iterator[dict[str, Path]]:
    """The accepted subset of each format, exported once from a copy of ``pristine``."""
    with copy_of(pristine) as root:
        yield {fmt: export_dataset(root, fmt).accepted_dir for fmt in EXPORT_FORMATS}


@FUZZ
@given(data=st.data(), fmt=st.sampled_from(EXPORT_FORMATS), rel=st.sampled_from(EXPORT_JSON))
def test_damaged_export_json(
    exported: dict[str, Path], data: st.DataObject, fmt: str, rel: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "accepted"  # a moved copy: checked on its own
        shutil.copytree(exported[fmt], copy)
        path = copy / rel
        if rel.endswith(".jsonl"):
            lines = path.read_bytes().splitlines(keepends=True)
            i = data.draw(st.integers(0, len(lines) - 1))
            lines[i] = dump_json(data.draw(json_damage(json.loads(lines[i])))) + b"\n"
            path.write_bytes(b"".join(lines))
        else:
            path.write_bytes(dump_json(data.draw(json_damage(json.loads(path.read_bytes())))))
        with alarm(HANG_S):
            for p in verify_export_report(copy).problems:
                assert p.message and "\n" not in p.message, f"not one line: {p!r}"
            try:
                describe_directory(copy, episodes=True)
            except DatasetError as e:
                assert "\n" not in str(e) and names_a_file(str(e), copy), str(e)
