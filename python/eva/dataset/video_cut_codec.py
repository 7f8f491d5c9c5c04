"""The codec side of cutting an episode MP4 (``eva.dataset.video_cut``): the capture encoder's
settings read back from the file, and the H.264 parameter-set plumbing a smart cut needs.

The capture encoder's settings are not in ``info.json`` (it records codec and pixel format
only), but x264 writes its whole option string into the first keyframe (an unregistered user
data SEI: ``x264 - core 164 ... - options: cabac=1 ref=1 ... crf=23.0 ...``). The re-encoder
takes the options that decide the bitstream's structure and quality from there (rate control,
GOP, B-frames and pyramid, references, motion search, partitions, psy, AQ, deblocking); a file
without that string (another encoder, HEVC, AV1) gets eva's capture defaults
(``eva.dataset.video.VideoOptions``) with the source's GOP length and B-frame use.

A smart cut keeps the source's SPS/PPS for the copied GOPs and adds the re-encoder's under ids
the source does not use (x264's ``sps-id``, which numbers both), all in one ``avcC``: each
slice names its PPS, so copied and re-encoded GOPs decode side by side with their own headers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from eva.dataset.errors import DatasetError
from eva.dataset.video import VideoOptions

# x264 option-string keys taken as they are (x264_param_parse reads '_' as '-').
_X264_PLAIN = (
    "cabac",
    "ref",
    "me",
    "subme",
    "psy",
    "mixed_ref",
    "me_range",
    "chroma_me",
    "trellis",
    "8x8dct",
    "fast_pskip",
    "bframes",
    "b_pyramid",
    "b_adapt",
    "b_bias",
    "weightb",
    "weightp",
    "keyint",
    "keyint_min",
    "scenecut",
    "rc_lookahead",
    "mbtree",
    "qcomp",
    "qpmin",
    "qpmax",
    "qpstep",
    "ip_ratio",
    "pb_ratio",
    "open_gop",
)
_X264_DIRECT = ("none", "spatial", "temporal", "auto")
# x264's analyse flags (the second number of ``analyse=``) -> partition names
_X264_PARTITIONS = (
    (0x0001, "i4x4"),
    (0x0002, "i8x8"),
    (0x0010, "p8x8"),
    (0x0020, "p4x4"),
    (0x0100, "b8x8"),
)
# profile names as PyAV reports them -> the encoders' profile option
_PROFILES = {
    "Constrained Baseline": "baseline",
    "Baseline": "baseline",
    "Main": "main",
    "High": "high",
}


@dataclass(frozen=True)
class EncoderSettings:
    """How a cut's frames are re-encoded: the encoder, its options, and the most B-frames in a
    row it may emit (its reorder delay is at most that)."""

    codec: str
    options: dict[str, str]
    max_b_frames: int


def encoder_settings(
    codec: str, first_packet: bytes, *, gop: int, b_frames: bool, profile: str | None
) -> EncoderSettings:
    """The capture encoder's settings for a stream of ``codec`` (FFmpeg's decoder name) whose
    first packet is ``first_packet``; ``gop``: the source's keyframe interval in frames."""
    gop = max(1, gop)
    if codec == "h264":
        x264 = _x264_options(first_packet)
        if x264 is not None:
            return _x264_settings(x264, profile)
        options = _x264_defaults(gop, 2 if b_frames else 0)
        return _x264_settings(options, profile)
    if codec == "hevc":
        bframes = 4 if b_frames else 0
        params = f"crf=23:keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}:open-gop=0"
        return EncoderSettings("libx265", {"x265-params": params + ":log-level=error"}, bframes)
    if codec in ("av1", "libdav1d", "libaom-av1"):
        preset = VideoOptions().preset
        return EncoderSettings(
            "libsvtav1",
            {
                "crf": "23",
                "preset": "12" if not preset.isdigit() else preset,
                "g": str(gop),
                "svtav1-params": f"keyint={gop}:scd=0",
            },
            0,
        )
    raise DatasetError(f"cannot re-encode {codec} video (eva cuts H.264, HEVC and AV1)")


def _x264_defaults(gop: int, bframes: int) -> dict[str, str]:
    defaults = VideoOptions()
    return {
        "crf": str(defaults.crf),
        "preset": defaults.preset,
        "keyint": str(gop),
        "keyint_min": str(gop),
        "scenecut": "0",
        "bframes": str(bframes),
        "open_gop": "0",
    }


def _x264_options(packet: bytes) -> dict[str, str] | None:
    """The ``key=value`` options x264 wrote into its version SEI, None without one."""
    at = packet.find(b"x264 - core ")
    if at < 0:
        return None
    marker = packet.find(b" - options: ", at)
    if marker < 0:
        return None
    end = packet.find(b"\x00", marker)
    text = packet[marker + len(b" - options: ") : end if end >= 0 else len(packet)]
    options: dict[str, str] = {}
    for item in text.decode("ascii", "replace").split():
        key, sep, value = item.partition("=")
        if sep:
            options[key] = value
    return options


def _x264_settings(found: dict[str, str], profile: str | None) -> EncoderSettings:
    """x264 options (as its SEI names them) -> the libx264 encoder's options."""
    params = [f"{key.replace('_', '-')}={found[key]}" for key in _X264_PLAIN if key in found]
    if found.get("keyint") == "infinite":
        params = [p for p in params if not p.startswith("keyint=")] + ["keyint=infinite"]
    if found.get("direct", "").isdigit() and int(found["direct"]) < len(_X264_DIRECT):
        params.append(f"direct={_X264_DIRECT[int(found['direct'])]}")
    aq = found.get("aq", "").split(":")
    if len(aq) == 2:
        params += [f"aq-mode={aq[0]}", f"aq-strength={aq[1]}"]
    deblock = found.get("deblock", "").split(":")
    if len(deblock) == 3:
        params.append("no-deblock=1" if deblock[0] == "0" else f"deblock={deblock[1]},{deblock[2]}")
    psy_rd = found.get("psy_rd", "").split(":")
    if len(psy_rd) == 2:
        params.append(f"psy-rd={psy_rd[0]},{psy_rd[1]}")
    partitions = _partitions(found.get("analyse", ""))
    if partitions is not None:
        params.append(f"partitions={partitions}")
    rate = found.get("rc", "crf")
    if rate == "cqp" and "qp" in found:
        params.append(f"qp={found['qp']}")
    else:  # crf, or a bitrate mode re-encoded at eva's default quality
        params.append(f"crf={found.get('crf', str(VideoOptions().crf))}")
    params += ["scenecut=0", "repeat-headers=1"]  # the capture contract; headers in-band
    # x264 does not record its preset: eva's, under every option it did record
    options = {"preset": VideoOptions().preset}
    options["x264-params"] = ":".join(params)
    if profile in _PROFILES:
        options["profile"] = _PROFILES[profile]
    bframes = found.get("bframes", "0")
    return EncoderSettings("libx264", options, int(bframes) if bframes.isdigit() else 16)


def _partitions(analyse: str) -> str | None:
    parts = analyse.split(":")
    if len(parts) != 2:
        return None
    try:
        flags = int(parts[1], 16)
    except ValueError:
        return None
    names = [name for bit, name in _X264_PARTITIONS if flags & bit]
    return ",".join(names) if names else "none"


# --- H.264 parameter sets -------------------------------------------------------------------


@dataclass(frozen=True)
class AvcConfig:
    """An ``avcC`` record: its header fields, parameter sets and the bytes after them."""

    profile: int
    compatibility: int
    level: int
    length_size: int
    sps: tuple[bytes, ...]
    pps: tuple[bytes, ...]
    trailer: bytes

    def with_sets(self, sps: list[bytes], pps: list[bytes]) -> AvcConfig:
        return AvcConfig(
            self.profile,
            self.compatibility,
            self.level,
            self.length_size,
            self.sps + tuple(sps),
            self.pps + tuple(pps),
            self.trailer,
        )

    def encode(self) -> bytes:
        out = bytearray([1, self.profile, self.compatibility, self.level])
        out += bytes([0xFC | (self.length_size - 1), 0xE0 | len(self.sps)])
        for unit in self.sps:
            out += struct.pack(">H", len(unit)) + unit
        out.append(len(self.pps))
        for unit in self.pps:
            out += struct.pack(">H", len(unit)) + unit
        return bytes(out + self.trailer)

    def used_ids(self) -> set[int]:
        """The SPS and PPS ids in use (one pool: x264 numbers both with one id)."""
        return {sps_id(unit) for unit in self.sps} | {pps_id(unit) for unit in self.pps}


def parse_avcc(data: bytes) -> AvcConfig:
    """An ``avcC`` record; ``ValueError`` when it is not one."""
    if len(data) < 7 or data[0] != 1:
        raise ValueError("not an avcC record")
    pos = 5
    sets: list[list[bytes]] = []
    for count_mask in (0x1F, 0xFF):
        count = data[pos] & count_mask
        pos += 1
        units = []
        for _ in range(count):
            (size,) = struct.unpack_from(">H", data, pos)
            units.append(bytes(data[pos + 2 : pos + 2 + size]))
            if pos + 2 + size > len(data):
                raise ValueError("avcC parameter set runs past its end")
            pos += 2 + size
        sets.append(units)
    return AvcConfig(
        data[1],
        data[2],
        data[3],
        (data[4] & 3) + 1,
        tuple(sets[0]),
        tuple(sets[1]),
        bytes(data[pos:]),
    )


def annexb_units(data: bytes) -> list[bytes]:
    """The NAL units of an Annex B byte stream (start-code separated)."""
    units = []
    for chunk in data.split(b"\x00\x00\x01"):
        unit = chunk.rstrip(b"\x00")  # a 4-byte start code's zero; a NAL unit never ends in 0
        if unit:
            units.append(unit)
    return units


def length_prefixed(units: list[bytes]) -> bytes:
    """NAL units as an MP4 sample (4-byte big-endian lengths)."""
    return b"".join(struct.pack(">I", len(unit)) + unit for unit in units)


def sample_units(sample: bytes, length_size: int) -> list[bytes]:
    """The NAL units of an MP4 sample whose lengths take ``length_size`` bytes."""
    units, pos = [], 0
    while pos + length_size <= len(sample):
        size = int.from_bytes(sample[pos : pos + length_size], "big")
        units.append(sample[pos + length_size : pos + length_size + size])
        pos += length_size + size
    return units


def nal_type(unit: bytes) -> int:
    return unit[0] & 0x1F


def sps_id(unit: bytes) -> int:
    """``seq_parameter_set_id`` of an SPS NAL unit (after profile, constraints, level)."""
    return _read_ue(_rbsp(unit[4:12]), 0)[0]


def pps_id(unit: bytes) -> int:
    """``pic_parameter_set_id`` of a PPS NAL unit."""
    return _read_ue(_rbsp(unit[1:9]), 0)[0]


def _rbsp(data: bytes) -> bytes:
    return data.replace(b"\x00\x00\x03", b"\x00\x00")


def _read_ue(data: bytes, bit: int) -> tuple[int, int]:
    """An unsigned Exp-Golomb number at ``bit`` of ``data``: (value, next bit)."""

    def at(i: int) -> int:
        if i >= len(data) * 8:
            raise ValueError("Exp-Golomb number runs past the data")
        return (data[i // 8] >> (7 - i % 8)) & 1

    zeros = 0
    while at(bit + zeros) == 0:
        zeros += 1
    value = 1
    for i in range(zeros):
        value = (value << 1) | at(bit + zeros + 1 + i)
    return value - 1, bit + 2 * zeros + 1
