"""Each format's options: one frozen dataclass per format, every default stated once.

They live together in this light module (no format imported) so that ``eva export``'s
``--<format>-*`` options and the console's format panel are generated from them without loading
h5py or PyAV; each format package re-exports its own class (``eva.formats.hdf5.Hdf5Options``).
See ``eva.formats.base`` for how an option field is declared and checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from eva.dataset.errors import DatasetError
from eva.formats.base import OptionError, Options, Pairs, option

_MB_HELP = "MB; a shard is closed before it would pass it"
# The largest shard size limit (1 TiB): past it a limit is a typing mistake.
MAX_SHARD_MB = 1_048_576.0
# Keyframes per episode and camera the v3 image quantiles may decode (0: all of them).
MAX_QUANTILE_KEYFRAMES = 10_000


# The training video profile (eva.formats._training_video): LeRobot's own encoder settings, as
# lerobot-record writes (LeRobot 0.4.4 encode_video_frames, 0.6 VideoEncoderConfig defaults).
VIDEO_PROFILES = ("archive", "training")
VIDEO_CODECS = ("libsvtav1", "libx264")
LEROBOT_CRF = 30
# The highest CRF each codec takes.
MAX_CRF = {"libsvtav1": 63, "libx264": 51}


@dataclass(frozen=True)
class VideoProfileOptions(Options):
    """The LeRobot formats' video profile: the recorded MP4s packet-copied, or re-encoded for
    random access in training (``eva.formats._training_video``)."""

    video_profile: str = option(
        "archive",
        choices=VIDEO_PROFILES,
        help="archive: the recorded video packet-copied (default); training: each camera "
        "re-encoded with a keyframe every 2 frames, as lerobot-record writes (fast random "
        "access, a smaller PSNR loss).",
    )
    video_codec: str = option(
        "libsvtav1",
        choices=VIDEO_CODECS,
        help="training: the encoder (libsvtav1 at LeRobot's preset 12, or libx264).",
    )
    video_crf: int = option(
        LEROBOT_CRF,
        minimum=0,
        maximum=max(MAX_CRF.values()),
        help="training: the encoder's CRF (LeRobot's default 30; lower is better quality and "
        "larger files; libx264 takes up to 51).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.video_crf > MAX_CRF[self.video_codec]:
            limit = MAX_CRF[self.video_codec]
            raise OptionError("video_crf", f"{self.video_crf} is past {self.video_codec}'s {limit}")
        if self.video_profile == "archive" and (
            self.video_codec != VIDEO_CODECS[0] or self.video_crf != LEROBOT_CRF
        ):
            # Named after the profile: the CLI checks each flag alone, and refuses a flag only
            # for an error naming that flag (this one is a combination, refused when built).
            raise OptionError(
                "video_profile", "video_codec and video_crf need the training profile"
            )


@dataclass(frozen=True)
class LeRobotV21Options(VideoProfileOptions):
    copy_videos: bool = option(
        False, help="copy MP4s instead of hard-linking (or cloning) the read-only source files."
    )


@dataclass(frozen=True)
class LeRobotV3Options(VideoProfileOptions):
    """The v3-specific knobs (same names as in info.json)."""

    verify_decode: bool = option(
        False,
        help="decode every frame of every video shard to check the frame counts (and compute "
        "exact image quantiles); by default the MP4 samples are counted without decoding.",
    )
    data_files_size_in_mb: float = option(
        100.0,
        flag="--data-file-size-mb",
        minimum=0,
        minimum_open=True,
        maximum=MAX_SHARD_MB,
        help=f"data shard size limit, over the episodes' source parquet files ({_MB_HELP}).",
    )
    video_files_size_in_mb: float = option(
        200.0,  # LeRobot 0.4.4's default
        flag="--video-file-size-mb",
        minimum=0,
        minimum_open=True,
        maximum=MAX_SHARD_MB,
        help=f"video shard size limit, over the episodes' source MP4s ({_MB_HELP}).",
    )
    # Without a sample, image features get no quantiles (LeRobot normalises images by mean/std
    # or not at all; quantiles matter for state/action).
    image_quantiles: str = option(
        "keyframes",
        choices=("keyframes", "none"),
        help="image quantiles from the decoded keyframes, or none (faster).",
    )
    # One keyframe per episode and camera: the decode (~1-2 ms per 320x240 keyframe, more for
    # larger frames) then costs O(episodes), not O(frames), and stays hidden behind the copy.
    image_quantile_keyframes: int = option(
        1,
        minimum=0,
        maximum=MAX_QUANTILE_KEYFRAMES,
        help="keyframes decoded per episode and camera for the image quantiles (evenly spread; "
        "0 = every keyframe).",
    )
    chunks_size: int = 1000  # file_index wraps to the next chunk folder after this many files

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunks_size < 1:
            raise OptionError("chunks_size", f"{self.chunks_size!r} must be >= 1")


def parse_compression(text: str | None) -> tuple[str | None, int | None]:
    """``none`` | ``gzip[:level]`` | ``lzf`` -> (h5py compression name or None, level or None)."""
    if text is None:
        return None, None
    value = str(text).strip().lower()
    if value in ("", "none", "off", "no"):
        return None, None
    name, _, level_text = value.partition(":")
    if name == "lzf" and not level_text:
        return "lzf", None
    if name == "gzip":
        if not level_text:
            return "gzip", 4
        if level_text.isdigit() and 0 <= int(level_text) <= 9:
            return "gzip", int(level_text)
        raise DatasetError(f"hdf5 compression {text!r}: gzip level must be 0-9")
    raise DatasetError(f"hdf5 compression {text!r}: choose none, gzip[:level] or lzf")


# Upper bound of one HDF5 batch buffer (two are in use per camera being written).
MAX_BATCH_BYTES = 32 << 20
# HDF5 chunks hold less than 4 GiB (a chunk's size is a 32-bit number in the file); the writer
# refuses frames_per_chunk x frame bytes past it, naming the option.
HDF5_MAX_CHUNK_BYTES = (4 << 30) - 1
# Frames per chunk: a chunk is read whole to get one frame, and two batches of whole chunks are
# held per camera; 256 frames of 640x480 are 236 MB.
MAX_FRAMES_PER_CHUNK = 256


# The HDF5 layouts (eva.formats.hdf5): eva's own, ALOHA/ACT's episode files, robomimic's one file.
HDF5_LAYOUTS = ("eva", "aloha", "robomimic")
# A name --hdf5-map gives a feature: one HDF5 link name (no "/"), not "." or "..".
_HDF5_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class Hdf5Options(Options):
    compression: str = option(
        "none",
        name="hdf5_compression",
        text=True,
        metavar="none|gzip[:LEVEL]|lzf",
        help="image/column compression (none is fastest; gzip and lzf are ~50 MB/s/core).",
    )
    frames_per_chunk: int = option(
        1,
        name="hdf5_frames_per_chunk",
        minimum=1,
        maximum=MAX_FRAMES_PER_CHUNK,
        help="frames per image chunk (1: cheapest random access; more: fewer I/O calls and "
        "better compression, but one frame reads its whole chunk).",
    )
    layout: str = option(
        "eva",
        name="hdf5_layout",
        choices=HDF5_LAYOUTS,
        help="eva: one file per episode with every key (default); aloha: ALOHA/ACT's "
        "episode_<i>.hdf5 files; robomimic: one data.hdf5 per subset (docs/formats.md).",
    )
    feature_map: Pairs = option(
        (),
        name="hdf5_map",
        metavar="FEATURE=NAME",
        help="aloha/robomimic: the name a feature gets (aloha: qpos, qvel, effort, action, a "
        "camera's name, else /observations/extra/NAME; robomimic: its obs key, or actions); "
        "repeatable; default names in docs/formats.md.",
    )
    valid_fraction: float = option(
        0.1,
        name="hdf5_valid_fraction",
        flag="--valid-fraction",
        minimum=0,
        maximum=1,
        help="robomimic: the share of demos in the mask/valid filter key (chosen by source "
        "episode index, evenly spread; the rest are mask/train).",
    )
    # Frames decoded before a write; rounded up to whole chunks. Bounds memory per camera.
    batch_frames: int = 32
    # Use the native yuv420p -> rgb24 conversion (identical to PyAV's) when the core is built.
    native_convert: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            parse_compression(self.compression)
        except DatasetError as e:
            raise OptionError("hdf5_compression", str(e)) from None
        if self.batch_frames < 1:
            raise OptionError("batch_frames", f"{self.batch_frames!r} must be >= 1")
        self._check_map()

    def _check_map(self) -> None:
        """--hdf5-map: a trainer layout's, each name a plain HDF5 name given to one feature."""
        if self.feature_map and self.layout == "eva":
            feature = self.feature_map[0][0]
            raise OptionError(  # a combination: named by the layout, which decides
                "hdf5_layout",
                f"{self.layout} keeps every key as it is: --hdf5-map {feature}=... is for "
                "aloha or robomimic",
            )
        named: dict[str, str] = {}
        for feature, name in self.feature_map:
            if not _HDF5_NAME.fullmatch(name) or name in (".", ".."):
                raise OptionError(
                    "hdf5_map", f"{feature}: {name!r} is not a name (letters, digits, _ . -)"
                )
            if name in named:
                raise OptionError(
                    "hdf5_map", f"{feature}: {name!r} is already the name of {named[name]}"
                )
            named[name] = feature

    @property
    def h5py_compression(self) -> str | None:
        """h5py's compression filter name (None: raw chunks)."""
        return parse_compression(self.compression)[0]

    @property
    def compression_level(self) -> int | None:
        return parse_compression(self.compression)[1]

    def batch_length(self, frame_bytes: int) -> int:
        """Frames per batch buffer: whole chunks, ``batch_frames`` rounded up, but at most
        ``MAX_BATCH_BYTES`` (large frames get fewer frames per batch; never less than a chunk)."""
        fpc = self.frames_per_chunk
        chunks = max(1, -(-self.batch_frames // fpc))
        chunks_fitting = MAX_BATCH_BYTES // max(1, frame_bytes * fpc)
        return max(1, min(chunks, chunks_fitting)) * fpc


@dataclass(frozen=True)
class McapOptions(Options):
    """The MCAP knobs; ``eva.formats.mcap.writer`` takes its defaults and limits from here."""

    COMPRESSIONS: ClassVar[tuple[str, ...]] = ("none", "zstd", "lz4")
    PROFILES: ClassVar[tuple[str, ...]] = ("eva-client", "foxglove")
    MIN_CHUNK_SIZE: ClassVar[int] = 1024
    # The writer holds a chunk's buffer in memory (eva.formats.mcap.writer).
    MAX_CHUNK_SIZE: ClassVar[int] = 256 << 20

    compression: str = option(
        "none",
        name="mcap_compression",
        choices=COMPRESSIONS,
        help="chunk compression (none: frames come from lossy MP4s; zstd for size).",
    )
    chunk_size: int = option(
        4 * 1024 * 1024,
        name="mcap_chunk_size",
        minimum=MIN_CHUNK_SIZE,
        maximum=MAX_CHUNK_SIZE,
        help="uncompressed chunk size in bytes.",
    )
    # frames decoded per camera per batch, two batches per camera (one decoded while the other is
    # written); small batches stay in the caches between the conversion and the copy into a
    # chunk (4 episodes of 640x480: 32 -> 4 frames, 5.16 -> 4.91 s)
    batch_size: int = 4
    profile: str = option(
        "eva-client",
        name="mcap_profile",
        choices=PROFILES,
        help="eva-client: MessagePack frames for eva/openpi clients; foxglove: the MP4s' H.264 "
        "as foxglove.CompressedVideo plus JSON vectors, viewable in Foxglove (needs the "
        "foxglove extra).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 1:
            raise OptionError("batch_size", f"{self.batch_size!r} must be >= 1")
        if self.profile == "foxglove" and missing_foxglove_modules():
            raise OptionError("mcap_profile", FOXGLOVE_EXTRA_MISSING)


# What the foxglove MCAP profile imports (the ``foxglove`` extra): checked when the option is
# given, so that a missing extra is refused before an export job starts.
FOXGLOVE_MODULES = ("foxglove_schemas_protobuf", "mcap_protobuf")
FOXGLOVE_EXTRA_MISSING = (
    "foxglove needs the foxglove extra (pip install 'eva[foxglove]': "
    "foxglove-schemas-protobuf, mcap-protobuf-support)"
)


def missing_foxglove_modules() -> list[str]:
    """The modules of ``FOXGLOVE_MODULES`` that cannot be imported (found, not imported)."""
    import importlib.util

    missing = []
    for name in FOXGLOVE_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing; a None entry in sys.modules
            found = False
        if not found:
            missing.append(name)
    return missing


@dataclass(frozen=True)
class ZarrOptions(Options):
    """The zarr knobs (``eva.formats.zarr``): how the camera arrays are stored."""

    COMPRESSORS: ClassVar[tuple[str, ...]] = ("none", "zstd")
    MAX_LEVEL: ClassVar[int] = 9  # Blosc's levels are 1-9 (0 stores the bytes as they are)

    # none by default, as for HDF5 and MCAP: the frames come from lossy MP4s, and Blosc/zstd on
    # decoded frames costs more CPU than the decode itself.
    image_compressor: str = option(
        "none",
        name="zarr_image_compressor",
        choices=COMPRESSORS,
        help="camera chunk compressor: none (fastest), or zstd (Blosc with zstd, byte shuffle).",
    )
    compression_level: int = option(
        3,
        name="zarr_compression_level",
        minimum=1,
        maximum=MAX_LEVEL,
        help="the zstd level of --zarr-image-compressor zstd (1 fastest, 9 smallest).",
    )
    # Frames decoded per camera before they are written: bounds memory per camera.
    batch_frames: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_frames < 1:
            raise OptionError("batch_frames", f"{self.batch_frames!r} must be >= 1")
