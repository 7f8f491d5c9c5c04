"""Each format's export options as data: name, type, default, limits and help.

The console builds its format panel from this table and checks a request's options with
:func:`parse_options`, which turns them into the ``ExportOptions`` the pipeline takes (the same
keys ``eva export``'s ``--<format>-*`` options set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from eva.dataset.errors import DatasetError
from eva.dataset.layout import normalize_format
from eva.export.registry import ExportOptions


@dataclass(frozen=True)
class OptionSpec:
    name: str  # key in the request (and in ExportOptions.extra, except copy_videos)
    type: str  # "bool" | "int" | "float" | "choice" | "text"
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    minimum_open: bool = False  # minimum itself is not allowed

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["choices"] = list(self.choices)
        return data


# Options every format takes (``eva export --allow-non-finite``).
COMMON_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "allow_non_finite",
        "bool",
        False,
        "Export NaN/inf values in vector columns as they are (refused by default).",
    ),
)

FORMAT_OPTIONS: dict[str, tuple[OptionSpec, ...]] = {
    "lerobot_v21": (
        OptionSpec("copy_videos", "bool", False, "Copy the MP4s instead of hard-linking them."),
    ),
    "lerobot_v3": (
        OptionSpec(
            "verify_decode",
            "bool",
            False,
            "Decode every frame of every video shard to check the frame counts.",
        ),
        OptionSpec(
            "data_files_size_in_mb",
            "float",
            100.0,
            "Data shard size limit (MB).",
            minimum=0,
            minimum_open=True,
        ),  # fmt: skip
        OptionSpec(
            "video_files_size_in_mb",
            "float",
            200.0,
            "Video shard size limit (MB).",
            minimum=0,
            minimum_open=True,
        ),  # fmt: skip
        OptionSpec(
            "image_quantiles",
            "choice",
            "keyframes",
            "Image quantiles from decoded keyframes, or none.",
            choices=("keyframes", "none"),
        ),
        OptionSpec(
            "image_quantile_keyframes",
            "int",
            1,
            "Keyframes decoded per episode and camera for the quantiles (0 = all).",
            minimum=0,
        ),
    ),
    "hdf5": (
        OptionSpec(
            "hdf5_compression",
            "text",
            "none",
            "none, gzip[:LEVEL] or lzf (compression costs ~50 MB/s per core).",
        ),
        OptionSpec(
            "hdf5_frames_per_chunk",
            "int",
            1,
            "Frames per image chunk (1: cheapest random access).",
            minimum=1,
        ),
    ),
    "mcap": (
        OptionSpec(
            "mcap_compression",
            "choice",
            "none",
            "Chunk compression.",
            choices=("none", "zstd", "lz4"),
        ),
        OptionSpec(
            "mcap_chunk_size",
            "int",
            4 * 1024 * 1024,
            "Uncompressed chunk size (bytes).",
            minimum=1024,
        ),  # fmt: skip
    ),
}
FORMAT_OPTIONS = {fmt: (*specs, *COMMON_OPTIONS) for fmt, specs in FORMAT_OPTIONS.items()}


def _coerce(fmt: str, spec: OptionSpec, value: Any) -> Any:
    where = f"options.{spec.name}"
    if spec.type == "bool":
        if not isinstance(value, bool):
            raise DatasetError(f"{where}: {value!r} is not true or false")
        return value
    if spec.type in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise DatasetError(f"{where}: {value!r} is not a number")
        if spec.type == "int" and not float(value).is_integer():
            raise DatasetError(f"{where}: {value!r} is not an integer")
        number = int(value) if spec.type == "int" else float(value)
        if spec.minimum is not None and (
            number < spec.minimum or (spec.minimum_open and number == spec.minimum)
        ):
            bound = ">" if spec.minimum_open else ">="
            raise DatasetError(f"{where}: {value!r} must be {bound} {spec.minimum:g}")
        return number
    if not isinstance(value, str):
        raise DatasetError(f"{where}: {value!r} is not a string")
    if spec.type == "choice" and value not in spec.choices:
        raise DatasetError(f"{where}: {value!r}: use one of {', '.join(spec.choices)}")
    if spec.name == "hdf5_compression":
        from eva.formats.hdf5 import parse_compression

        try:
            parse_compression(value)
        except ValueError as e:
            raise DatasetError(f"{where}: {e}") from None
    return value


def parse_options(fmt: str, values: Mapping[str, Any] | None) -> ExportOptions:
    """``ExportOptions`` for ``fmt`` from a mapping of option names (unknown names are refused;
    a missing one keeps the format's default). Errors name the option."""
    fmt = normalize_format(fmt)
    specs = {spec.name: spec for spec in FORMAT_OPTIONS[fmt]}
    values = dict(values or {})
    unknown = sorted(set(values) - set(specs))
    if unknown:
        known = ", ".join(specs) or "none"
        raise DatasetError(f"options.{unknown[0]}: not an option of {fmt} (options: {known})")
    parsed = {name: _coerce(fmt, specs[name], value) for name, value in values.items()}
    copy_videos = bool(parsed.pop("copy_videos", False))
    return ExportOptions(link_videos=not copy_videos, extra=parsed)
