"""Canary: eva's own MCAP records, read by the official ``mcap`` reader with every CRC checked.

eva serializes its MCAP records itself (``eva.formats.mcap.spec``). A release of ``mcap`` that
read a field elsewhere, or checked something eva does not write, fails here, naming the file and
the check, before any export is handed to a consumer. Each file written below (by every path that
adds messages: one by one, from parts, ndarray maps encoded in place, batch fills by numpy and by
the native chunk kernel; in memory, on disk past the page cache, through ``eva export`` for both
profiles; uncompressed, zstd and lz4) must hold:

- every record type eva writes, and only those;
- chunk CRCs: nonzero, zlib's over the uncompressed records, and accepted by the reader's
  validating paths (``make_reader(validate_crcs=True)``, ``StreamReader(validate_crcs=True)``);
- the data section CRC: 0 ("not computed", which the spec allows: an incremental export
  patches an episode message in place, eva.formats.mcap.renumber), accepted by the validating
  stream reader;
- the summary CRC (which the library does not check): zlib's over the summary section and the
  footer up to it;
- the summary: statistics, channels, schemas and chunk indexes agree with a linear read;
- byte for byte, the file is eva's serialization of what the reader parsed (tests/mcap_rebuild).

The suite runs twice (make test): with the native kernels, then with EVA_PUREPYTHON=1.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap.records import Chunk, DataEnd, Footer, Message, Statistics
from mcap.stream_reader import StreamReader, breakup_chunk
from mcap_rebuild import file_records, rebuilt

from eva.capture.synthetic import write_synthetic_dataset
from eva.dataset.msgpack_codec import encode_ndarray
from eva.formats.mcap import McapEpisodeWriter, spec
from eva.formats.mcap.records import PayloadFill
from eva.formats.mcap.wire import Ragged
from eva.formats.mcap.writer import episode_file

ADAPT = (
    "eva's MCAP records (eva/formats/mcap/spec.py) and the installed mcap "
    f"{__import__('importlib.metadata').metadata.version('mcap')} disagree"
)
# Every record type an eva MCAP file holds.
RECORD_TYPES = {
    "Header",
    "Schema",
    "Channel",
    "Message",
    "MessageIndex",
    "Chunk",
    "DataEnd",
    "Statistics",
    "ChunkIndex",
    "SummaryOffset",
    "Footer",
}
CHANNELS = ((1, "episode"), (2, "episode/image/a"), (3, "vectors"))


def _uncompressed(chunk: Chunk) -> bytes:
    if chunk.compression == "zstd":
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompress(chunk.data, chunk.uncompressed_size))
    if chunk.compression == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(chunk.data))
    assert chunk.compression == "", chunk.compression
    return bytes(chunk.data)


def check_file(data: bytes, name: str) -> list[Message]:
    """Every check of the module docstring on one file's bytes; its messages in file order."""
    where = f"{name}: {ADAPT}"
    records = file_records(data)  # chunks whole
    kinds = Counter(type(r).__name__ for r in records)
    kinds.update(type(r).__name__ for r in records for r in _inner(r))
    assert set(kinds) == RECORD_TYPES, (where, sorted(kinds))
    messages: list[Message] = []
    for chunk in (r for r in records if isinstance(r, Chunk)):
        parsed = breakup_chunk(chunk, validate_crc=True)
        inner = _uncompressed(chunk)
        assert len(inner) == chunk.uncompressed_size, where
        assert chunk.uncompressed_crc != 0 and chunk.uncompressed_crc == zlib.crc32(inner), where
        assert all(isinstance(m, Message) for m in parsed), where
        messages += [m for m in parsed if isinstance(m, Message)]
    # The linear, validating pass (data section CRC, chunk CRCs) reads the same messages.
    stream = StreamReader(io.BytesIO(data), skip_magic=False, validate_crcs=True)
    linear = [r for r in stream.records if isinstance(r, Message)]
    assert [(m.channel_id, m.sequence, m.data) for m in linear] == [
        (m.channel_id, m.sequence, m.data) for m in messages
    ], where
    (data_end,) = [r for r in records if isinstance(r, DataEnd)]
    assert data_end.data_section_crc == 0, where
    _check_summary_crc(data, records, where)
    _check_summary(data, records, messages, where)
    assert rebuilt(data) == data, f"{where}: a record's bytes are not eva's serialization of it"
    return messages


def _inner(record: object) -> list[object]:
    return list(breakup_chunk(record)) if isinstance(record, Chunk) else []


def _check_summary_crc(data: bytes, records: list[object], where: str) -> None:
    (footer,) = [r for r in records if isinstance(r, Footer)]
    footer_at = len(data) - len(spec.MAGIC) - len(spec.footer(0, 0, 0))
    covered = data[footer.summary_start : footer_at + spec.FOOTER_CRC_START]
    assert footer.summary_crc != 0 and footer.summary_crc == zlib.crc32(covered), where
    (stored,) = struct.unpack_from("<I", data, footer_at + spec.FOOTER_CRC_START)
    assert stored == footer.summary_crc, where


def _check_summary(data: bytes, records: list[object], messages: list[Message], where: str) -> None:
    reader = make_reader(io.BytesIO(data), validate_crcs=True)
    summary = reader.get_summary()
    assert summary is not None, where
    (statistics,) = [r for r in records if isinstance(r, Statistics)]
    assert summary.statistics == statistics, where
    counts = Counter(m.channel_id for m in messages)
    assert statistics.message_count == len(messages), where
    assert statistics.channel_message_counts == {c: counts.get(c, 0) for c in summary.channels}, (
        where
    )
    assert statistics.chunk_count == len(summary.chunk_indexes), where
    if messages:
        times = [m.log_time for m in messages]
        assert (statistics.message_start_time, statistics.message_end_time) == (
            min(times),
            max(times),
        ), where
    # Seeking reads through the chunk indexes (CRCs checked) find every message, per topic too.
    seeking = [(c.id, m.sequence, m.data) for _, c, m in reader.iter_messages(log_time_order=False)]
    assert seeking == [(m.channel_id, m.sequence, m.data) for m in messages], where
    for channel in summary.channels.values():
        topic = [m.sequence for _, _, m in reader.iter_messages(topics=[channel.topic])]
        assert len(topic) == counts.get(channel.id, 0), (where, channel.topic)


def _write_every_way(
    stream: io.BytesIO, compression: str, chunk_size: int
) -> list[tuple[int, int, bytes]]:
    """Messages through every adding method of the writer; (channel, sequence, payload) each."""
    writer = McapEpisodeWriter(stream, compression=compression, chunk_size=chunk_size)
    writer.register_schema(1, "eva_client.episode", "jsonschema", b'{"type": "object"}')
    for channel_id, topic in CHANNELS:
        writer.register_channel(channel_id, topic, "messagepack", 1 if channel_id == 1 else 0)
    expected: list[tuple[int, int, bytes]] = []
    writer.add_message(1, 0, 1, 1, b"\x80")
    expected.append((1, 0, b"\x80"))
    rng = np.random.default_rng(7)
    for i in range(1, 40):
        frame = rng.integers(0, 255, (24, 32, 3), np.uint8)
        writer.add_ndarray_message(2, i, 1000 * i, 1000 * i, frame)
        expected.append((2, i, encode_ndarray(frame)))
        parts = [b"head", bytes(rng.integers(0, 255, i, np.uint8)), b"tail"]
        writer.add_message_parts(3, i, 1000 * i, 1000 * i, parts)
        expected.append((3, i, b"".join(parts)))
    count = 30
    datas = [bytes(rng.integers(0, 255, 50 + 40 * (i % 7), np.uint8)) for i in range(count)]
    heads = Ragged.of([b"h%d" % i for i in range(count)])
    tails = Ragged.of([b"t" * (i % 3) for i in range(count)])
    channels = np.full(count, 3, np.int64)
    sequences = np.arange(100, 100 + count)
    times = 50_000 + 10 * np.arange(count)
    fill = PayloadFill(channels, sequences, times, heads, datas, tails)
    writer.add_records(channels, times, fill)
    for i in range(count):
        expected.append((3, 100 + i, b"h%d" % i + datas[i] + b"t" * (i % 3)))
    writer.finish()
    return expected


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
@pytest.mark.parametrize("chunk_size", [1024, 1 << 20])
def test_every_writing_path_reads_back_with_crcs(compression: str, chunk_size: int) -> None:
    stream = io.BytesIO()
    expected = _write_every_way(stream, compression, chunk_size)
    messages = check_file(stream.getvalue(), f"in memory, {compression}, {chunk_size} B chunks")
    assert [(m.channel_id, m.sequence, m.data) for m in messages] == expected


def test_a_file_written_past_the_page_cache(tmp_path: Path) -> None:
    """``episode_file``: chunks placed in their buffers for direct I/O where the filesystem
    allows it (formats/_direct_io), else a plain file."""
    path = tmp_path / "e.mcap"
    frames = [np.full((40, 50, 3), i, np.uint8) for i in range(25)]
    with episode_file(path, chunk_size=1024) as writer:
        writer.register_schema(1, "eva_client.episode", "jsonschema", b"{}")
        writer.register_channel(1, "episode/image/a", "messagepack", 1)
        for i, frame in enumerate(frames):
            writer.add_ndarray_message(1, i, i + 1, i + 1, frame)
    messages = check_file(path.read_bytes(), str(path))
    assert [m.data for m in messages] == [encode_ndarray(f) for f in frames]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """``eva export --format mcap`` of a small synthetic dataset, once per profile and
    compression (the eva-client profile's frames by the msgpack kernel, the foxglove profile's
    by the chunk kernel: or their references under EVA_PUREPYTHON=1)."""
    root = tmp_path_factory.mktemp("mcap-canary")
    raw = write_synthetic_dataset(root / "raw", episodes=2, frames=[24, 17], cameras=2)
    out: dict[str, list[Path]] = {}
    cases = {
        "eva-client-none": ["--mcap-chunk-size", "4096"],
        "eva-client-zstd": ["--mcap-compression", "zstd"],
        "eva-client-lz4": ["--mcap-compression", "lz4", "--mcap-chunk-size", "8192"],
        "foxglove": ["--mcap-profile", "foxglove", "--mcap-chunk-size", "2048"],
    }
    for name, options in cases.items():
        source = root / name / "raw"
        source.parent.mkdir()
        subprocess.run(["cp", "-a", str(raw), str(source)], check=True)
        command = [sys.executable, "-m", "eva.cli", "export", str(source), "--format", "mcap"]
        subprocess.run(
            [*command, "--executor", "serial", "-q", *options],
            check=True,
            env=os.environ.copy(),
        )
        out[name] = sorted((root / name).glob("export/mcap/**/*.mcap"))
    return out


@pytest.mark.parametrize(
    "case", ["eva-client-none", "eva-client-zstd", "eva-client-lz4", "foxglove"]
)
def test_exported_files_read_back_with_crcs(exported: dict[str, list[Path]], case: str) -> None:
    files = exported[case]
    assert len(files) == 2, files
    for path in files:
        assert check_file(path.read_bytes(), str(path))


def test_the_canary_notices_a_wrong_crc() -> None:
    stream = io.BytesIO()
    _write_every_way(stream, "none", 1 << 20)
    data = bytearray(stream.getvalue())
    before_chunk = [spec.MAGIC, spec.header("eva-client", "eva-client")]
    before_chunk.append(spec.schema(1, "eva_client.episode", "jsonschema", b'{"type": "object"}'))
    before_chunk += [spec.channel(c, 1 if c == 1 else 0, t, "messagepack") for c, t in CHANNELS]
    at = sum(map(len, before_chunk))
    assert data[at] == spec.Opcode.CHUNK
    data[at + spec.PREFIX.size + 24] ^= 1  # the chunk's CRC, after its times and size
    with pytest.raises(Exception, match="crc"):
        check_file(bytes(data), "damaged")
