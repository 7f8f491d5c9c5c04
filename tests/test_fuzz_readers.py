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
readers on it (problems or a ``DatasetError``, one line each). The export's binary files too:
HDF5 superblocks, object headers, B-tree and symbol-table nodes and heaps; MCAP summaries,
summary offsets and footers; parquet footers (v3 data and episode metadata, v2.1 episodes):
``eva verify`` passes or exits 1 with lines naming files, never a traceback.

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


# ---- damaged export files: HDF5 structures, MCAP summaries, parquet footers -----------------

HDF5_REGIONS = ["superblock", "object_header", "btree", "symbol_node", "heap"]
MCAP_REGIONS = ["summary", "summary_offsets", "footer"]
PARQUET_REGIONS = ["tail", "footer_metadata"]


def hdf5_structures(path: Path) -> dict[str, list[int]]:
    """Where an HDF5 file's metadata lies: the superblock at 0, every object header (h5py's
    own address of each), the v1 B-tree nodes, symbol-table nodes and local heaps (by their
    signatures; the writer's files hold no v2 structures)."""
    import re

    import h5py

    headers: set[int] = set()
    with h5py.File(path, "r") as h5:
        headers.add(h5py.h5o.get_info(h5["/"].id).addr)
        h5.visititems(lambda _n, obj: headers.add(h5py.h5o.get_info(obj.id).addr))
    data = path.read_bytes()

    def signed(signature: bytes) -> list[int]:
        return [m.start() for m in re.finditer(re.escape(signature), data)]

    return {
        "superblock": [0],
        "object_header": sorted(headers),
        "btree": signed(b"TREE"),
        "symbol_node": signed(b"SNOD"),
        "heap": signed(b"HEAP") + signed(b"GCOL"),
    }


def mcap_structures(path: Path) -> dict[str, list[int]]:
    """The summary section, the summary offsets and the footer record (before the magic)."""
    data = path.read_bytes()
    footer = len(data) - 8 - 29  # opcode, length, summary start, summary offset start, crc
    summary = int.from_bytes(data[footer + 9 : footer + 17], "little")
    offsets = int.from_bytes(data[footer + 17 : footer + 25], "little")
    return {
        "summary": [summary] if 0 < summary < footer else [footer],
        "summary_offsets": [offsets] if 0 < offsets < footer else [footer],
        "footer": [footer],
    }


def parquet_structures(path: Path) -> dict[str, list[int]]:
    """The last 8 bytes (the footer's length and the magic) and the footer metadata."""
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return {"tail": [len(data) - 8], "footer_metadata": [max(0, len(data) - 8 - length)]}


def check_damaged_export(copy: Path, readers: Callable[[], object]) -> None:
    """``eva verify`` passes, or exits 1 with one line per problem, each naming a file of the
    export (an ``eva: error:`` line alone); the format's readers work or raise a one-line
    ``DatasetError`` naming a file. Never a traceback."""
    from click.testing import CliRunner

    from eva.cli import main

    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception}"
    )
    assert result.exit_code in (0, 1), result.output
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr, result.stderr
    if any(line.startswith("eva: error: ") for line in lines):
        assert len(lines) == 1, result.stderr
    for line in lines:
        assert str(copy) in line, f"names no file of the export: {line!r}"
    try:
        readers()
        describe_directory(copy, episodes=True)
    except DatasetError as e:
        assert "\n" not in str(e) and names_a_file(str(e), copy), str(e)


def damaged_copy(
    exported: dict[str, Path],
    fmt: str,
    data: st.DataObject,
    pick: Callable[[Path], Path],
    where: Callable[[Path], list[int]],
) -> contextlib.AbstractContextManager[tuple[Path, Path]]:
    """A moved copy of ``fmt``'s export with the file ``pick`` chooses damaged within 64 bytes
    after one of the offsets ``where`` gives."""

    @contextlib.contextmanager
    def made() -> Iterator[tuple[Path, Path]]:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "accepted"
            shutil.copytree(exported[fmt], copy)
            path = pick(copy)
            raw = path.read_bytes()
            at = data.draw(st.sampled_from(where(path) or [0]))
            path.write_bytes(raw[:at] + data.draw(byte_damage(raw[at:], head=64)))
            yield copy, path

    return made()


def first_file(pattern: str) -> Callable[[Path], Path]:
    return lambda copy: sorted(copy.glob(pattern))[0]


@FUZZ
@given(data=st.data(), region=st.sampled_from(HDF5_REGIONS))
def test_damaged_hdf5_structures(
    exported: dict[str, Path], data: st.DataObject, region: str
) -> None:
    from eva.formats.hdf5.reader import read_episode

    pick = first_file("data/chunk-*/episode_*.hdf5")
    where = lambda path: hdf5_structures(path)[region]  # noqa: E731
    with damaged_copy(exported, "hdf5", data, pick, where) as (copy, path), alarm(HANG_S):
        check_damaged_export(copy, lambda: read_episode(path, load_images=True).close())


@FUZZ
@given(data=st.data(), region=st.sampled_from(MCAP_REGIONS))
def test_damaged_mcap_summaries(
    exported: dict[str, Path], data: st.DataObject, region: str
) -> None:
    from eva.formats.mcap.reader import read_episode

    pick = first_file("data/chunk-*/episode_*.mcap")
    where = lambda path: mcap_structures(path)[region]  # noqa: E731
    with damaged_copy(exported, "mcap", data, pick, where) as (copy, path), alarm(HANG_S):
        check_damaged_export(copy, lambda: read_episode(path))


PARQUET_FILES = [
    ("lerobot_v3", "data/chunk-*/file-*.parquet"),
    ("lerobot_v3", "meta/episodes/chunk-*/file-*.parquet"),
    ("lerobot_v21", "data/chunk-*/episode_*.parquet"),
]


def parquet_readers(fmt: str, copy: Path) -> None:
    """What reads the format's parquet files: v3's episode locators, a v2.1 export's tables."""
    if fmt == "lerobot_v3":
        from eva.formats.lerobot_v3.verify import read_episode_locators

        read_episode_locators(copy)
    else:
        reader = DatasetReader(copy)
        for ep in reader.episode_indices:
            reader.read_table(ep)


@FUZZ
@given(
    data=st.data(),
    region=st.sampled_from(PARQUET_REGIONS),
    file=st.sampled_from(PARQUET_FILES),
)
def test_damaged_parquet_footers(
    exported: dict[str, Path], data: st.DataObject, region: str, file: tuple[str, str]
) -> None:
    fmt, pattern = file
    where = lambda path: parquet_structures(path)[region]  # noqa: E731
    pick = first_file(pattern)
    with damaged_copy(exported, fmt, data, pick, where) as (copy, _), alarm(HANG_S):
        check_damaged_export(copy, lambda: parquet_readers(fmt, copy))
