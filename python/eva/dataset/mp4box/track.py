"""The sample-table model of ``eva.dataset.mp4box``: the video track's ``VideoTrack`` counts
and ``VideoSamples`` (every packet FFmpeg's demuxer delivers), read from ``moov/trak`` and
checked as the package docstring describes (consistent tables, sample data inside the file, an
edit list that hides nothing).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from eva.dataset.mp4box.boxes import (
    INT32_MAX,
    TABLE_ENTRY_LIMIT,
    U32,
    Box,
    BoxReader,
    Mp4Unsupported,
    child_boxes,
    entry_table,
    full_box_version,
    need_box,
    only_box,
    payload,
    timescale_duration,
)

__all__ = ["CONFIG_BOXES", "SampleEntry", "VideoSamples", "VideoTrack", "video_track_of"]

_ELST_V0 = struct.Struct(">IihH")
_ELST_V1 = struct.Struct(">QqhH")


@dataclass(frozen=True)
class VideoTrack:
    """What the box tables say about the one video track."""

    sample_count: int  # == frames FFmpeg decodes (checked as described in the module doc)
    timescale: int  # mdhd: ticks per second of the media
    duration: int  # mdhd duration, in ``timescale`` ticks
    sample_duration_total: int  # sum of stts deltas, in ``timescale`` ticks
    track_id: int  # tkhd track_ID (0 when tkhd is absent)


@dataclass(frozen=True)
class SampleEntry:
    """The video track's (single) sample description, as stored in ``stsd``."""

    fourcc: bytes  # sample entry type: b"avc1", b"hvc1", b"av01", ...
    width: int  # VisualSampleEntry width / height (pixels)
    height: int
    config_type: bytes | None  # b"avcC" / b"hvcC" / b"av1C" / b"vpcC", None without one
    config: bytes  # that box's payload: what FFmpeg's demuxer hands the decoder as extradata
    # The entry's bytes without its btrt child (per-file bit rates): two entries with equal
    # ``key`` and equal media timescale describe identically configured streams.
    key: bytes


@dataclass(frozen=True, eq=False)
class VideoSamples:
    """The video track's samples as FFmpeg's demuxer delivers them, one per packet, in order.

    Times are FFmpeg's packet timestamps after its edit-list pass. Without ``ctts`` ``pts`` is
    ``dts``; with composition offsets (B-frames) they are given only under an edit list that
    ``read_video_track`` vouches for (one entry, rate 1, ``media_time`` = the first presentation
    time, nothing hidden), which FFmpeg subtracts from both: the first frame is presented at 0 and
    decoded at minus the reorder delay. Checked against PyAV's demuxer packet by packet in tests.
    """

    track: VideoTrack
    entry: SampleEntry
    offsets: np.ndarray  # int64 file offset of each sample's bytes
    sizes: np.ndarray  # int64 byte size of each sample
    dts: np.ndarray  # int64 decode time, in ``track.timescale`` ticks
    pts: np.ndarray  # int64 presentation time (the same array as ``dts`` without ctts)
    durations: np.ndarray  # int64 stts delta of each sample
    keyframes: np.ndarray  # bool: sync sample (every sample when there is no stss)


# Sample entry types whose codec configuration box carries the decoder's parameter sets, so the
# decoder's parameters (size, pixel format) follow from the sample entry alone.
CONFIG_BOXES = {b"avc1": b"avcC", b"hvc1": b"hvcC", b"av01": b"av1C"}
# avc3/hev1 carry the same box, but parameter sets may also come in-band (in the samples), so the
# box alone does not fix the decoder's parameters: read it, but not listed in CONFIG_BOXES.
_CONFIG_BOX_OF = {**CONFIG_BOXES, b"avc3": b"avcC", b"hev1": b"hvcC"}
_VISUAL_SAMPLE_ENTRY_SIZE = 78  # bytes of VisualSampleEntry fields before its child boxes


class _Timing(NamedTuple):
    samples: int
    duration: int  # sum of all deltas
    min_delta: int
    last_delta: int


def _sample_times(reader: BoxReader, stts: Box) -> _Timing:
    """Sample count, total duration and delta extremes from the stts run-length table."""
    count, entries = entry_table(reader, stts, 8)
    samples = duration = last_delta = 0
    min_delta = INT32_MAX
    for run_samples, delta in struct.iter_unpack(">II", entries):
        if delta > INT32_MAX:  # FFmpeg's timestamps are signed: do not second-guess what it does
            raise Mp4Unsupported(f"{reader.path}: stts sample delta {delta}")
        if run_samples:
            samples += run_samples
            duration += run_samples * delta
            min_delta = min(min_delta, delta)
            last_delta = delta
    if duration >= 1 << 62:
        raise Mp4Unsupported(f"{reader.path}: media duration {duration} overflows FFmpeg's clock")
    return _Timing(samples, duration, min_delta, last_delta)


def _check_descriptions(reader: BoxReader, stsd: Box, dinf: Box) -> int:
    """Number of sample descriptions, each of whose data must be in this file: its data reference
    must be a self-contained 'url ' entry (flag 1), what every muxer writes. Samples in another
    file would not be read (FFmpeg does not follow external references by default)."""
    full_box_version(reader, stsd, (0,))
    description_count: int
    (description_count,) = U32.unpack(payload(reader, stsd, 8)[4:8])
    descriptions = child_boxes(reader, Box(b"stsd", stsd.start, stsd.body + 8, stsd.end))
    if description_count == 0 or len(descriptions) != description_count:
        raise Mp4Unsupported(f"{reader.path}: stsd lists {description_count} descriptions")
    dref = need_box(reader, child_boxes(reader, dinf), b"dref", "dinf")
    full_box_version(reader, dref, (0,))
    references = child_boxes(reader, Box(b"dref", dref.start, dref.body + 8, dref.end))
    for description in descriptions:
        if description.end - description.body < 8:
            raise Mp4Unsupported(f"{reader.path}: sample description too short")
        (index,) = struct.unpack(">H", reader.read(description.body + 6, 2))
        if not 1 <= index <= len(references):
            raise Mp4Unsupported(f"{reader.path}: data reference {index} does not exist")
        reference = references[index - 1]
        flags = payload(reader, reference, 4)
        if reference.type != b"url " or flags != b"\x00\x00\x00\x01":
            raise Mp4Unsupported(f"{reader.path}: samples stored outside the file")
    return description_count


def _chunk_runs(
    reader: BoxReader, stsc: Box, chunk_count: int, description_count: int
) -> list[tuple[int, int, int]]:
    """stsc as (first chunk, end chunk, samples per chunk) runs: 0-based, end exclusive.

    Every run must name an existing sample description: FFmpeg drops samples that do not."""
    count, entries = entry_table(reader, stsc, 12)
    firsts = []
    for first, per_chunk, description in struct.iter_unpack(">III", entries):
        if not 1 <= description <= description_count:
            raise Mp4Unsupported(f"{reader.path}: stsc names sample description {description}")
        firsts.append((first - 1, per_chunk))
    runs = []
    for i, (first, per_chunk) in enumerate(firsts):
        end = firsts[i + 1][0] if i + 1 < count else chunk_count
        if not 0 <= first < end <= chunk_count:
            raise Mp4Unsupported(f"{reader.path}: stsc runs out of order or past the chunks")
        runs.append((first, end, per_chunk))
    return runs


def _sample_sizes(reader: BoxReader, box: Box, sample_count: int) -> tuple[int, ...] | int:
    """Per-sample byte sizes from stsz/stz2, or the one size every sample has."""
    if sample_count > TABLE_ENTRY_LIMIT:
        raise Mp4Unsupported(f"{reader.path}: {sample_count} samples")
    head = payload(reader, box, 12)
    if box.type == b"stsz":
        uniform: int
        (uniform,) = U32.unpack(head[4:8])
        if uniform:
            return uniform
        code, width = "I", 4
    else:  # stz2: 4-bit fields are not something a video muxer writes
        code, width = {8: ("B", 1), 16: ("H", 2), 32: ("I", 4)}.get(head[7], ("", 0))
        if not width:
            raise Mp4Unsupported(f"{reader.path}: stz2 field size {head[7]}")
    if box.end - box.body < 12 + sample_count * width:
        raise Mp4Unsupported(f"{reader.path}: {box.type.decode()} table too short")
    return struct.unpack(f">{sample_count}{code}", reader.read(box.body + 12, sample_count * width))


def _chunk_offsets(reader: BoxReader, box: Box) -> tuple[int, ...]:
    width, code = (8, "Q") if box.type == b"co64" else (4, "I")
    count, entries = entry_table(reader, box, width)
    return struct.unpack(f">{count}{code}", entries)


def _check_sample_data(
    reader: BoxReader,
    offsets: tuple[int, ...],
    runs: list[tuple[int, int, int]],
    sizes: tuple[int, ...] | int,
) -> None:
    """Every sample has bytes, all inside the file. FFmpeg drops a sample it cannot read whole,
    so a table damaged to point past the end (or a cut the box sizes do not show) would make the
    sample count larger than the frames that come out."""
    file_size = reader.file_size
    if isinstance(sizes, int):
        for first, end, per_chunk in runs:
            extent = per_chunk * sizes
            if max(offsets[first:end]) + extent > file_size:
                raise Mp4Unsupported(f"{reader.path}: sample data past the end of the file")
        return
    if 0 in sizes:
        raise Mp4Unsupported(f"{reader.path}: empty samples")
    sample = 0
    for first, end, per_chunk in runs:
        for chunk in range(first, end):
            if offsets[chunk] + sum(sizes[sample : sample + per_chunk]) > file_size:
                raise Mp4Unsupported(f"{reader.path}: sample data past the end of the file")
            sample += per_chunk


def _check_edit_list(
    reader: BoxReader,
    elst: Box,
    stbl_boxes: list[Box],
    movie_timescale: int,
    media_timescale: int,
    timing: _Timing,
) -> int:
    """Raise Mp4Unsupported unless FFmpeg's edit-list pass certainly keeps every sample; return
    the edit's ``media_time`` (media ticks), which FFmpeg subtracts from every pts and dts.

    FFmpeg (``mov_fix_index``) rescales the edit into media ticks
    (``end = media_time + round(segment_duration * media_timescale / movie_timescale)``), starts
    at the last keyframe whose decode time is <= ``media_time``, flags samples presented before
    ``media_time`` or at/after ``end`` as discard, and stops adding samples after a keyframe that
    reaches ``end``. Without composition offsets (no ctts, every delta > 0) presentation time ==
    decode time and increases, so one entry with ``media_time`` 0 and rate 1 keeps every sample
    exactly when sample 0 is a keyframe and the last sample starts before ``end``: no sample is
    presented outside [0, end), the start is sample 0, and only the last sample can reach ``end``.
    With composition offsets, ``_check_composition`` checks the same sample by sample.
    """
    version = full_box_version(reader, elst, (0, 1))
    entry = _ELST_V1 if version == 1 else _ELST_V0
    count, entries = entry_table(reader, elst, entry.size)
    if count != 1:
        raise Mp4Unsupported(f"{reader.path}: edit list of {count} entries")
    media_time: int  # the other fields' types follow from their arithmetic with it
    segment_duration, media_time, rate_integer, rate_fraction = entry.unpack(entries)
    # av_rescale: round to nearest, halves away from zero (the values are >= 0 here)
    end = (
        media_time + (segment_duration * media_timescale + movie_timescale // 2) // movie_timescale
    )
    hides = (
        f"{reader.path}: edit list may hide frames (media_time {media_time}, segment_duration "
        f"{segment_duration}/{movie_timescale} s, rate {rate_integer}+{rate_fraction}/65536)"
    )
    if media_time < 0 or (rate_integer, rate_fraction) != (1, 0):
        raise Mp4Unsupported(hides)
    if timing.samples == 0:
        return media_time
    if timing.min_delta == 0:
        raise Mp4Unsupported(f"{reader.path}: edit list over samples of zero duration")
    ctts = only_box(reader, stbl_boxes, b"ctts", "stbl")
    if ctts is None:
        last_start = timing.duration - timing.last_delta
        if media_time != 0 or not last_start < end:
            raise Mp4Unsupported(hides)
        if not _first_sample_is_keyframe(reader, stbl_boxes):
            raise Mp4Unsupported(
                f"{reader.path}: edit list over a track not starting on a keyframe"
            )
        return media_time
    _check_composition(reader, stbl_boxes, ctts, timing.samples, media_time, end, hides)
    return media_time


def _runs(entries: bytes, signed: bool = False) -> np.ndarray:
    """(count, value) run-length entries as an int64 (n, 2) array."""
    return np.frombuffer(entries, ">i4" if signed else ">u4").reshape(-1, 2).astype(np.int64)


def _check_composition(
    reader: BoxReader,
    stbl_boxes: list[Box],
    ctts: Box,
    samples: int,
    media_time: int,
    end: int,
    hides: str,
) -> None:
    """The edit rule with composition offsets (B-frames), sample by sample (numpy, O(samples)).

    Sound when: presentation times are all in [media_time, end) and the first sample is presented
    at media_time (FFmpeg's start search lands on it); sample 0 is the only keyframe decoded at or
    before media_time (the start is sample 0); and FFmpeg's stop (after the second keyframe that
    reaches ``end``, waiting for trailing B-frames) is not before the last sample.
    """
    path = reader.path
    version = full_box_version(reader, ctts, (0, 1))
    offset_runs = _runs(entry_table(reader, ctts, 8)[1], signed=version == 1)
    if int(offset_runs[:, 0].sum()) != samples:
        raise Mp4Unsupported(f"{path}: ctts does not cover the {samples} samples")
    if offset_runs.size and not (
        offset_runs[:, 1].min() >= 0 and offset_runs[:, 1].max() <= INT32_MAX
    ):
        raise Mp4Unsupported(f"{path}: negative composition offsets (FFmpeg shifts decode times)")
    delta_runs = _runs(entry_table(reader, need_box(reader, stbl_boxes, b"stts", "stbl"), 8)[1])
    deltas = np.repeat(delta_runs[:, 1], delta_runs[:, 0])
    decode_times = np.cumsum(deltas) - deltas
    presentation = decode_times + np.repeat(offset_runs[:, 1], offset_runs[:, 0])
    if presentation[0] != media_time or presentation.min() < media_time:
        raise Mp4Unsupported(hides)
    if presentation.max() >= end:
        raise Mp4Unsupported(hides)
    keyframes = _sync_samples(reader, stbl_boxes, samples)
    if keyframes[0] != 0:
        raise Mp4Unsupported(f"{path}: edit list over a track not starting on a keyframe")
    if len(keyframes) > 1 and decode_times[keyframes[1]] <= media_time:
        raise Mp4Unsupported(hides)
    reaching = keyframes[presentation[keyframes] + deltas[keyframes] >= end]
    if len(reaching) >= 2 and reaching[1] != samples - 1:
        raise Mp4Unsupported(hides)


def _sync_samples(reader: BoxReader, stbl_boxes: list[Box], samples: int) -> np.ndarray:
    """0-based keyframe indices from stss, sorted and unique. Without stss every sample is a
    keyframe; with composition offsets that is not a file this parser vouches for."""
    stss = only_box(reader, stbl_boxes, b"stss", "stbl")
    if stss is None:
        raise Mp4Unsupported(f"{reader.path}: composition offsets without a sync sample table")
    numbers = np.frombuffer(entry_table(reader, stss, 4)[1], ">u4").astype(np.int64)
    if not numbers.size or numbers.min() < 1 or numbers.max() > samples:
        raise Mp4Unsupported(f"{reader.path}: stss names no keyframe or samples that do not exist")
    # sorted and deduplicated by hand: np.unique imports numpy.ma on first use (~35 ms)
    numbers = np.sort(numbers)
    return numbers[np.concatenate(([True], numbers[1:] != numbers[:-1]))] - 1


def _first_sample_is_keyframe(reader: BoxReader, stbl_boxes: list[Box]) -> bool:
    stss = only_box(reader, stbl_boxes, b"stss", "stbl")
    if stss is None:
        return True  # no sync sample table: every sample is a keyframe
    full_box_version(reader, stss, (0,))
    count: int
    (count,) = U32.unpack(payload(reader, stss, 8)[4:8])
    return count > 0 and U32.unpack(payload(reader, stss, 12)[8:12])[0] == 1


def video_track_of(
    reader: BoxReader, trak: Box, movie_timescale: int, samples: bool = False
) -> VideoTrack | VideoSamples | None:
    """The track's counts if its handler is 'vide', None for any other track; with ``samples``
    its ``VideoSamples`` (sample entry and every sample's place, time and sync flag)."""
    trak_boxes = child_boxes(reader, trak)
    mdia = need_box(reader, trak_boxes, b"mdia", "trak")
    mdia_boxes = child_boxes(reader, mdia)
    hdlr = need_box(reader, mdia_boxes, b"hdlr", "mdia")
    if payload(reader, hdlr, 12)[8:12] != b"vide":
        return None
    track_id = 0
    tkhd = only_box(reader, trak_boxes, b"tkhd", "trak")
    if tkhd is not None:
        offset = 12 if full_box_version(reader, tkhd, (0, 1)) == 0 else 20
        (track_id,) = U32.unpack(payload(reader, tkhd, offset + 4)[offset : offset + 4])
    timescale, duration = timescale_duration(reader, need_box(reader, mdia_boxes, b"mdhd", "mdia"))
    minf = need_box(reader, mdia_boxes, b"minf", "mdia")
    minf_boxes = child_boxes(reader, minf)
    stbl = need_box(reader, minf_boxes, b"stbl", "minf")
    stbl_boxes = child_boxes(reader, stbl)
    description_count = _check_descriptions(
        reader,
        need_box(reader, stbl_boxes, b"stsd", "stbl"),
        need_box(reader, minf_boxes, b"dinf", "minf"),
    )

    sizes = [box for box in stbl_boxes if box.type in (b"stsz", b"stz2")]
    if len(sizes) != 1:
        raise Mp4Unsupported(f"{reader.path}: {len(sizes)} sample size boxes (stsz/stz2)")
    full_box_version(reader, sizes[0], (0,))
    (sample_count,) = U32.unpack(payload(reader, sizes[0], 12)[8:12])

    timing = _sample_times(reader, need_box(reader, stbl_boxes, b"stts", "stbl"))
    timed_samples = timing.samples
    offsets = [box for box in stbl_boxes if box.type in (b"stco", b"co64")]
    if len(offsets) != 1:
        raise Mp4Unsupported(f"{reader.path}: {len(offsets)} chunk offset boxes (stco/co64)")
    full_box_version(reader, offsets[0], (0,))
    chunk_offsets = _chunk_offsets(reader, offsets[0])
    runs = _chunk_runs(
        reader, need_box(reader, stbl_boxes, b"stsc", "stbl"), len(chunk_offsets), description_count
    )
    chunked_samples = sum((end - first) * per_chunk for first, end, per_chunk in runs)
    if not sample_count == timed_samples == chunked_samples:
        raise Mp4Unsupported(
            f"{reader.path}: sample table disagrees: stsz {sample_count}, stts {timed_samples}, "
            f"stsc/stco {chunked_samples} samples"
        )
    sample_sizes = _sample_sizes(reader, sizes[0], sample_count)
    _check_sample_data(reader, chunk_offsets, runs, sample_sizes)

    media_time: int | None = None  # None: no edit list
    edts = only_box(reader, trak_boxes, b"edts", "trak")
    if edts is not None:
        edts_boxes = child_boxes(reader, edts)
        elst = only_box(reader, edts_boxes, b"elst", "edts")
        if elst is not None:
            media_time = _check_edit_list(
                reader, elst, stbl_boxes, movie_timescale, timescale, timing
            )
        elif edts_boxes:
            raise Mp4Unsupported(f"{reader.path}: edts without elst")
    track = VideoTrack(sample_count, timescale, duration, timing.duration, track_id)
    if not samples:
        return track
    return _samples(
        reader, track, stbl_boxes, description_count, chunk_offsets, runs, sample_sizes, media_time
    )


def _sample_entry(reader: BoxReader, stbl_boxes: list[Box]) -> SampleEntry:
    stsd = need_box(reader, stbl_boxes, b"stsd", "stbl")
    descriptions = child_boxes(reader, Box(b"stsd", stsd.start, stsd.body + 8, stsd.end))
    if len(descriptions) != 1:
        raise Mp4Unsupported(f"{reader.path}: {len(descriptions)} sample descriptions")
    entry = descriptions[0]
    if entry.end - entry.body < _VISUAL_SAMPLE_ENTRY_SIZE:
        raise Mp4Unsupported(f"{reader.path}: visual sample entry too short")
    width, height = struct.unpack(">HH", reader.read(entry.body + 24, 4))
    children = child_boxes(
        reader, Box(entry.type, entry.start, entry.body + _VISUAL_SAMPLE_ENTRY_SIZE, entry.end)
    )
    config_type = _CONFIG_BOX_OF.get(entry.type)
    config_box = (
        only_box(reader, children, config_type, entry.type.decode("latin-1"))
        if (config_type)
        else None
    )
    config = (
        b""
        if config_box is None
        else reader.read(config_box.body, config_box.end - config_box.body)
    )
    key = reader.read(entry.start, entry.body + _VISUAL_SAMPLE_ENTRY_SIZE - entry.start) + b"".join(
        reader.read(child.start, child.end - child.start)
        for child in children
        if child.type != b"btrt"
    )
    return SampleEntry(
        fourcc=entry.type,
        width=width,
        height=height,
        config_type=None if config_box is None else config_type,
        config=config,
        key=key,
    )


def _samples(
    reader: BoxReader,
    track: VideoTrack,
    stbl_boxes: list[Box],
    description_count: int,
    chunk_offsets: tuple[int, ...],
    runs: list[tuple[int, int, int]],
    sample_sizes: tuple[int, ...] | int,
    media_time: int | None,
) -> VideoSamples:
    """Every sample's offset, size, time and sync flag (vectorised over the run tables).

    Times are FFmpeg's packet timestamps: with an edit list (which ``_check_edit_list`` vouched
    hides nothing) FFmpeg shifts pts and dts by its ``media_time``, so the first presented frame
    is at pts 0 and, with B-frames, the first dts is minus the reorder delay."""
    path = reader.path
    if description_count != 1:
        raise Mp4Unsupported(f"{path}: {description_count} sample descriptions")
    ctts = only_box(reader, stbl_boxes, b"ctts", "stbl")
    if ctts is not None and media_time is None:
        # Without an edit list FFmpeg keeps the raw times but may shift them by heuristics
        # (``dts_shift``, ``start_pad``) this parser does not model.
        raise Mp4Unsupported(f"{path}: composition offsets without an edit list")
    n = track.sample_count
    per_chunk = np.zeros(len(chunk_offsets), np.int64)
    for first, end, count in runs:
        per_chunk[first:end] = count
    sizes = (
        np.full(n, sample_sizes, np.int64)
        if isinstance(sample_sizes, int)
        else np.asarray(sample_sizes, np.int64)
    )
    # A sample's offset = its chunk's offset + the sizes of the samples before it in that chunk.
    chunk_of_sample = np.repeat(np.arange(len(chunk_offsets)), per_chunk)
    before = np.cumsum(sizes) - sizes
    chunk_first_sample = np.cumsum(per_chunk) - per_chunk
    offsets = (
        np.asarray(chunk_offsets, np.int64)[chunk_of_sample]
        + before
        - before[chunk_first_sample[chunk_of_sample]]
        if n
        else np.zeros(0, np.int64)
    )
    delta_runs = _runs(entry_table(reader, need_box(reader, stbl_boxes, b"stts", "stbl"), 8)[1])
    durations = np.repeat(delta_runs[:, 1], delta_runs[:, 0])
    dts = np.cumsum(durations) - durations
    if ctts is None:
        pts = dts
    else:  # offsets >= 0 and covering every sample: checked by _check_composition
        version = full_box_version(reader, ctts, (0, 1))
        offset_runs = _runs(entry_table(reader, ctts, 8)[1], signed=version == 1)
        pts = dts + np.repeat(offset_runs[:, 1], offset_runs[:, 0])
    if media_time:
        dts = dts - media_time
        pts = pts - media_time
    keyframes = np.ones(n, bool)
    stss = only_box(reader, stbl_boxes, b"stss", "stbl")
    if stss is not None:
        numbers = np.frombuffer(entry_table(reader, stss, 4)[1], ">u4").astype(np.int64)
        if not numbers.size or numbers.min() < 1 or numbers.max() > n:
            # an empty stss makes FFmpeg guess keyframes with a parser: not a table fact
            raise Mp4Unsupported(f"{path}: stss names no keyframe or samples that do not exist")
        keyframes[:] = False
        keyframes[numbers - 1] = True
    return VideoSamples(
        track=track,
        entry=_sample_entry(reader, stbl_boxes),
        offsets=offsets,
        sizes=sizes,
        dts=dts,
        pts=pts,
        durations=durations,
        keyframes=keyframes,
    )
