"""Is it one rig? The checks ``eva merge`` makes before it writes anything (docs/cli.md).

Sessions join only when everything a trainer (and LeRobot's own merge) assumes to be constant
across a dataset is: the fps, the robot type, every feature's name, dtype, shape and vector
``names``, and, probed from every MP4 of every camera, the codec, its profile, the pixel format,
the resolution and the B-frame layout (whether packets come out of decode order; a camera whose
files mix the two cannot be joined by packet copy: LeRobot's merge fails on it). Each difference
is one line naming both sessions; a session that mixes layouts inside itself is one line naming
its two episodes.

``--map`` renames a feature of a session before the comparison (``Renames``): ``[SESSION:]OLD=NEW``
renames OLD in the session given as SESSION on the command line, or in every session that has
OLD when no session is named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np

from eva.dataset import fsafe, layout, mp4box, video
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader

__all__ = [
    "BOOKKEEPING",
    "CameraLayout",
    "MergeUsageError",
    "Rig",
    "parse_renames",
    "rig_differences",
    "rig_of",
]

# Columns every table has and the merge renumbers: never renamed.
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
# Packets demuxed per file to see the B-frame layout: more than the first GOP's reordering needs.
_LAYOUT_PACKETS = 64


class MergeUsageError(DatasetError):
    """A merge the command line asked for wrongly (exit 2): a bad ``--map``, the same dataset
    twice, an existing or overlapping target."""


@dataclass(frozen=True)
class CameraLayout:
    """What a camera's MP4 files must share for their packets to join one stream."""

    codec: str
    profile: str
    pix_fmt: str
    width: int
    height: int
    b_frames: bool

    def describe(self) -> str:
        frames = "B-frames" if self.b_frames else "no B-frames"
        return f"{self.codec} {self.profile} {self.pix_fmt} {self.width}x{self.height} {frames}"


@dataclass(frozen=True)
class Rig:
    """One session as the merge compares it, after its renames."""

    name: str  # the session as named in messages (its path as given)
    fps: Any
    robot_type: Any
    features: dict[str, dict[str, Any]]  # renamed; a video feature without its "info" block
    cameras: dict[str, dict[int, CameraLayout]]  # renamed video key -> episode -> layout


def _session_for(label: str, roots: Sequence[Path], given: Sequence[str], spec: str) -> int:
    """The position of the source that ``label`` names: as given on the command line, or the
    same directory."""
    for i, name in enumerate(given):
        if label == name:
            return i
    try:
        target = Path(label).resolve(strict=True)
    except OSError:
        target = None
    for i, root in enumerate(roots):
        if target is not None and target == root:
            return i
    raise MergeUsageError(f"--map {spec!r}: {label!r} is not one of the sessions merged")


def parse_renames(
    specs: Sequence[str],
    roots: Sequence[Path],
    given: Sequence[str],
    features: Sequence[Mapping[str, Any]],
) -> list[dict[str, str]]:
    """Each session's renames {old key: new key} from ``--map [SESSION:]OLD=NEW`` options
    (``roots``: the sessions resolved, ``given``: as typed, ``features``: their info.json
    features). A feature key has no ':' or '=' (``layout.check_component``), so the last ':'
    before the '=' ends the session's name."""
    renames: list[dict[str, str]] = [{} for _ in roots]
    for spec in specs:
        left, eq, new = spec.partition("=")
        label, colon, old = left.rpartition(":")
        if not eq or not old or not new:
            raise MergeUsageError(f"--map {spec!r}: write [SESSION:]OLD_KEY=NEW_KEY")
        for key in (old, new):
            try:
                layout.check_component(key, "feature key")
            except layout.UnsafeNameError as e:
                raise MergeUsageError(f"--map {spec!r}: {e}") from None
            if key in BOOKKEEPING:
                raise MergeUsageError(f"--map {spec!r}: {key} is renumbered, not renamed")
        if colon:
            targets = [_session_for(label, roots, given, spec)]
            if old not in features[targets[0]]:
                raise MergeUsageError(f"--map {spec!r}: {given[targets[0]]} has no feature {old}")
        else:
            targets = [i for i, f in enumerate(features) if old in f]
            if not targets:
                raise MergeUsageError(f"--map {spec!r}: no session has a feature {old}")
        for i in targets:
            if old in renames[i]:
                raise MergeUsageError(f"--map {spec!r}: {given[i]}: {old} is renamed twice")
            renamed = {renames[i].get(k, k) for k in features[i] if k != old}
            if new in renamed or new in renames[i].values():
                raise MergeUsageError(f"--map {spec!r}: {given[i]} has a feature {new} already")
            renames[i][old] = new
    return renames


def probe_camera(source: fsafe.Readable, *, b_frames: bool = True) -> CameraLayout:
    """The layout of one MP4 as FFmpeg opens it: codec parameters, and whether the first
    packets' presentation times come out of decode order (B-frames; ``b_frames=False``: not
    demuxed, reported as False, for a caller that knows the order from the sample table)."""
    path = fsafe.name_of(source)
    with video.open_input(source) as container:
        if not container.streams.video:
            raise DatasetError(f"{path}: no video stream")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        if ctx is None:
            raise DatasetError(f"{path}: the video stream has no decoder")
        reordered = False
        latest: int | None = None
        try:
            for n, packet in enumerate(container.demux(stream) if b_frames else ()):
                if n >= _LAYOUT_PACKETS or reordered:
                    break
                if packet.pts is None:
                    continue
                reordered = latest is not None and packet.pts < latest
                latest = packet.pts if latest is None else max(latest, packet.pts)
        except av.error.FFmpegError as e:
            raise DatasetError(f"{path}: demux failed ({e})") from None
        return CameraLayout(
            codec=str(ctx.name),
            profile=str(ctx.profile or "-"),
            pix_fmt=str(ctx.pix_fmt),
            width=int(ctx.width),
            height=int(ctx.height),
            b_frames=reordered,
        )


def camera_layouts(
    reader: DatasetReader, key: str, probes: dict[bytes, CameraLayout] | None = None
) -> dict[int, CameraLayout]:
    """Every episode's layout of camera ``key``. The codec parameters follow from the MP4's
    sample entry (``mp4box``: codec, resolution, and the parameter sets that give profile and
    pixel format), so FFmpeg opens one file per distinct entry (``probes``: the entries probed
    so far, by ``SampleEntry.key``, shared by every camera and session of a merge); the B-frame
    layout of each file is its sample table's presentation order (the validation parses those
    tables). A file the box parser cannot vouch for is opened (and demuxed) by FFmpeg."""
    by_entry = probes if probes is not None else {}
    layouts: dict[int, CameraLayout] = {}
    for ep in reader.episode_indices:
        source = reader.video_file(ep, key)
        try:
            samples = mp4box.read_video_samples(source)
        except mp4box.Mp4Error:
            layouts[ep] = probe_camera(source)
            continue
        params = by_entry.get(samples.entry.key)
        if params is None:
            params = by_entry[samples.entry.key] = probe_camera(source, b_frames=False)
        reordered = bool(np.any(np.diff(samples.pts) < 0))
        layouts[ep] = dataclasses.replace(params, b_frames=reordered)
    return layouts


def rig_of(
    name: str,
    reader: DatasetReader,
    renames: Mapping[str, str],
    probes: dict[bytes, CameraLayout] | None = None,
) -> Rig:
    """Session ``name`` (``reader``'s dataset, its walk validated) as it compares with the
    others; ``probes`` as ``camera_layouts``."""
    features: dict[str, dict[str, Any]] = {}
    for key, feature in reader.features.items():
        kept = {k: v for k, v in feature.items() if not (k == "info" and _is_video(feature))}
        features[renames.get(key, key)] = kept
    cameras: dict[str, dict[int, CameraLayout]] = {}
    for key in reader.video_keys:
        cameras[renames.get(key, key)] = camera_layouts(reader, key, probes)
    return Rig(name, reader.info.get("fps"), reader.info.get("robot_type"), features, cameras)


def _is_video(feature: Mapping[str, Any]) -> bool:
    return feature.get("dtype") == "video"


def rig_differences(rigs: Sequence[Rig]) -> list[str]:
    """One line per difference between each session and the first (and per camera whose files
    mix layouts inside one session); empty when they are one rig."""
    lines = [line for rig in rigs for line in _mixed_layouts(rig)]
    first = rigs[0]
    for other in rigs[1:]:
        pair = f"{first.name} and {other.name}"
        for field in ("fps", "robot_type"):
            a, b = getattr(first, field), getattr(other, field)
            if a != b:
                lines.append(f"{pair}: {field} {a!r} != {b!r}")
        lines += _feature_differences(first, other)
        for key in sorted(set(first.cameras) & set(other.cameras)):
            a_layouts, b_layouts = first.cameras[key], other.cameras[key]
            if a_layouts and b_layouts:
                a_ep, a = next(iter(a_layouts.items()))
                b_ep, b = next(iter(b_layouts.items()))
                if a != b:
                    lines.append(
                        f"{pair}: camera {key}: {a.describe()} (episode {a_ep}) != "
                        f"{b.describe()} (episode {b_ep})"
                    )
    return lines


def _feature_differences(first: Rig, other: Rig) -> list[str]:
    a, b = first.features, other.features
    pair = f"{first.name} and {other.name}"
    lines = []
    for key in [k for k in a if k not in b]:
        lines.append(f"{pair}: feature {key} is in {first.name} only (rename one: --map)")
    for key in [k for k in b if k not in a]:
        lines.append(f"{pair}: feature {key} is in {other.name} only (rename one: --map)")
    for key in [k for k in a if k in b]:
        for field in sorted(set(a[key]) | set(b[key])):
            if a[key].get(field) != b[key].get(field):
                lines.append(
                    f"{pair}: feature {key}: {field} {a[key].get(field)!r} != {b[key].get(field)!r}"
                )
    return lines


def _mixed_layouts(rig: Rig) -> list[str]:
    lines = []
    for key, layouts in rig.cameras.items():
        if not layouts:
            continue
        first_ep, first = next(iter(layouts.items()))
        for ep, other in layouts.items():
            if other != first:
                lines.append(
                    f"{rig.name}: camera {key}: episode {first_ep} is {first.describe()}, "
                    f"episode {ep} is {other.describe()}"
                )
                break
    return lines
