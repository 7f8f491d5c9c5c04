"""Export files written past the page cache (``eva.formats._direct_io``): the bytes on disk are
the same with and without ``O_DIRECT``, whatever the sizes, offsets and memory alignment, and a
filesystem that refuses ``O_DIRECT`` gets ordinary writes."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from video_helpers import encode_video, pyav_decode

from eva.formats import _direct_io
from eva.formats._direct_io import ALIGN, PositionedWriter, SequentialWriter, aligned_empty
from eva.formats.hdf5.writer import EpisodeWriter
from eva.formats.options import Hdf5Options

# the I/O tests run no kernel; the HDF5 one converts frames with the native kernel or its reference
io_only = pytest.mark.kernel_independent


def _refuses_o_direct(directory: Path) -> bool:
    probe = directory / ".probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError:
        return True
    finally:
        probe.unlink(missing_ok=True)
    return False


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    if _refuses_o_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT")  # the fallback is tested below
    return tmp_path


@io_only
def test_aligned_empty_is_aligned_and_shaped() -> None:
    for shape in [(1,), (3, 5), (7, 480, 640, 3)]:
        a = aligned_empty(shape)
        assert a.shape == shape and a.flags.c_contiguous and a.ctypes.data % ALIGN == 0
    f = aligned_empty((10, 3), np.float64)
    assert f.dtype == np.float64 and f.ctypes.data % ALIGN == 0


@io_only
@settings(max_examples=40, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(st.integers(0, 3 * ALIGN + 17), st.integers(0, 40_000)), min_size=1, max_size=6
    ),
    buffer_blocks=st.integers(1, 5),
)
def test_sequential_writes_land_byte_exact(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[tuple[int, int]], buffer_blocks: int
) -> None:
    """Writes and file ranges of any size, through a buffer of a few blocks: the file holds
    exactly what was written, in order, both ways."""
    directory = tmp_path_factory.mktemp("seq")
    rng = np.random.default_rng(len(pieces))
    source = directory / "source"
    source.write_bytes(rng.integers(0, 256, 80_000, np.uint8).tobytes())
    source_bytes = source.read_bytes()
    expected = bytearray()
    outputs = {}
    for direct in (True, False):
        path = directory / f"out-{direct}"
        fd = os.open(source, os.O_RDONLY)
        try:
            with SequentialWriter(path, direct=direct, buffer_bytes=buffer_blocks * ALIGN) as out:
                for size, offset in pieces:
                    data = rng.integers(0, 256, size, np.uint8).tobytes()
                    out.write(data)
                    length = min(size, len(source_bytes) - offset)
                    out.copy_from(fd, offset, length)
                    if direct:
                        expected += data + source_bytes[offset : offset + length]
                assert out.tell() == len(expected)
        finally:
            os.close(fd)
        outputs[direct] = path.read_bytes()
        rng = np.random.default_rng(len(pieces))  # the same data for the second pass
        rng.integers(0, 256, 80_000, np.uint8)
    assert outputs[True] == bytes(expected)
    assert outputs[False] == bytes(expected)


@io_only
def test_large_aligned_writes_go_past_the_page_cache(disk_dir: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, 5 * ALIGN * 256 + 123, np.uint8)
    with SequentialWriter(disk_dir / "f", buffer_bytes=64 * ALIGN) as out:
        assert out.direct
        out.write(data.tobytes())
    assert (disk_dir / "f").read_bytes() == data.tobytes()
    # every whole buffer went direct; the unaligned tail through the page cache
    assert out.direct_bytes == len(data) - len(data) % ALIGN


@io_only
@pytest.mark.parametrize("misaligned", [0, 1, 100])
def test_positioned_writes_with_misaligned_memory_and_offsets(
    disk_dir: Path, misaligned: int
) -> None:
    path = disk_dir / "f"
    path.write_bytes(bytes(20 * ALIGN))
    raw = np.random.default_rng(misaligned).integers(0, 256, 3 * ALIGN + 500, np.uint8)
    data = raw[misaligned:]  # memory that is not aligned when misaligned > 0
    expected = bytearray(path.read_bytes())
    with PositionedWriter(path) as writer:
        writer.write_at(2 * ALIGN, data)  # an aligned offset: body direct (copied if needed)
        expected[2 * ALIGN : 2 * ALIGN + len(data)] = data.tobytes()
        writer.write_at(9 * ALIGN + 7, data)  # an unaligned offset: all through the page cache
        expected[9 * ALIGN + 7 : 9 * ALIGN + 7 + len(data)] = data.tobytes()
        assert writer.direct_bytes == len(data) - len(data) % ALIGN
    assert path.read_bytes() == bytes(expected)


@io_only
def test_a_filesystem_refusing_o_direct_gets_ordinary_writes(tmp_path: Path) -> None:
    """/dev/shm (tmpfs) refuses O_DIRECT on older kernels; either way the bytes are right."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = base / f"eva-direct-io-{os.getpid()}"
    data = bytes(range(256)) * 100
    try:
        with SequentialWriter(path, buffer_bytes=ALIGN) as out:
            direct = out.direct
            out.write(data)
        assert path.read_bytes() == data
        assert direct == (not _refuses_o_direct(base))
    finally:
        path.unlink(missing_ok=True)


@io_only
def test_env_switch_turns_it_off(disk_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVA_DIRECT_IO", "0")
    assert not _direct_io.enabled()
    with SequentialWriter(disk_dir / "f") as out:
        out.write(bytes(3 * ALIGN))
        assert not out.direct
    assert out.direct_bytes == 0
    monkeypatch.setenv("EVA_DIRECT_IO", "1")
    assert _direct_io.enabled()


@io_only
def test_a_shrunk_source_is_an_eof_error(disk_dir: Path) -> None:
    source = disk_dir / "s"
    source.write_bytes(bytes(1000))
    fd = os.open(source, os.O_RDONLY)
    try:
        with pytest.raises(EOFError), SequentialWriter(disk_dir / "f") as out:
            out.copy_from(fd, 500, 1000)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("width", "height", "fpc"), [(64, 48, 1), (160, 120, 3), (128, 96, 2)])
def test_hdf5_chunks_written_by_eva_match_hdf5s_own_writes(
    disk_dir: Path, monkeypatch: pytest.MonkeyPatch, width: int, height: int, fpc: int
) -> None:
    """Frame sizes that are and are not multiples of the alignment, several frames a chunk and
    an edge chunk: the file is byte-identical with and without O_DIRECT, and h5py reads back
    every frame the video decodes to."""
    rng = np.random.default_rng(width)
    video = encode_video(
        disk_dir / "cam.mp4", rng.integers(0, 256, (13, height, width, 3), np.uint8)
    )
    rows = 13
    files = {}
    for direct in ("1", "0"):
        monkeypatch.setenv("EVA_DIRECT_IO", direct)
        path = disk_dir / f"ep-{direct}.hdf5"
        with EpisodeWriter(Hdf5Options(frames_per_chunk=fpc, batch_frames=4)) as writer:
            writer.write_episode(
                path,
                columns={"index": np.arange(rows)},
                videos={"observation.images.cam": video},
                metadata={"fps": 30},
                label="episode 0",
            )
        files[direct] = path.read_bytes()
    assert files["1"] == files["0"]
    decoded = pyav_decode(video)
    with h5py.File(disk_dir / "ep-1.hdf5") as h5:
        value = h5["images/item_000000/value"]
        assert value.chunks == (fpc, height, width, 3)
        np.testing.assert_array_equal(value[()], decoded)


@pytest.mark.parametrize("fmt", ["lerobot_v3", "hdf5", "mcap"])
def test_exports_are_the_same_bytes_with_and_without_direct_writes(
    tmp_path: Path, lerobot_fixture_dir: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Every file of the export, direct (the default) and through the page cache (v3 shards then
    go by copy_file_range, MCAP through the staging buffer's plain writes)."""
    from test_golden_exports import export_manifest, judged_fixture_copy

    from eva.export.pipeline import export_dataset

    manifests = {}
    for direct in ("1", "0"):
        root = tmp_path / direct
        root.mkdir()
        source = judged_fixture_copy(root, lerobot_fixture_dir)
        monkeypatch.setenv("EVA_DIRECT_IO", direct)
        export_dataset(source, fmt)
        manifests[direct] = export_manifest(root / "export")
    assert manifests["1"] and manifests["1"] == manifests["0"]


@pytest.mark.parametrize("background", [True, False])
def test_mcap_chunks_are_placed_to_be_written_uncopied(disk_dir: Path, background: bool) -> None:
    """The MCAP writer places each uncompressed chunk's records in memory at the offset from a
    block boundary they have in the file, so the direct writer sends them uncopied; the file is
    the bytes an in-memory stream gets, and the official reader reads it with CRCs checked."""
    import io

    from mcap.reader import make_reader

    from eva.formats.mcap.writer import McapEpisodeWriter

    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (40, 120, 160, 3), np.uint8)
    texts = [rng.bytes(int(n)) for n in rng.integers(1, 3000, 40)]

    def write(stream: object) -> None:
        writer = McapEpisodeWriter(
            stream,  # type: ignore[arg-type]
            compression="none",
            chunk_size=256 * 1024,
            background=background,
        )
        writer.register_schema(1, "eva.Test", "jsonschema", b"{}")
        writer.register_channel(1, "/camera", "msgpack", 1)
        writer.register_channel(2, "/text", "json", 1)
        for i, (frame, text) in enumerate(zip(frames, texts, strict=True)):
            writer.add_ndarray_message(1, i, 1000 + i, 1000 + i, frame)
            writer.add_message(2, i, 1000 + i, 1000 + i, text)
        writer.finish()
        writer.close()

    memory = io.BytesIO()
    write(memory)
    path = disk_dir / "ep.mcap"
    with SequentialWriter(path) as out:
        write(out)
    assert path.read_bytes() == memory.getvalue()
    assert out.uncopied_bytes > 0.9 * frames.nbytes
    with path.open("rb") as f:
        reader = make_reader(f, validate_crcs=True)
        assert sum(1 for _ in reader.iter_messages()) == 80
