"""The typed format options: one dataclass per format, and `eva export`'s options made from them."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from eva.cli import main
from eva.dataset.errors import DatasetError
from eva.formats import catalog
from eva.formats.base import ExportOptions, OptionError
from eva.formats.catalog import check_format_module
from eva.formats.options import (
    Hdf5Options,
    LeRobotV3Options,
    LeRobotV21Options,
    McapOptions,
)

pytestmark = pytest.mark.kernel_independent

# Every per-format option `eva export` had before its options were generated: flag -> (request
# name, click type name, default). Scripts use these spellings.
EXPECTED_OPTIONS = {
    "--copy-videos": ("copy_videos", "boolean", False),
    # one flag for both LeRobot formats (declared once, eva.formats.options.VideoProfileOptions)
    "--video-profile": ("video_profile", "choice", "archive"),
    "--video-codec": ("video_codec", "choice", "libsvtav1"),
    "--video-crf": ("video_crf", "integer range", 30),
    "--mcap-compression": ("mcap_compression", "choice", "none"),
    "--mcap-chunk-size": ("mcap_chunk_size", "integer range", 4 * 1024 * 1024),
    "--mcap-profile": ("mcap_profile", "choice", "eva-client"),
    "--hdf5-compression": ("hdf5_compression", "text", "none"),
    "--hdf5-frames-per-chunk": ("hdf5_frames_per_chunk", "integer range", 1),
    "--hdf5-layout": ("hdf5_layout", "choice", "eva"),
    "--hdf5-map": ("hdf5_map", "text", ()),
    "--valid-fraction": ("hdf5_valid_fraction", "float range", 0.1),
    "--verify-decode": ("verify_decode", "boolean", False),
    "--data-file-size-mb": ("data_files_size_in_mb", "float range", 100.0),
    "--video-file-size-mb": ("video_files_size_in_mb", "float range", 200.0),
    "--image-quantiles": ("image_quantiles", "choice", "keyframes"),
    "--image-quantile-keyframes": ("image_quantile_keyframes", "integer range", 1),
    "--zarr-image-compressor": ("zarr_image_compressor", "choice", "none"),
    "--zarr-compression-level": ("zarr_compression_level", "integer range", 3),
    "--allow-non-finite": ("allow_non_finite", "boolean", False),
}


def export_params() -> dict[str, click.Option]:
    command = main.get_command(click.Context(main), "export")
    assert command is not None
    return {
        flag: param
        for param in command.params
        if isinstance(param, click.Option)
        for flag in param.opts
    }


def test_generated_cli_options_keep_their_names_types_and_defaults() -> None:
    params = export_params()
    for flag, (name, type_name, default) in EXPECTED_OPTIONS.items():
        param = params[flag]
        assert (param.name, param.type.name, param.default) == (name, type_name, default), flag
    assert params["--mcap-compression"].type.choices == ("none", "zstd", "lz4")  # type: ignore[attr-defined]
    assert params["--image-quantiles"].type.choices == ("keyframes", "none")  # type: ignore[attr-defined]
    assert params["--copy-videos"].is_flag and params["--verify-decode"].is_flag
    # every option of every dataclass is on the command, and nothing else is added
    generated = {
        f.flag
        for cls in (*(e.options for e in catalog.entries()), ExportOptions)
        for f in cls.option_fields()
    }
    assert generated == set(EXPECTED_OPTIONS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hdf5-compression", "zip"], "hdf5 compression 'zip': choose none, gzip[:level] or lzf"),
        (["--hdf5-compression", "gzip:12"], "gzip level must be 0-9"),
        (["--hdf5-frames-per-chunk", "0"], "--hdf5-frames-per-chunk"),
        (["--mcap-compression", "brotli"], "--mcap-compression"),
        (["--data-file-size-mb", "0"], "--data-file-size-mb"),
    ],
)
def test_bad_option_is_refused_before_anything_runs(
    tmp_path: object, args: list[str], message: str
) -> None:
    # an empty directory: refused before the source is read (it is no dataset)
    result = CliRunner().invoke(main, ["export", str(tmp_path), "--format", "h5", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_each_dataclass_checks_its_values_naming_the_option() -> None:
    for make, name in [
        (lambda: LeRobotV3Options(data_files_size_in_mb=0), "data_files_size_in_mb"),
        (lambda: LeRobotV3Options(image_quantiles="all"), "image_quantiles"),
        (lambda: LeRobotV3Options(image_quantile_keyframes=-1), "image_quantile_keyframes"),
        (lambda: LeRobotV3Options(chunks_size=0), "chunks_size"),
        (lambda: LeRobotV3Options(video_profile="fast"), "video_profile"),
        (lambda: LeRobotV3Options(video_crf=20), "video_profile"),  # archive: no CRF
        (
            lambda: LeRobotV3Options(video_profile="training", video_codec="libx264", video_crf=52),
            "video_crf",
        ),
        (lambda: Hdf5Options(compression="zstd"), "hdf5_compression"),
        (lambda: Hdf5Options(batch_frames=0), "batch_frames"),
        (lambda: McapOptions(compression="gzip"), "mcap_compression"),
        (lambda: McapOptions(chunk_size=10), "mcap_chunk_size"),
    ]:
        with pytest.raises(OptionError, match=rf"^options\.{name}: ") as refused:
            make()
        assert refused.value.option == name
    assert Hdf5Options("gzip:2").h5py_compression == "gzip"
    assert Hdf5Options("gzip:2").compression_level == 2
    assert Hdf5Options().h5py_compression is None


def test_options_for_another_format_are_refused() -> None:
    options = ExportOptions(format=McapOptions())
    assert options.format_options(McapOptions) is options.format
    assert ExportOptions().format_options(LeRobotV21Options) == LeRobotV21Options()
    with pytest.raises(DatasetError, match="McapOptions given to an export that takes"):
        options.format_options(Hdf5Options)


def test_every_format_module_satisfies_the_interface() -> None:
    for entry in catalog.entries():
        assert isinstance(entry.load(), catalog.Format), entry

    class Incomplete:
        TASKS = None

        @staticmethod
        def write_subset(reader: object, meta: object) -> None: ...

    with pytest.raises(DatasetError, match=r"write_subset\(reader, meta\) is not .*lacks verify"):
        check_format_module("hdf5", Incomplete())


@pytest.mark.parametrize(
    ("fmt", "args", "flag"),
    [
        ("mcap", ["--hdf5-layout", "aloha"], "--hdf5-layout"),
        ("mcap", ["--hdf5-map", "action=action"], "--hdf5-map"),
        ("hdf5", ["--mcap-compression", "zstd"], "--mcap-compression"),
        ("v3", ["--valid-fraction", "0.2"], "--valid-fraction"),
        ("v21", ["--verify-decode"], "--verify-decode"),
    ],
)
def test_an_option_of_another_format_is_a_usage_error(
    tmp_path: Path, fmt: str, args: list[str], flag: str
) -> None:
    # refused on the command line, before the source is read (an empty directory, no dataset)
    result = CliRunner().invoke(main, ["export", str(tmp_path), "--format", fmt, *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "an option of --format" in lines[0]


def test_a_mapping_option_takes_pairs_each_key_once(tmp_path: Path) -> None:
    spec = next(f for f in Hdf5Options.option_fields() if f.name == "hdf5_map")
    assert spec.type == "mapping" and spec.as_dict()["default"] == ""
    for given in ("a=qpos, b=action", {"a": "qpos", "b": "action"}, ["a=qpos", ["b", "action"]]):
        options = Hdf5Options.from_values({"hdf5_layout": "aloha", "hdf5_map": given})
        assert options.feature_map == (("a", "qpos"), ("b", "action"))
    for bad, reason in [
        ("a=qpos, a=qvel", "a: given twice"),
        ("a", "is not KEY=VALUE"),
        ({"a": 1}, "is not KEY=VALUE"),
        ("a=qpos, b=qpos", "b: 'qpos' is already the name of a"),
        ("a=../x", "is not a name"),
    ]:
        with pytest.raises(OptionError, match=reason):
            Hdf5Options.from_values({"hdf5_layout": "aloha", "hdf5_map": bad})
    with pytest.raises(OptionError, match="^options.hdf5_layout: eva keeps every key"):
        Hdf5Options(feature_map=(("a", "qpos"),))
    result = CliRunner().invoke(
        main,
        ["export", str(tmp_path), "--format", "hdf5", "--hdf5-layout", "aloha"]
        + ["--hdf5-map", "a=qpos", "--hdf5-map", "b=qpos"],
    )
    assert result.exit_code == 2
    assert result.output.strip() == "eva: error: --hdf5-map: b: 'qpos' is already the name of a"
