"""Hostile names and path templates: nothing a dataset or a user supplies may leave its directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from eva.dataset import layout
from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader

FIELDS = ("episode_chunk", "episode_index", "video_key")


@pytest.mark.parametrize("template", [layout.DATA_PATH, layout.VIDEO_PATH, "d/{episode_index}.x"])
def test_lerobot_templates_are_accepted(template: str) -> None:
    assert layout.check_path_template(template, FIELDS) == template


@pytest.mark.parametrize(
    "template",
    [
        "{episode_index:999999999}",  # a gigabyte-wide field
        "{episode_index.__class__}",  # attribute access
        "{video_key[0]}",  # index access
        "{episode_index!r}",  # conversion
        "{task}",  # unknown field
        "data/{",  # malformed
    ],
)
def test_hostile_templates_are_refused(template: str) -> None:
    with pytest.raises(layout.UnsafeNameError, match="template"):
        layout.check_path_template(template, FIELDS)


@pytest.mark.parametrize("name", ["..", "a/../../b", "x\x00y", "...", ""])
def test_dataset_names_that_escape_are_refused(name: str) -> None:
    with pytest.raises(layout.UnsafeNameError):
        layout.sanitize_dataset_name(name)


def test_dataset_names_are_sanitised_into_one_component() -> None:
    assert layout.sanitize_dataset_name("/etc") == "etc"
    assert layout.sanitize_dataset_name("my set") == "my_set"


@pytest.mark.parametrize("key", ["..", "a/b", ".hidden", "cam\n", "cam\nx", "x" * 129])
def test_video_keys_must_be_one_plain_component(key: str) -> None:
    with pytest.raises(layout.UnsafeNameError, match="video key"):
        layout.check_video_key(key)


def _edit_info(root: Path, **fields: object) -> None:
    path = root / layout.INFO
    info = json.loads(path.read_text())
    info.update(fields)
    path.write_text(json.dumps(info))


def test_reader_refuses_a_hostile_data_path(synthetic_dataset: Callable[..., Path]) -> None:
    root = synthetic_dataset(episodes=1, frames=5, cameras=1)
    _edit_info(root, data_path="data/{episode_index:999999999}.parquet")
    with pytest.raises(DatasetError, match=r"info.json: field data_path .* unusable"):
        DatasetReader(root).data_path(0)


def test_reader_refuses_paths_through_symlinks_out_of_the_dataset(
    synthetic_dataset: Callable[..., Path], tmp_path: Path
) -> None:
    root = synthetic_dataset(episodes=1, frames=5, cameras=1)
    reader = DatasetReader(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    parquet = reader.data_path(0)
    (outside / parquet.name).write_bytes(parquet.read_bytes())
    parquet.unlink()
    parquet.parent.rmdir()
    parquet.parent.symlink_to(outside, target_is_directory=True)
    with pytest.raises(DatasetError, match="is a symlink; eva follows no links"):
        DatasetReader(root).read_table(0)
