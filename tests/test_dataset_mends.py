"""Small shared helpers of the dataset core: path templates the writer formats, the lock names
and helper shared with ``eva qc``, one ``utc_now``, encoder defaults stated once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from eva.capture import save_worker
from eva.config import EncoderConfig
from eva.dataset import layout, locks
from eva.dataset.errors import DatasetError
from eva.dataset.video import VideoOptions
from eva.dataset.writer import DatasetWriter, VectorSpec
from eva.quality import verdicts
from eva.timestamps import utc_now


def _open(root: Path) -> DatasetWriter:
    return DatasetWriter.create_or_open(
        root, fps=30, vectors=[VectorSpec("observation.state", 2)], durable=False
    )


@pytest.mark.parametrize(
    "template",
    [
        "data/{episode_index.__class__}.parquet",  # attribute access
        "data/{episode_index:99999999d}.parquet",  # huge width
        "data/{other}.parquet",  # unknown field
        "../{episode_index}.parquet",  # leads outside the dataset
    ],
)
def test_writer_checks_data_path_template_before_formatting(tmp_path: Path, template: str) -> None:
    root = tmp_path / "raw"
    _open(root).close()
    info = json.loads((root / layout.INFO).read_text())
    info["data_path"] = template
    (root / layout.INFO).write_text(json.dumps(info))
    with _open(root) as writer, writer.begin_episode("pick") as episode:
        episode.add_frames(vectors={"observation.state": np.zeros((3, 2), np.float32)})
        with pytest.raises(DatasetError, match="data_path|outside the dataset"):
            episode.commit()
    assert not list(tmp_path.glob("*.parquet"))
    assert (root / layout.EPISODES).read_text() == ""  # nothing committed


def test_lock_names_and_meta_lock_live_in_dataset() -> None:
    assert verdicts.meta_lock is locks.meta_lock
    assert verdicts.META_LOCK == layout.META_LOCK


def test_one_utc_now() -> None:
    assert save_worker.utc_now is utc_now
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", utc_now())


def test_encoder_config_defaults_are_the_writers() -> None:
    config, options = EncoderConfig(), VideoOptions()
    assert (config.codec, config.crf, config.preset, config.gop) == (
        options.codec,
        options.crf,
        options.preset,
        options.gop,
    )
